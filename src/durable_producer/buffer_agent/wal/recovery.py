"""Bring a WAL directory to a consistent state on open, whatever a crash or a bad disk left.

- a torn or zero-filled tail of the newest segment is truncated (those frames were never
  acknowledged under ``always``; under ``interval``/``never`` they were inside the promised
  loss window);
- a segment with corrupt bytes followed by valid frames, or any damage in an older segment, is
  quarantined: the original moves to ``quarantine/`` with a JSON reason file, and the valid
  frames are salvaged into a rebuilt segment (both described in ``format.py``);
- segments wholly below the checkpoint are deleted, leftover temp files removed.

It never raises on bad data: the agent must not crash-loop on a damaged volume.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .atomic_file import fsync_directory
from .checkpoint import read_checkpoint
from .format import (
    LEFTOVER_PATTERNS,
    QUARANTINE_DIR,
    QUARANTINE_REASON_SUFFIX,
    REBUILD_SUFFIX,
    SEGMENT_HEADER_SIZE,
    encode_segment_header,
)
from .scan import SegmentScan, scan_segment
from .segment import list_segments

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecoveredSegment:
    base_offset: int
    path: Path
    size: int
    record_counts: list[tuple[int, int]] = field(default_factory=list)
    """(offset, record count) of every frame, for backlog accounting."""


@dataclass(slots=True)
class RecoveryResult:
    segments: list[RecoveredSegment]
    next_offset: int
    truncated_bytes: int = 0
    quarantined: list[Path] = field(default_factory=list)
    """Segments quarantined by this recovery."""


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """The state a log opens with."""

    result: RecoveryResult
    checkpoint: int
    """The stored checkpoint, or the oldest segment's base when none is readable."""
    quarantined_segments: int
    """Quarantine records in the directory, from this recovery and earlier ones."""


def recover_log(directory: Path) -> RecoveredLog:
    """Read the checkpoint and recover ``directory``: everything a log needs to open."""
    checkpoint = read_checkpoint(directory)
    result = recover(directory, checkpoint)
    if checkpoint is None:
        checkpoint = result.segments[0].base_offset if result.segments else result.next_offset
        if result.segments:
            log.info(
                "no usable checkpoint in %s: replaying from offset %d (oldest segment)",
                directory,
                checkpoint,
            )
    return RecoveredLog(result, checkpoint, quarantine_count(directory))


def quarantine_count(directory: Path) -> int:
    quarantine = directory / QUARANTINE_DIR
    if not quarantine.is_dir():
        return 0
    return sum(1 for entry in quarantine.iterdir() if entry.suffix == QUARANTINE_REASON_SUFFIX)


def recover(directory: Path, checkpoint: int | None) -> RecoveryResult:
    for pattern in LEFTOVER_PATTERNS:
        for leftover in list(directory.glob(pattern)):
            leftover.unlink(missing_ok=True)
    segments = list_segments(directory)
    segments = _drop_checkpointed(segments, checkpoint)
    result = RecoveryResult(segments=[], next_offset=checkpoint or 0)
    highest_seen = -1
    for index, (base, path) in enumerate(segments):
        is_last = index == len(segments) - 1
        next_base = segments[index + 1][0] if not is_last else None
        scan = scan_segment(path, base)
        if scan.header_problem is not None:
            if is_last and scan.file_size <= SEGMENT_HEADER_SIZE:
                _rewrite_empty(path, base)
                log.warning(
                    "segment %s was created but never written (%s): reinitialised",
                    path.name,
                    scan.header_problem,
                )
                result.segments.append(RecoveredSegment(base, path, SEGMENT_HEADER_SIZE))
            else:
                result.quarantined.append(_quarantine(directory, scan, next_base, salvage=False))
                if is_last:
                    _rewrite_empty(path, base)
                    result.segments.append(RecoveredSegment(base, path, SEGMENT_HEADER_SIZE))
            highest_seen = max(highest_seen, base - 1)
            continue
        if scan.damaged_in_middle or (scan.damage and not is_last):
            result.quarantined.append(_quarantine(directory, scan, next_base, salvage=True))
            size = SEGMENT_HEADER_SIZE + sum(span.end - span.start for span in scan.spans)
        elif scan.damage:
            result.truncated_bytes += scan.file_size - scan.valid_end
            _truncate(path, scan.valid_end)
            log.warning(
                "segment %s: truncated a torn last frame (%d bytes at position %d: %s)",
                path.name,
                scan.file_size - scan.valid_end,
                scan.valid_end,
                scan.damage[0].problem,
            )
            size = scan.valid_end
        else:
            size = scan.file_size
        counts = [(span.offset, span.record_count) for span in scan.spans]
        result.segments.append(RecoveredSegment(base, path, size, counts))
        last_offset = scan.last_offset
        highest_seen = max(highest_seen, base - 1, -1 if last_offset is None else last_offset)
    result.next_offset = max(highest_seen + 1, checkpoint or 0)
    return result


