"""What is wrong in a WAL directory and what recovery will do about it, decided read-only.

``assess`` lists the directory, scans every segment (``scan.py``) and decides, for each entry,
whether it is part of the log, what damage it holds, which offsets that damage lost and what
opening the log does with it. ``repair.py`` carries the decisions out; ``inspect.py`` reports
them, so ``durable-agent wal inspect`` and recovery always agree. The rules are in
``volume/format.py``.

Lost offsets come from evidence only: the valid frames on either side of the damage, the name of
the next segment, the checkpoint (nothing below it is lost: it was delivered), and under
``fsync=always`` the complete frames of a damaged tail. A file with neither a valid header nor a
valid frame whose name does not continue the log is not evidence of anything: it is set aside,
and nothing is reported lost because of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatch
from pathlib import Path

from durable_producer.buffer_agent.volume.format import (
    CHECKPOINT_FILE,
    LEFTOVER_PATTERNS,
    LOCK_FILE,
    LOG_ID_FILE,
    MAX_OFFSET,
    QUARANTINE_DIR,
    SEGMENT_HEADER_SIZE,
    parse_segment_name,
)

from ..config import FsyncPolicy
from .scan import Damage, SegmentScan, scan_segment

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 5.0
"""How often a long scan of the segments says how far it got."""


class Action(StrEnum):
    """What opening the log does with a segment."""

    KEEP = "keep"
    DELETE = "delete (every frame is below the checkpoint)"
    TRUNCATE = "truncate the torn tail"
    REINITIALISE = "rewrite the header (created but never written)"
    QUARANTINE = "quarantine, salvage the valid frames"


@dataclass(frozen=True, slots=True)
class LostRange:
    """Consecutive offsets lost to one damaged run of bytes."""

    first: int
    last: int
    problem: str
    position: int | None
    """Byte position of the damage in the segment; None for a header over no frame."""

    @property
    def frames(self) -> int:
        return self.last - self.first + 1

    def describe(self) -> str:
        where = "" if self.position is None else f" at byte {self.position}"
        return f"{self.first}..{self.last} ({self.problem}{where})"


@dataclass(slots=True)
class SegmentPlan:
    """One segment of the log: what was found in it and what recovery does."""

    scan: SegmentScan
    action: Action = Action.KEEP
    damage: list[str] = field(default_factory=list)
    """Every damaged run, the header included, in words."""
    lost: list[LostRange] = field(default_factory=list)
    torn_bytes: int = 0
    """Bytes of a torn tail dropped (a crash mid-write, not corruption)."""
    newest: bool = False

    @property
    def path(self) -> Path:
        return self.scan.path

    @property
    def base_offset(self) -> int:
        return self.scan.base_offset

    @property
    def lost_frames(self) -> int:
        return sum(lost.frames for lost in self.lost)

    @property
    def size_after(self) -> int:
        """The segment's size once recovery has dealt with it."""
        if self.action is Action.KEEP:
            return self.scan.file_size
        if self.action is Action.TRUNCATE:
            return self.scan.valid_end
        if self.action is Action.QUARANTINE and not self.rebuilt:
            return 0
        return SEGMENT_HEADER_SIZE + self.scan.frame_bytes

    @property
    def rebuilt(self) -> bool:
        """A quarantined segment is rebuilt in ``wal/`` unless it is an older one with no frame
        left to keep (the newest always is: appends continue in it)."""
        return self.action is Action.QUARANTINE and (self.newest or self.scan.frames > 0)


@dataclass(frozen=True, slots=True)
class Stray:
    """An entry of the WAL directory that is not part of the log."""

    path: Path
    reason: str
    base_offset: int | None = None
    move_aside: bool = True
    """True: moved to ``quarantine/`` with a record; False: left alone with a warning."""


@dataclass(slots=True)
class Assessment:
    """Everything recovery will do to a directory, decided before anything is changed."""

    segments: list[SegmentPlan]
    """The log's segments, oldest first (the last one is the newest)."""
    strays: list[Stray]
    leftovers: list[Path]
    """Temp files of interrupted writes, removed on open."""
    gaps: list[tuple[int, int]]
    """Offsets missing between frames where no byte is damaged (a removed file)."""
    next_offset: int

    @property
    def live_segments(self) -> list[SegmentPlan]:
        return [plan for plan in self.segments if plan.action is not Action.DELETE]

    @property
    def lost_frames(self) -> int:
        return sum(plan.lost_frames for plan in self.segments)


@dataclass(slots=True)
class _Listing:
    candidates: list[tuple[int, Path]] = field(default_factory=list)
    strays: list[Stray] = field(default_factory=list)
    leftovers: list[Path] = field(default_factory=list)


_KNOWN = {LOCK_FILE, CHECKPOINT_FILE, LOG_ID_FILE}
_NAMED = {CHECKPOINT_FILE: "checkpoint", LOG_ID_FILE: "log's id"}
"""Files the log reads, moved aside when something else has their name."""


