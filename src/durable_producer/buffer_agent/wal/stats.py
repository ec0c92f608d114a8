"""What the log reports about itself: the :class:`WalStats` snapshot and the record counts
behind its backlog figure."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .frame import PreparedFrame


@dataclass(frozen=True, slots=True)
class WalStats:
    """A snapshot for metrics and ``durable-agent wal inspect``."""

    size_bytes: int
    max_bytes: int
    segment_count: int
    checkpoint_offset: int
    next_offset: int
    durable_offset: int
    quarantined_segments: int
    truncated_bytes_on_open: int
    backlog_records: int
    """Records in frames at or above the checkpoint (from the frames' record counts)."""
    refusing: str | None = None
    """Why the latest append was refused (``buffer_limit``, ``disk_full``, ``wal_failed``);
    None once an append succeeded (``health.py``)."""

    @property
    def backlog_frames(self) -> int:
        """Frames appended but not yet checkpointed (an upper bound if quarantine left gaps)."""
        return self.next_offset - self.checkpoint_offset

    @property
    def free_bytes(self) -> int:
        return max(0, self.max_bytes - self.size_bytes)


class RecordBacklog:
    """Records in the frames not yet checkpointed. Not thread-safe (the log's lock guards it)."""

    def __init__(self, counts: Iterable[tuple[int, int]], checkpoint: int) -> None:
        """``counts``: (offset, record count) of every frame in the log, oldest first."""
        self._frames: deque[tuple[int, int]] = deque(counts)
        self.records = sum(count for _, count in self._frames)
        self.forget_below(checkpoint)

    def add(self, first_offset: int, frames: Sequence[PreparedFrame]) -> None:
        """Count a group just written, with consecutive offsets from ``first_offset``."""
        offset = first_offset
        for item, *_ in frames:
            self._frames.append((offset, item.record_count))
            self.records += item.record_count
            offset += 1

    def forget_below(self, offset: int) -> None:
        frames = self._frames
        while frames and frames[0][0] < offset:
            self.records -= frames.popleft()[1]
