"""A read-only report of a WAL directory, for ``durable-agent wal inspect``.

It takes no lock and changes nothing, so it is safe on a volume an agent is using (the newest
segment may then show a frame being written as an incomplete tail). The damage, the offsets it
lost and what opening the log will do come from ``damage.assess``, the same decisions recovery
carries out, for the fsync policy the agent runs with.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.volume.format import CHECKPOINT_FILE
from durable_producer.contract import DEFAULT_FSYNC_POLICY

from ..checkpoint import checkpoint_damaged, read_checkpoint
from ..config import FsyncPolicy
from ..log_id import read_log_id
from .damage import Action, SegmentPlan, assess
from .lock import current_holder
from .quarantine import lost_ranges_of, read_records


@dataclass(slots=True)
class SegmentReport:
    name: str
    base_offset: int
    size_bytes: int
    frames: int
    first_offset: int | None
    last_offset: int | None
    below_checkpoint: bool
    problems: list[str] = field(default_factory=list)
    lost_offsets: list[str] = field(default_factory=list)
    """Offsets the damage lost (what recovery will record in quarantine/)."""
    on_open: str = Action.KEEP.value
    """What opening the log will do with this segment."""


@dataclass(slots=True)
class StrayReport:
    name: str
    reason: str
    on_open: str


@dataclass(slots=True)
class WalReport:
    directory: str
    fsync_policy: str
    """The policy the tail of the newest segment was judged under."""
    checkpoint_offset: int | None
    checkpoint_present: bool
    checkpoint_damaged: bool
    """There and unreadable (a checkpoint never written, zeros, is no damage)."""
    lock_holder: str | None
    total_bytes: int
    segments: list[SegmentReport]
    quarantined: list[dict[str, Any]]
    strays: list[StrayReport] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    """Offsets missing with no damaged byte to explain them."""
    next_offset: int = 0
    """The offset the next appended frame will get once the log is opened."""
    log_id: str | None = None
    """``wal/id`` (None: none yet, or unreadable: a new one on the next open)."""
    log_id_adopted: bool = False
    """The log was written by an agent before ids (``wal/log_id.py``)."""

    @property
    def problems_found(self) -> bool:
        """Damage (a damaged checkpoint too), or entries that are not part of the log (gaps
        are only informational)."""
        return bool(any(s.problems for s in self.segments) or self.strays) or (
            self.checkpoint_damaged
        )

    @property
    def backlog_frames(self) -> int:
        checkpoint = self.checkpoint_offset or 0
        total = sum(s.frames for s in self.segments)
        return total - sum(self._frames_below(s, checkpoint) for s in self.segments)

    @staticmethod
    def _frames_below(segment: SegmentReport, checkpoint: int) -> int:
        if segment.first_offset is None or segment.last_offset is None:
            return 0
        if segment.last_offset < checkpoint:
            return segment.frames
        if segment.first_offset >= checkpoint:
            return 0
        return checkpoint - segment.first_offset


def _segment_report(plan: SegmentPlan) -> SegmentReport:
    scan = plan.scan
    return SegmentReport(
        name=scan.path.name,
        base_offset=scan.base_offset,
        size_bytes=scan.file_size,
        frames=scan.frames,
        first_offset=scan.first_offset,
        last_offset=scan.last_offset,
        below_checkpoint=plan.action is Action.DELETE,
        problems=list(plan.damage),
        lost_offsets=[lost.describe() for lost in plan.lost],
        on_open=plan.action.value,
    )


DEFAULT_POLICY = FsyncPolicy(DEFAULT_FSYNC_POLICY)


def inspect_wal(directory: Path, fsync: FsyncPolicy = DEFAULT_POLICY) -> WalReport:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    checkpoint = read_checkpoint(directory)
    records = read_records(directory)
    recorded = [lost for record in records for lost in lost_ranges_of(record)]
    found = assess(directory, checkpoint, fsync, recorded, locked=False)
    segments = [_segment_report(plan) for plan in found.segments]
    strays = [
        StrayReport(
            stray.path.name,
            stray.reason,
            "moved to quarantine/" if stray.move_aside else "left alone (not a WAL file)",
        )
        for stray in found.strays
    ]
    log_id = read_log_id(directory)
    return WalReport(
        directory=str(directory),
        fsync_policy=str(fsync),
        checkpoint_offset=checkpoint,
        checkpoint_present=(directory / CHECKPOINT_FILE).exists(),
        checkpoint_damaged=checkpoint_damaged(directory),
        lock_holder=current_holder(directory),
        total_bytes=sum(s.size_bytes for s in segments),
        segments=segments,
        quarantined=records,
        strays=strays,
        gaps=[f"{first}..{last}" for first, last in found.gaps],
        next_offset=found.next_offset,
        log_id=None if log_id is None else log_id.value,
        log_id_adopted=log_id is not None and log_id.adopted,
    )


def format_report(report: WalReport) -> str:
    lines = [f"WAL directory: {report.directory}"]
    adopted = " (adopted: the log was begun by an agent before ids)" * report.log_id_adopted
    lines.append(f"log id:        {report.log_id or 'none (a new one on the next open)'}{adopted}")
    if report.checkpoint_offset is not None:
        lines.append(f"checkpoint:    offset {report.checkpoint_offset} (all below it delivered)")
    elif report.checkpoint_damaged:
        lines.append("checkpoint:    CORRUPT (the agent will replay from the oldest segment)")
    else:
        lines.append("checkpoint:    none yet (the agent replays from the oldest segment)")
    lines.append(f"lock:          {report.lock_holder or 'not held'}")
    lines.append(f"size:          {report.total_bytes} bytes in {len(report.segments)} segments")
    lines.append(f"backlog:       {report.backlog_frames} frames not yet delivered")
    lines.append(f"fsync policy:  {report.fsync_policy} (how a damaged last frame is judged)")
    lines.append("")
    lines.append(f"{'segment':<26} {'bytes':>12} {'frames':>8} {'offsets':>25}  notes")
    for s in report.segments:
        offsets = f"{s.first_offset}..{s.last_offset}" if s.frames else "-"
        notes = []
        if s.below_checkpoint:
            notes.append("below checkpoint (deleted on next open)")
        notes.extend(s.problems)
        if s.lost_offsets:
            notes.append("LOST offsets " + ", ".join(s.lost_offsets))
        if s.on_open not in (Action.KEEP.value, Action.DELETE.value):
            notes.append(f"on open: {s.on_open}")
        lines.append(
            f"{s.name:<26} {s.size_bytes:>12} {s.frames:>8} {offsets:>25}  {'; '.join(notes)}"
        )
    for gap in report.gaps:
        lines.append(
            f"offsets {gap} are missing: no segment holds them, no damaged byte explains it"
        )
    for stray in report.strays:
        lines.append(f"not part of the log: {stray.name}: {stray.reason}; on open: {stray.on_open}")
    lines.append("")
    if report.quarantined:
        lines.append(f"quarantined segments: {len(report.quarantined)}")
        for q in report.quarantined:
            lost = ", ".join(q.get("lost_offsets", [])) or "nothing"
            lines.append(
                f"  {q.get('quarantined_file')}: {q.get('reason', 'damaged segment')}; lost "
                f"{lost}; salvaged {q.get('salvaged_frames', 0)} frames"
            )
    else:
        lines.append("quarantined segments: none")
    return "\n".join(lines)


def report_as_json(report: WalReport) -> str:
    data = asdict(report)
    data["backlog_frames"] = report.backlog_frames
    return json.dumps(data, indent=2)