def _drop_checkpointed(
    segments: list[tuple[int, Path]], checkpoint: int | None
) -> list[tuple[int, Path]]:
    """Delete segments whose every frame is below the checkpoint (a crash after checkpointing)."""
    if checkpoint is None:
        return segments
    kept = list(segments)
    while len(kept) > 1 and kept[1][0] <= checkpoint:
        kept.pop(0)[1].unlink()
    return kept


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


def _lost_ranges(scan: SegmentScan, next_base: int | None) -> list[str]:
    ranges = []
    for damage in scan.damage:
        before = [s.offset for s in scan.spans if s.end <= damage.start]
        after = [s.offset for s in scan.spans if s.start >= damage.end]
        first_lost = (before[-1] + 1) if before else scan.base_offset
        if after:
            last_lost = str(after[0] - 1)
        elif next_base is not None:
            last_lost = str(next_base - 1)
        else:
            last_lost = "end of log"
        ranges.append(f"{first_lost}..{last_lost} ({damage.problem} at byte {damage.start})")
    if scan.header_problem is not None:
        last = str(next_base - 1) if next_base is not None else "end of log"
        ranges.append(f"{scan.base_offset}..{last} ({scan.header_problem})")
    return ranges


def _quarantine(
    directory: Path, scan: SegmentScan, next_base: int | None, *, salvage: bool
) -> Path:
    """Move a damaged segment aside, keeping a copy of every valid frame in the log.

    Order matters for crash safety: the rebuilt file is durable before the original is replaced,
    and the original is hard-linked into quarantine before that, so no step loses a valid frame.
    """
    quarantine = directory / QUARANTINE_DIR
    quarantine.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{time.monotonic_ns() % 10**6:06d}"
    target = quarantine / f"{scan.path.name}.{stamp}"
    lost = _lost_ranges(scan, next_base)
    if salvage:
        rebuilt = scan.path.with_name(scan.path.name + REBUILD_SUFFIX)
        with open(scan.path, "rb") as source, open(rebuilt, "wb") as out:
            out.write(encode_segment_header(scan.base_offset))
            for span in scan.spans:
                source.seek(span.start)
                out.write(source.read(span.end - span.start))
            out.flush()
            os.fsync(out.fileno())
        os.link(scan.path, target)
        fsync_directory(quarantine)
        os.replace(rebuilt, scan.path)
    else:
        os.rename(scan.path, target)
        fsync_directory(quarantine)
    fsync_directory(directory)
    reason = {
        "segment": scan.path.name,
        "base_offset": scan.base_offset,
        "quarantined_file": target.name,
        "lost_offsets": lost,
        "salvaged_frames": len(scan.spans) if salvage else 0,
        "salvaged_offsets": (
            f"{scan.spans[0].offset}..{scan.spans[-1].offset}" if salvage and scan.spans else None
        ),
        "time": stamp,
    }
    Path(f"{target}{QUARANTINE_REASON_SUFFIX}").write_text(json.dumps(reason, indent=2) + "\n")
    log.error(
        "quarantined WAL segment %s -> %s: lost offsets %s; salvaged %d valid frames",
        scan.path.name,
        target,
        "; ".join(lost),
        reason["salvaged_frames"],
    )
    return target
