"""The contiguous acknowledged watermark over WAL frames, read from the partition queues.

Every frame read with records to deliver waits in its partition's queue
(``partition_queue``) until Kafka holds all of it, and a partition's frames leave their queue
in WAL order (the broker appends a producer's batches in sequence; a dead-lettered frame
leaves from the head; a batch taken past a refused one, from further on, which leaves the
head where it was). So the lowest WAL offset not yet fully delivered is the lowest offset
at the head of any queue; with every queue empty, one past the last frame read. A frame that
is no record batch is dead-lettered before it counts as read (``passed`` once its letter is
on the volume). ``wal.checkpoint(tracker.watermark)`` never skips an
undelivered record, whatever order Kafka acknowledges partitions in.

Nothing is kept per frame (an entry a frame cost a quarter of the forwarder's work,
docs/benchmarks.md): the watermark costs one look at each queue's head.
"""

from __future__ import annotations

from collections.abc import Mapping

from durable_producer.buffer_agent.forward.partition_queue import (
    APPENDED,
    OFFSET,
    PartitionKey,
    PartitionQueue,
    Pending,
    Settled,
)


class AckTracker:
    """The watermark over ``queues`` (the forwarder's, which it keeps adding to) and the
    counts of what is in flight."""

    def __init__(self, start_offset: int, queues: Mapping[PartitionKey, PartitionQueue]) -> None:
        self._queues = queues
        self.next_offset = start_offset
        """One past the last frame read."""
        self.delivered_high = start_offset
        """One past the highest fully delivered frame (delivery need not be contiguous)."""
        self.pending_records = 0
        """Records read and not yet settled."""
        self.pending_bytes = 0
        """Their frames' bytes (the read-ahead budget's measure)."""

    def read(self, end: int, records: int = 0, size: int = 0) -> None:
        """Every frame below ``end`` is read, and ``records`` more records (``size`` bytes of
        frames) wait in queues."""
        if end > self.next_offset:
            self.next_offset = end
        self.pending_records += records
        self.pending_bytes += size

    def settled(self, queue: PartitionQueue, taken: Settled) -> None:
        """Frames left ``queue`` (``Settled``), with the records and bytes they held."""
        frames, records, size = taken
        if records > self.pending_records:
            raise ValueError(f"{records} records settled, {self.pending_records} pending")
        self.pending_records -= records
        self.pending_bytes -= size
        last = frames[-1][OFFSET]
        head = queue.first_unacknowledged()
        if head is None or head[OFFSET] != last:  # (not a frame of several batches, in part)
            self._delivered(last)

    def passed(self, offset: int) -> None:
        """The frame at ``offset`` has nothing to deliver (Kafka holds it already, or it holds
        no batch): read, and delivered."""
        self.read(offset + 1)
        self._delivered(offset)

    def _delivered(self, offset: int) -> None:
        if offset >= self.delivered_high:
            self.delivered_high = offset + 1

    def _oldest(self) -> tuple[int, int] | None:
        """(offset, appended_ms) of the lowest frame not yet delivered, if any: the lowest
        head of any queue."""
        lowest: Pending | None = None
        for queue in self._queues.values():
            head = queue.first_unacknowledged()
            if head is not None and (lowest is None or head[OFFSET] < lowest[OFFSET]):
                lowest = head
        return None if lowest is None else (lowest[OFFSET], lowest[APPENDED])

    @property
    def watermark(self) -> int:
        """Every frame below this WAL offset is fully delivered."""
        oldest = self._oldest()
        return self.next_offset if oldest is None else min(oldest[0], self.next_offset)

    @property
    def oldest_pending_appended_ms(self) -> int | None:
        """When the oldest frame still awaiting delivery was appended to the WAL."""
        oldest = self._oldest()
        return None if oldest is None else oldest[1]

    @property
    def idle(self) -> bool:
        """True when nothing read is awaiting delivery."""
        return not self.pending_records
