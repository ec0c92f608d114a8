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


class AckTracker:
    """Frames in flight are kept as plain ints and tuples, not an object each: the forwarder
    holds up to its read-ahead of them (100,000 one-record frames), and objects that live that
    long are what Python's full garbage collections scan (4 us a frame of GC with an object
    each, measured)."""

    def __init__(self, start_offset: int = 0) -> None:
        self._start = start_offset
        self._queue: deque[int] = deque()
        """Offsets of the frames registered with records, in order; fully delivered ones
        leave from the front."""
        self._remaining: dict[int, int] = {}
        """Offset -> records not acknowledged yet, for frames not fully delivered."""
        self._about: dict[int, tuple[int, PartitionKey | None]] = {}
        """Offset -> (appended_ms, key), for every offset in ``_queue``."""
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
        self._queue.append(offset)
        self._remaining[offset] = record_count
        self._about[offset] = (appended_ms, key)
        self._pending_records += record_count

    def ack(self, offset: int, count: int = 1) -> None:
        """``count`` records of the frame at ``offset`` are acknowledged by Kafka."""
        remaining = self._remaining.get(offset)
        if remaining is None:
            raise KeyError(f"no frame {offset} is waiting for delivery reports")
        if count <= 0 or count > remaining:
            raise ValueError(
                f"frame {offset}: {count} acknowledgements for {remaining} pending records"
            )
        self._pending_records -= count
        if remaining > count:
            self._remaining[offset] = remaining - count
            return
        pending = self._remaining
        del pending[offset]
        if offset >= self._delivered_high:  # _note_delivered, inline: once a frame
            self._delivered_high = offset + 1
        queue, about = self._queue, self._about
        while queue and queue[0] not in pending:
            del about[queue.popleft()]

    def _note_delivered(self, offset: int) -> None:
        if offset + 1 > self._delivered_high:
            self._delivered_high = offset + 1

    @property
    def watermark(self) -> int:
        """Every frame below this WAL offset is fully delivered."""
        if self._queue:
            return self._queue[0]
        return self._next_after_last

    def settled_offsets(self) -> list[int]:
        """Frames at or above the watermark that are fully delivered."""
        pending = self._remaining
        return [offset for offset in self._queue if offset not in pending]

    def delivered_prefixes(self) -> dict[PartitionKey, int]:
        """Per partition, the highest frame offset such that every frame of that partition
        from the watermark up to it is fully delivered (partitions with none: absent). One
        pass over the frames in flight."""
        prefixes: dict[PartitionKey, int] = {}
        blocked: set[PartitionKey] = set()
        pending, about = self._remaining, self._about
        for offset in self._queue:
            key = about[offset][1]
            if key is None or key in blocked:
                continue
            if offset in pending:
                blocked.add(key)
            else:
                prefixes[key] = offset
        return prefixes

    @property
    def oldest_pending_appended_ms(self) -> int | None:
        """When the oldest frame still awaiting delivery was appended to the WAL."""
        return self._about[self._queue[0]][0] if self._queue else None

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
        return len(self._remaining)

    @property
    def pending_records(self) -> int:
        return self._pending_records

    @property
    def idle(self) -> bool:
        """True when nothing registered is awaiting a delivery report."""
        return not self._remaining
