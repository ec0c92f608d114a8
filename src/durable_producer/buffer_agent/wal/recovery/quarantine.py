"""The quarantine area of a WAL directory: files moved aside with a record of why, and the
figures those records add up to. The record's fields are documented in ``volume/format.py``.

Every step keeps the bytes somewhere: a damaged segment's valid frames are durable in the
rebuilt file before the original is replaced, and the original is hard-linked into
``quarantine/`` before that.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.volume.atomic_file import fsync_directory, write_atomic
from durable_producer.buffer_agent.volume.format import (
    QUARANTINE_DIR,
    QUARANTINE_REASON_SUFFIX,
    REBUILD_SUFFIX,
    encode_segment_header,
)

from .damage import SegmentPlan, Stray

log = logging.getLogger(__name__)

DAMAGED = "damaged segment"
_RANGE = re.compile(r"^(\d+)\.\.(\d+)\b")


@dataclass(frozen=True, slots=True)
class QuarantineFigures:
    """What the records in ``quarantine/`` add up to (from this open and earlier ones)."""

    records: int
    lost_frames: int
    lost_ranges: list[tuple[int, int]]
    """Every ``first..last`` range the records name lost (never reused for a new frame)."""


def _area(directory: Path) -> Path:
    """``quarantine/``, created if needed (a file in its place is renamed out of the way)."""
    area = directory / QUARANTINE_DIR
    if area.exists() and not area.is_dir():
        aside = directory / f"{QUARANTINE_DIR}.not-a-directory.{_stamp()}"
        os.rename(area, aside)
        log.warning("%s was not a directory: renamed to %s", area, aside.name)
    area.mkdir(exist_ok=True)
    return area


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{time.monotonic_ns() % 10**6:06d}"


def _target(area: Path, name: str) -> tuple[Path, str]:
    while True:
        stamp = _stamp()
        target = area / f"{name}.{stamp}"
        if not target.exists() and not Path(f"{target}{QUARANTINE_REASON_SUFFIX}").exists():
            return target, stamp


def _write_record(target: Path, record: dict[str, Any]) -> None:
    data = (json.dumps(record, indent=2) + "\n").encode()
    write_atomic(Path(f"{target}{QUARANTINE_REASON_SUFFIX}"), data)


def move_aside(directory: Path, stray: Stray) -> Path:
    """Move an entry that is not part of the log into ``quarantine/``, with its record."""
    area = _area(directory)
    target, stamp = _target(area, stray.path.name)
    os.rename(stray.path, target)
    fsync_directory(area)
    fsync_directory(directory)
    _write_record(
        target,
        {
            "segment": stray.path.name,
            "base_offset": stray.base_offset,
            "quarantined_file": target.name,
            "reason": f"not part of the log: {stray.reason}",
            "damage": [],
            "lost_offsets": [],
            "lost_frames": 0,
            "salvaged_frames": 0,
            "salvaged_offsets": None,
            "time": stamp,
        },
    )
    return target


def quarantine_segment(directory: Path, plan: SegmentPlan) -> Path:
    """Keep a damaged segment's original in ``quarantine/`` and its valid frames in the log."""
    area = _area(directory)
    path = plan.path
    target, stamp = _target(area, path.name)
    spans = plan.scan.spans
    if plan.rebuilt:
        rebuilt = path.with_name(path.name + REBUILD_SUFFIX)
        with open(path, "rb") as source, open(rebuilt, "wb") as out:
            out.write(encode_segment_header(plan.base_offset))
            for span in spans:
                source.seek(span.start)
                out.write(source.read(span.end - span.start))
            out.flush()
            os.fsync(out.fileno())
        os.link(path, target)
        fsync_directory(area)
        os.replace(rebuilt, path)
    else:
        os.rename(path, target)
        fsync_directory(area)
    fsync_directory(directory)
    _write_record(
        target,
        {
            "segment": path.name,
            "base_offset": plan.base_offset,
            "quarantined_file": target.name,
            "reason": DAMAGED,
            "damage": plan.damage,
            "lost_offsets": [lost.describe() for lost in plan.lost],
            "lost_frames": plan.lost_frames,
            "salvaged_frames": len(spans),
            "salvaged_offsets": f"{spans[0].offset}..{spans[-1].offset}" if spans else None,
            "time": stamp,
        },
    )
    return target


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record in ``quarantine/``, oldest name first; an unreadable one says why."""
    area = directory / QUARANTINE_DIR
    if not area.is_dir():
        return []
    records: list[dict[str, Any]] = []
    for path in sorted(area.glob(f"*{QUARANTINE_REASON_SUFFIX}")):
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            records.append(record)
        except (OSError, ValueError, RecursionError) as error:  # RecursionError: deep JSON
            records.append({"quarantined_file": path.name, "error": str(error)})
    return records


def lost_ranges_of(record: dict[str, Any]) -> list[tuple[int, int]]:
    """The ``first..last`` ranges of a record's ``lost_offsets``."""
    ranges = []
    for entry in record.get("lost_offsets") or []:
        match = _RANGE.match(str(entry))
        if match:
            ranges.append((int(match[1]), int(match[2])))
    return ranges


def lost_frames_of(record: dict[str, Any]) -> int:
    """``lost_frames`` of a record; for records older than that field, from ``lost_offsets``."""
    lost = record.get("lost_frames")
    if isinstance(lost, int):
        return lost
    return sum(last - first + 1 for first, last in lost_ranges_of(record))


def quarantine_figures(directory: Path) -> QuarantineFigures:
    records = read_records(directory)
    ranges = [lost for record in records for lost in lost_ranges_of(record)]
    return QuarantineFigures(len(records), sum(lost_frames_of(r) for r in records), ranges)
