"""Bring a WAL directory to a consistent state on open, whatever a crash or a bad disk left.

``damage.py`` decides (read-only) and this module carries the decisions out:

- leftover temp files are removed; entries that are not part of the log are moved to
  ``quarantine/`` or, for names that are not WAL names at all, left alone with one warning;
- segments wholly below the checkpoint are deleted;
- a torn tail of the newest segment is truncated (WARNING): under ``always`` never
  acknowledged, under ``interval``/``never`` inside the promised loss window;
- a segment with damage (corrupt bytes anywhere, a bad header, a corrupt complete last frame
  under ``always``) is quarantined (ERROR naming the lost offsets): the original moves to
  ``quarantine/`` with a JSON record and its valid frames are salvaged into a rebuilt segment
  with a header written from its name.

It never raises on bad data: the agent must not crash-loop on a damaged volume.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from durable_producer.buffer_agent.volume.format import QUARANTINE_DIR, encode_segment_header

from ..checkpoint import read_checkpoint
from ..config import FsyncPolicy
from ..stats import RecordRuns
from .damage import Action, Assessment, SegmentPlan, assess
from .quarantine import move_aside, quarantine_figures, quarantine_segment

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecoveredSegment:
    base_offset: int
    path: Path
    size: int
    record_runs: RecordRuns = field(default_factory=RecordRuns)
    """Its frames' record counts, for backlog accounting."""


@dataclass(slots=True)
class RecoveryResult:
    segments: list[RecoveredSegment]
    next_offset: int
    truncated_bytes: int = 0
    """Bytes of torn tails dropped (a crash mid-write)."""
    quarantined: list[Path] = field(default_factory=list)
    """Files moved to ``quarantine/`` by this recovery (damaged segments and strays)."""
    lost_frames: int = 0
    """Frames found lost to damage by this recovery (also in the quarantine records)."""
    ignored: list[str] = field(default_factory=list)
    """Names in the directory that are not WAL names, left alone."""


@dataclass(frozen=True, slots=True)
class RecoverySummary:
    """What opening the log found, for metrics (``AgentMetrics.record_wal_recovery``)."""

    quarantined_segments: int
    """Records in ``quarantine/``, from this open and earlier ones."""
    lost_frames: int
    """Frames lost to damage according to those records."""
    torn_tail_bytes: int
    """Bytes of torn tails truncated by this open."""
    ignored_files: int
    """Names in the directory that are not part of the log and were left alone."""


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """The state a log opens with."""

    result: RecoveryResult
    checkpoint: int
    """The stored checkpoint, or the oldest segment's base when none is readable."""
    quarantined_segments: int
    """Quarantine records in the directory, from this recovery and earlier ones."""
    summary: RecoverySummary


def recover_log(directory: Path, fsync: FsyncPolicy = FsyncPolicy.ALWAYS) -> RecoveredLog:
    """Read the checkpoint and recover ``directory``: everything a log needs to open.

    ``fsync`` is the policy the log was written with: under ``always`` a complete but corrupt
    last frame was acknowledged, so it is reported as corruption rather than truncated.
    """
    checkpoint = read_checkpoint(directory)
    earlier = quarantine_figures(directory)
    result = recover(directory, checkpoint, fsync, earlier.lost_ranges)
    figures = quarantine_figures(directory) if result.quarantined else earlier
    if checkpoint is None:
        checkpoint = result.segments[0].base_offset if result.segments else result.next_offset
        if result.segments:
            log.info(
                # never written (nothing delivered yet) or damaged (read_checkpoint warned)
                "no checkpoint to start from in %s: forwarding from offset %d (oldest segment)",
                directory,
                checkpoint,
            )
    summary = RecoverySummary(
        quarantined_segments=figures.records,
        lost_frames=figures.lost_frames,
        torn_tail_bytes=result.truncated_bytes,
        ignored_files=len(result.ignored),
    )
    return RecoveredLog(result, checkpoint, figures.records, summary)


def recover(
    directory: Path,
    checkpoint: int | None,
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    recorded_lost: Sequence[tuple[int, int]] = (),
) -> RecoveryResult:
    """Carry out what ``damage.assess`` decides (``recorded_lost``: see there)."""
    plan = assess(directory, checkpoint, fsync, recorded_lost)
    for leftover in plan.leftovers:
        _remove(leftover)
    for leftover in (directory / QUARANTINE_DIR).glob(".*.tmp"):
        leftover.unlink(missing_ok=True)
    result = RecoveryResult(segments=[], next_offset=plan.next_offset)
    _set_aside_strays(directory, plan, result)
    for segment in plan.segments:
        _apply(directory, segment, result)
    for first, last in plan.gaps:
        log.warning(
            "WAL offsets %d..%d are missing from %s and no damaged byte or quarantine record "
            "explains it (a segment file removed, an fsync=never crash, or a quarantine record "
            "deleted after an earlier loss); nothing to forward for them",
            first,
            last,
            directory,
        )
    return result


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        log.warning("%s is a directory with a temp-file name: left alone", path)
    else:
        path.unlink(missing_ok=True)


def _set_aside_strays(directory: Path, plan: Assessment, result: RecoveryResult) -> None:
    ignored = [stray for stray in plan.strays if not stray.move_aside]
    if ignored:
        result.ignored = [stray.path.name for stray in ignored]
        log.warning(
            "WAL directory %s holds entries that are not WAL files (left alone, not read): %s",
            directory,
            ", ".join(result.ignored),
        )
    for stray in plan.strays:
        if stray.move_aside:
            target = move_aside(directory, stray)
            result.quarantined.append(target)
            log.warning(
                "%s in %s is not part of the log (%s): moved to %s; no frame lost",
                stray.path.name,
                directory,
                stray.reason,
                target,
            )


def _apply(directory: Path, plan: SegmentPlan, result: RecoveryResult) -> None:
    path, base = plan.path, plan.base_offset
    if plan.action is Action.DELETE:
        path.unlink(missing_ok=True)
        return
    result.truncated_bytes += plan.torn_bytes
    if plan.action is Action.TRUNCATE:
        _truncate(path, plan.size_after)
        log.warning(
            "segment %s: truncated a torn last frame (%d bytes at position %d: %s)",
            path.name,
            plan.torn_bytes,
            plan.scan.valid_end,
            plan.scan.damage[-1].problem,
        )
    elif plan.action is Action.REINITIALISE:
        _rewrite_empty(path, base)
        log.warning(
            "segment %s was created but never written (%s): reinitialised",
            path.name,
            plan.scan.header_problem,
        )
    elif plan.action is Action.QUARANTINE:
        target = quarantine_segment(directory, plan)
        result.quarantined.append(target)
        result.lost_frames += plan.lost_frames
        lost = "; ".join(lost.describe() for lost in plan.lost) or "none"
        log.error(
            "quarantined WAL segment %s -> %s: %s; lost offsets %s (%d frames); salvaged %d "
            "valid frames",
            path.name,
            target,
            "; ".join(plan.damage),
            lost,
            plan.lost_frames,
            plan.scan.frames,
        )
        if not plan.rebuilt:
            return
    result.segments.append(RecoveredSegment(base, path, plan.size_after, plan.scan.runs))


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _rewrite_empty(path: Path, base: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, encode_segment_header(base))
        os.fsync(fd)
    finally:
        os.close(fd)