def _list_directory(directory: Path) -> _Listing:
    listing = _Listing()
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        name, path = entry.name, Path(entry.path)
        if name in _NAMED and not entry.is_file():
            listing.strays.append(Stray(path, f"not a file, so not the {_NAMED[name]}"))
            continue
        if name in _KNOWN or (name == QUARANTINE_DIR and entry.is_dir()):
            continue
        if any(fnmatch(name, pattern) for pattern in LEFTOVER_PATTERNS):
            listing.leftovers.append(path)
            continue
        base = parse_segment_name(name)
        if base is None:
            listing.strays.append(Stray(path, "not a WAL file name", move_aside=False))
        elif base > MAX_OFFSET:
            reason = f"the offset in its name does not fit the format (at most {MAX_OFFSET})"
            listing.strays.append(Stray(path, reason, base))
        elif not entry.is_file():
            listing.strays.append(Stray(path, "named like a segment but not a file", base))
        else:
            listing.candidates.append((base, path))
    listing.candidates.sort()
    return listing


def _scan_all(
    directory: Path, candidates: list[tuple[int, Path]], *, copy_newest: bool
) -> list[SegmentScan]:
    """Scan every segment, saying how far it got every PROGRESS_INTERVAL_S (a large backlog
    on a slow disk takes minutes)."""
    scans: list[SegmentScan] = []
    total = read = 0
    for _, path in candidates:
        with contextlib.suppress(OSError):  # (the scan says what is wrong with it)
            total += path.stat().st_size
    next_report = time.monotonic() + PROGRESS_INTERVAL_S
    newest = candidates[-1][1] if copy_newest and candidates else None
    for base, path in candidates:
        scan = scan_segment(path, base, summary_of_whole=True, copy=path == newest)
        scans.append(scan)
        read += scan.file_size
        if time.monotonic() >= next_report:
            next_report = time.monotonic() + PROGRESS_INTERVAL_S
            log.info(
                "reading WAL %s: %d of %d segments, %.1f of %.1f GiB",
                directory,
                len(scans),
                len(candidates),
                read / 2**30,
                total / 2**30,
            )
    return scans


def assess(
    directory: Path,
    checkpoint: int | None,
    fsync: FsyncPolicy,
    recorded_lost: Sequence[tuple[int, int]] = (),
    *,
    locked: bool = True,
) -> Assessment:
    """Decide, without changing anything, what opening the log in ``directory`` does.

    ``recorded_lost``: offset ranges the quarantine records already name lost (an earlier
    recovery's): missing from the log, but not a gap to report again, and never reused.
    ``locked``: the caller holds the directory's lock (recovery); else (``wal inspect``) an
    agent may be writing meanwhile, and the newest segment is read as a copy (``scan_segment``).
    """
    listing = _list_directory(directory)
    scans = _scan_all(directory, listing.candidates, copy_newest=not locked)
    members, junk = _members(scans, checkpoint)
    strays = listing.strays + junk
    plans = [SegmentPlan(scan) for scan in members]
    _mark_delivered(plans, checkpoint, strays)
    live = [plan for plan in plans if plan.action is not Action.DELETE]
    floor = checkpoint or 0
    gaps: list[tuple[int, int]] = []
    for index, plan in enumerate(live):
        next_base = live[index + 1].base_offset if index + 1 < len(live) else None
        _assess_segment(plan, next_base, floor, fsync, gaps)
    return Assessment(
        segments=plans,
        strays=strays,
        leftovers=listing.leftovers,
        gaps=_without(gaps, recorded_lost),
        next_offset=_next_offset(plans, checkpoint, recorded_lost),
    )


def _members(
    scans: list[SegmentScan], checkpoint: int | None
) -> tuple[list[SegmentScan], list[Stray]]:
    """Split the segment-named files into the log's segments and files that are not part of it."""
    members: list[SegmentScan] = []
    junk: list[Stray] = []
    for scan in scans:
        base = scan.base_offset
        evidence = scan.header_problem is None or scan.frames > 0
        if members:
            previous = members[-1]
            last = previous.last_offset
            expected = previous.base_offset + 1 if last is None else last + 1
            if base < expected:
                junk.append(Stray(scan.path, f"overlaps offsets of {previous.path.name}", base))
                continue
            plausible = base == expected
        else:
            plausible = base <= checkpoint if checkpoint is not None else base == 0
        if not evidence and not plausible:
            reason = (
                f"neither a valid segment header nor a valid frame ({scan.header_problem}), "
                "and its name does not continue the log"
            )
            junk.append(Stray(scan.path, reason, base))
            continue
        members.append(scan)
    return members, junk


def _mark_delivered(plans: list[SegmentPlan], checkpoint: int | None, strays: list[Stray]) -> None:
    """Segments whose every frame is below the checkpoint are deleted (a crash after the
    checkpoint, before the deletion); one without a single valid byte is set aside instead."""
    if checkpoint is None:
        return
    index = 0
    while index + 1 < len(plans) and plans[index + 1].base_offset <= checkpoint:
        scan = plans[index].scan
        if scan.header_problem is not None and not scan.frames:
            reason = f"no valid header or frame ({scan.header_problem}), below the checkpoint"
            strays.append(Stray(scan.path, reason, scan.base_offset))
            del plans[index]
        else:
            plans[index].action = Action.DELETE
            index += 1


