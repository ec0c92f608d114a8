"""A read-only report of a WAL directory, for ``durable-agent wal inspect``.

It takes no lock and changes nothing, so it is safe on a volume an agent is using (the newest
segment may then show a frame being written as an incomplete tail).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import read_checkpoint
from .format import CHECKPOINT_FILE, QUARANTINE_DIR, QUARANTINE_REASON_SUFFIX
from .lock import current_holder
from .scan import scan_segment
from .segment import list_segments


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


@dataclass(slots=True)
class WalReport:
    directory: str
    checkpoint_offset: int | None
    checkpoint_present: bool
    lock_holder: str | None
    total_bytes: int
    segments: list[SegmentReport]
    quarantined: list[dict[str, Any]]

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


def inspect_wal(directory: Path) -> WalReport:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    checkpoint = read_checkpoint(directory)
    lock_holder = current_holder(directory)
    segments = []
    listed = list_segments(directory)
    for index, (base, path) in enumerate(listed):
        scan = scan_segment(path, base)
        problems = []
        if scan.header_problem:
            problems.append(scan.header_problem)
        for damage in scan.damage:
            kind = "corrupt bytes" if damage.resynced else "incomplete tail"
            problems.append(f"{kind} at byte {damage.start}..{damage.end}: {damage.problem}")
        next_base = listed[index + 1][0] if index + 1 < len(listed) else None
        segments.append(
            SegmentReport(
                name=path.name,
                base_offset=base,
                size_bytes=scan.file_size,
                frames=len(scan.spans),
                first_offset=scan.spans[0].offset if scan.spans else None,
                last_offset=scan.last_offset,
                below_checkpoint=(
                    checkpoint is not None and next_base is not None and next_base <= checkpoint
                ),
                problems=problems,
            )
        )
    quarantined = []
    quarantine = directory / QUARANTINE_DIR
    if quarantine.is_dir():
        for reason in sorted(quarantine.glob(f"*{QUARANTINE_REASON_SUFFIX}")):
            try:
                quarantined.append(json.loads(reason.read_text()))
            except (OSError, ValueError) as error:
                quarantined.append({"quarantined_file": reason.name, "error": str(error)})
    return WalReport(
        directory=str(directory),
        checkpoint_offset=checkpoint,
        checkpoint_present=(directory / CHECKPOINT_FILE).exists(),
        lock_holder=lock_holder,
        total_bytes=sum(s.size_bytes for s in segments),
        segments=segments,
        quarantined=quarantined,
    )


def format_report(report: WalReport) -> str:
    lines = [f"WAL directory: {report.directory}"]
    if report.checkpoint_offset is not None:
        lines.append(f"checkpoint:    offset {report.checkpoint_offset} (all below it delivered)")
    elif report.checkpoint_present:
        lines.append("checkpoint:    CORRUPT (the agent will replay from the oldest segment)")
    else:
        lines.append("checkpoint:    none yet (the agent replays from the oldest segment)")
    lines.append(f"lock:          {report.lock_holder or 'not held'}")
    lines.append(f"size:          {report.total_bytes} bytes in {len(report.segments)} segments")
    lines.append(f"backlog:       {report.backlog_frames} frames not yet delivered")
    lines.append("")
    lines.append(f"{'segment':<26} {'bytes':>12} {'frames':>8} {'offsets':>25}  notes")
    for s in report.segments:
        offsets = f"{s.first_offset}..{s.last_offset}" if s.frames else "-"
        notes = []
        if s.below_checkpoint:
            notes.append("below checkpoint (deleted on next open)")
        notes.extend(s.problems)
        lines.append(
            f"{s.name:<26} {s.size_bytes:>12} {s.frames:>8} {offsets:>25}  {'; '.join(notes)}"
        )
    lines.append("")
    if report.quarantined:
        lines.append(f"quarantined segments: {len(report.quarantined)}")
        for q in report.quarantined:
            lines.append(
                f"  {q.get('quarantined_file')}: lost {', '.join(q.get('lost_offsets', []))}; "
                f"salvaged {q.get('salvaged_frames', 0)} frames"
            )
    else:
        lines.append("quarantined segments: none")
    return "\n".join(lines)


def report_as_json(report: WalReport) -> str:
    data = asdict(report)
    data["backlog_frames"] = report.backlog_frames
    return json.dumps(data, indent=2)
