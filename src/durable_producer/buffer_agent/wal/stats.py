"""What the log reports about itself: the :class:`WalStats` snapshot and the record counts
behind its backlog figure."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .frame import PreparedFrame

_COMPACT_AFTER_RUNS = 4096
"""Forgotten runs are cut off the arrays once there are this many and half of them are."""


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


RecordRun = tuple[int, int, int]
"""Consecutive frames with the same record count: (first offset, frames, records a frame)."""


class RecordRuns:
    """Frames as runs (``RecordRun``), oldest first, three numbers a run in one array (24
    bytes a run): what recovery keeps of a segment's frames for the backlog, not an entry a
    frame (a ``linger.ms=0`` client's segment is one run)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values = array("q")

    def add(self, offset: int, records: int) -> None:
        """The next frame: ``offset`` above every frame's so far, holding ``records``."""
        values = self._values
        if values and offset == values[-3] + values[-2] and records == values[-1]:
            values[-2] += 1
        else:
            values.extend((offset, 1, records))

    def add_packed(self, packed: bytes) -> None:
        """Runs of the next frames as ``frame.scan_spans`` gives them (three native int64s a
        run); the first one continues the last run where it can."""
        incoming = array("q")
        incoming.frombytes(packed)
        values = self._values
        if (
            values
            and incoming
            and incoming[0] == values[-3] + values[-2]
            and incoming[2] == values[-1]
        ):
            values[-2] += incoming[1]
            del incoming[:3]
        values.extend(incoming)

    def __len__(self) -> int:
        return len(self._values) // 3

    def frames(self) -> int:
        return sum(self._values[1::3])

    def offsets(self) -> tuple[int, int] | None:
        """The first frame's offset and the last one's (None: no frame)."""
        values = self._values
        if not values:
            return None
        return values[0], values[-3] + values[-2] - 1

    def __iter__(self) -> Iterator[RecordRun]:
        values = self._values
        for index in range(0, len(values), 3):
            yield values[index], values[index + 1], values[index + 2]

    def ranges(self) -> list[tuple[int, int]]:
        """The frames' offsets as ranges of consecutive ones: (first, last) each."""
        ranges: list[tuple[int, int]] = []
        for first, frames, _ in self:
            if ranges and ranges[-1][1] + 1 == first:
                ranges[-1] = (ranges[-1][0], first + frames - 1)
            else:
                ranges.append((first, first + frames - 1))
        return ranges


class RecordBacklog:
    """Records in the frames not yet checkpointed. Not thread-safe (the log's lock guards it).

    Held as *runs*: consecutive frames with the same record count, each a first offset and
    that count in two arrays (16 bytes); a run ends where the next begins, the last one at
    ``_end``, and offsets no frame holds (a gap recovery found) are a run of count 0. Not an
    entry a frame: a ``linger.ms=0`` client stores one record a frame, and a tuple a frame in
    a deque (about 105 bytes) grew the agent's memory by a third of the WAL's size for as long
    as Kafka was away (2 million frames: 200 MiB, docs/benchmarks.md). Frames of one record,
    or of any one count, are one run; a run a frame costs 16 bytes, for frames of at least
    about 110 bytes on the volume.
    """

    def __init__(self, runs: Iterable[RecordRun], checkpoint: int) -> None:
        """``runs``: the frames in the log, oldest first (``record_runs``)."""
        self._starts = array("q")
        self._counts = array("q")
        self._head = 0
        """The first live run (the runs before it are forgotten, cut off in batches)."""
        self._end = 0
        """One past the newest frame counted."""
        self._newest = -1
        """The record count of the newest run's frames; -1 when no run is live."""
        self.records = 0
        for first, frames, count in runs:
            self._count(first, count, frames)
        self.forget_below(checkpoint)

    def add(self, first_offset: int, frames: Sequence[PreparedFrame]) -> None:
        """Count a group just written, with consecutive offsets from ``first_offset``."""
        offset = first_offset
        for item, *_ in frames:
            count = item.record_count
            if offset == self._end and count == self._newest:
                self._end = offset + 1  # the newest run goes on (every frame of a linger-0 client)
                self.records += count
            else:
                self._count(offset, count)
            offset += 1

    def _count(self, offset: int, count: int, frames: int = 1) -> None:
        """Count ``frames`` frames of ``count`` records each from ``offset`` on."""
        starts, counts = self._starts, self._counts
        if self._head == len(starts):  # nothing live: start afresh
            del starts[:], counts[:]
            self._head = 0
            starts.append(offset)
            counts.append(count)
        else:
            offset = max(offset, self._end)  # (offsets only grow; a figure never fails a write)
            if offset > self._end and counts[-1] != 0:  # offsets no frame holds
                starts.append(self._end)
                counts.append(0)
            if counts[-1] != count:
                starts.append(offset)
                counts.append(count)
        self._end = offset + frames
        self._newest = count
        self.records += count * frames

    def forget_below(self, offset: int) -> None:
        starts, counts = self._starts, self._counts
        head, live = self._head, len(starts)
        while head < live and starts[head] < offset:
            stop = starts[head + 1] if head + 1 < live else self._end
            if stop > offset:  # the checkpoint lies inside this run
                self.records -= counts[head] * (offset - starts[head])
                starts[head] = offset
                break
            self.records -= counts[head] * (stop - starts[head])
            head += 1
        if head == live:
            self._newest = -1
        if head >= _COMPACT_AFTER_RUNS and 2 * head >= live:
            del starts[:head], counts[:head]
            head = 0
        self._head = head
