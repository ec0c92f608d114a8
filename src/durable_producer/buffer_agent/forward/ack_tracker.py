"""The contiguous acknowledged watermark over WAL frames.

Frames are registered in WAL order with the number of records they hold; delivery
reports acknowledge records of a frame (one at a time or several at once). The watermark
is the lowest WAL offset whose frame is not yet fully delivered (or one past the last
registered frame when all are), so ``wal.checkpoint(tracker.watermark)`` never skips an
undelivered record, whatever order Kafka acknowledges partitions in.
"""

from __future__ import annotations

from collections import deque

PartitionKey = tuple[str, int]
"""(topic, partition) of a frame."""


class _PendingFrame:
    __slots__ = ("appended_ms", "key", "offset", "remaining")

    def __init__(
        self, offset: int, remaining: int, appended_ms: int, key: PartitionKey | None
    ) -> None:
        self.offset = offset
        self.remaining = remaining
        self.appended_ms = appended_ms
        self.key = key


class AckTracker:
    def __init__(self, start_offset: int = 0) -> None:
        self._start = start_offset
        self._queue: deque[_PendingFrame] = deque()
        self._by_offset: dict[int, _PendingFrame] = {}
        self._next_after_last = start_offset
        self._delivered_high = start_offset
        self._pending_records = 0

    def register(
        self,
        offset: int,
        record_count: int,
        appended_ms: int = 0,
        key: PartitionKey | None = None,
    ) -> None:
        """Track the frame at ``offset``; frames must come in increasing offset order.

        A frame with no records to wait for (empty, or dead-lettered as a whole) counts as
        delivered at once. ``key``: its topic and partition (``delivered_prefixes``).
        """
        if offset < self._next_after_last:
            raise ValueError(
                f"frame {offset} registered out of order (expected >= {self._next_after_last})"
            )
        if record_count < 0:
            raise ValueError(f"frame {offset}: negative record count {record_count}")
        self._next_after_last = offset + 1
        if record_count == 0:
            self._note_delivered(offset)
            return
        frame = _PendingFrame(offset, record_count, appended_ms, key)
        self._queue.append(frame)
        self._by_offset[offset] = frame
        self._pending_records += record_count

    def ack(self, offset: int, count: int = 1) -> None:
        """``count`` records of the frame at ``offset`` are acknowledged by Kafka."""
        frame = self._by_offset.get(offset)
        if frame is None:
            raise KeyError(f"no frame {offset} is waiting for delivery reports")
        if count <= 0 or count > frame.remaining:
            raise ValueError(
                f"frame {offset}: {count} acknowledgements for {frame.remaining} pending records"
            )
        frame.remaining -= count
        self._pending_records -= count
        if frame.remaining:
            return
        del self._by_offset[offset]
        self._note_delivered(offset)
        queue = self._queue
        while queue and queue[0].remaining == 0:
            queue.popleft()

    def _note_delivered(self, offset: int) -> None:
        if offset + 1 > self._delivered_high:
            self._delivered_high = offset + 1

    @property
    def watermark(self) -> int:
        """Every frame below this WAL offset is fully delivered."""
        if self._queue:
            return self._queue[0].offset
        return self._next_after_last

    def settled_offsets(self) -> list[int]:
        """Frames at or above the watermark that are fully delivered."""
        return [frame.offset for frame in self._queue if not frame.remaining]

    def delivered_prefixes(self) -> dict[PartitionKey, int]:
        """Per partition, the highest frame offset such that every frame of that partition
        from the watermark up to it is fully delivered (partitions with none: absent). One
        pass over the frames in flight."""
        prefixes: dict[PartitionKey, int] = {}
        blocked: set[PartitionKey] = set()
        for frame in self._queue:
            key = frame.key
            if key is None or key in blocked:
                continue
            if frame.remaining:
                blocked.add(key)
            else:
                prefixes[key] = frame.offset
        return prefixes

    @property
    def oldest_pending_appended_ms(self) -> int | None:
        """When the oldest frame still awaiting delivery was appended to the WAL."""
        return self._queue[0].appended_ms if self._queue else None

    @property
    def delivered_high(self) -> int:
        """One past the highest fully delivered frame (delivery need not be contiguous)."""
        return self._delivered_high

    @property
    def next_offset(self) -> int:
        """One past the last registered frame."""
        return self._next_after_last

    @property
    def pending_frames(self) -> int:
        return len(self._by_offset)

    @property
    def pending_records(self) -> int:
        return self._pending_records

    @property
    def idle(self) -> bool:
        """True when nothing registered is awaiting a delivery report."""
        return not self._by_offset