def _assess_segment(
    plan: SegmentPlan,
    next_base: int | None,
    floor: int,
    fsync: FsyncPolicy,
    gaps: list[tuple[int, int]],
) -> None:
    """Damage, lost offsets and the action for one live segment (``next_base`` None: newest)."""
    scan = plan.scan
    plan.newest = next_base is None
    if scan.header_problem is not None:
        plan.damage.append(scan.header_problem)
    corrupt_tail = (
        plan.newest
        and scan.tail is not None
        and fsync is FsyncPolicy.ALWAYS
        and scan.tail_frames > 0
    )
    starts = scan.spans.starts()  # (a damaged segment's spans are kept: _scan_all)
    for damage in scan.damage:
        after = bisect_left(starts, damage.end)  # spans are in file order, around the damage
        previous = scan.spans[after - 1].offset if after > 0 else scan.base_offset - 1
        next_valid: int | None
        if after < len(scan.spans):
            next_valid = scan.spans[after].offset
        elif next_base is not None:
            next_valid = next_base
        elif corrupt_tail:
            next_valid = previous + 1 + scan.tail_frames
        else:
            next_valid = None
        plan.damage.append(_describe(damage, plan.newest, corrupt_tail, scan.tail_frames))
        if next_valid is None:
            plan.torn_bytes = scan.file_size - damage.start
            continue
        first = max(previous + 1, floor)
        if first < next_valid:
            plan.lost.append(LostRange(first, next_valid - 1, damage.problem, damage.start))
    if not scan.frames and not scan.damage and scan.header_problem and next_base is not None:
        first = max(scan.base_offset, floor)
        if first < next_base:  # a bad header over no frame: it held the offsets up to the next
            plan.lost.append(LostRange(first, next_base - 1, scan.header_problem, None))
    gaps.extend(_gaps(plan, next_base, floor))
    plan.action = _action(plan, corrupt_tail)


def _describe(damage: Damage, newest: bool, corrupt_tail: bool, tail_frames: int) -> str:
    text = f"bytes {damage.start}..{damage.end}: {damage.problem}"
    if damage.resynced or not newest:
        return text
    if corrupt_tail:
        return (
            f"{text} ({tail_frames} complete frame(s) at the end of the newest segment: "
            "acknowledged under fsync=always, so corruption, not a torn write)"
        )
    return f"{text} (torn write at the end of the newest segment)"


def _gaps(plan: SegmentPlan, next_base: int | None, floor: int) -> list[tuple[int, int]]:
    """Offsets of this segment's range that neither a valid frame nor damage accounts for."""
    covered = sorted(
        plan.scan.runs.ranges() + [(lost.first, lost.last) for lost in plan.lost]
    )
    if next_base is not None:
        covered.append((next_base, next_base))
    gaps = []
    cursor = max(plan.base_offset, floor)
    for first, last in covered:
        if first > cursor:
            gaps.append((cursor, first - 1))
        cursor = max(cursor, last + 1)
    return gaps


def _without(
    gaps: list[tuple[int, int]], known: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``gaps`` less the offsets of ``known`` ranges."""
    for known_first, known_last in known:
        remaining = []
        for first, last in gaps:
            if known_last < first or known_first > last:
                remaining.append((first, last))
                continue
            if first < known_first:
                remaining.append((first, known_first - 1))
            if known_last < last:
                remaining.append((known_last + 1, last))
        gaps = remaining
    return gaps


def _action(plan: SegmentPlan, corrupt_tail: bool) -> Action:
    scan = plan.scan
    if scan.whole:
        return Action.KEEP
    if plan.newest and scan.header_problem is not None and scan.file_size <= SEGMENT_HEADER_SIZE:
        return Action.REINITIALISE
    only_torn_tail = scan.header_problem is None and not scan.damaged_in_middle
    if plan.newest and only_torn_tail and not corrupt_tail:
        return Action.TRUNCATE
    return Action.QUARANTINE


def _next_offset(
    plans: list[SegmentPlan], checkpoint: int | None, recorded_lost: Sequence[tuple[int, int]]
) -> int:
    """One past the highest offset the log has evidence of; offsets of lost frames (this
    recovery's or recorded earlier) are never reused (they were acknowledged, and may have
    reached Kafka), those of a torn tail are."""
    highest = max((last for _, last in recorded_lost), default=-1)
    for plan in plans:
        highest = max(highest, plan.base_offset - 1)
        if plan.scan.last_offset is not None:
            highest = max(highest, plan.scan.last_offset)
        for lost in plan.lost:
            highest = max(highest, lost.last)
    return max(highest + 1, checkpoint or 0)
