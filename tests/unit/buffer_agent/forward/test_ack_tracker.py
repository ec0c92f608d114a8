"""The acknowledged watermark never passes an undelivered record, in any delivery order.

The tracker reads the watermark from the partition queues that hold the frames in flight;
these tests use real queues, real record batches and the queues' own acknowledgement
(``next_batch``, ``succeeded``, ``drop_heads``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue, settled_frames
from support.batch_builder import SampleRecord, build_batch

MAX_BYTES = 1 << 20


def batch_of(records: int) -> bytes:
    return build_batch([SampleRecord(None, b"v%d" % n, 1000) for n in range(records)])


class Partitions:
    """The forwarder's part, small: frames into queues, answers out of them."""

    def __init__(self, start: int, partitions: int = 2) -> None:
        self.queues = {("t", p): PartitionQueue(("t", p), 7, 0, 0) for p in range(partitions)}
        for queue in self.queues.values():
            queue.confirmed = True
        self.tracker = AckTracker(start, self.queues)

    def read(self, offset: int, partition: int, records: int, appended_ms: int = 0) -> None:
        queue = self.queues[("t", partition)]
        batch = batch_of(records)
        queue.add(offset, batch, records, 0, appended_ms, False)
        self.tracker.read(offset + 1, records, len(batch))

    def deliver_next(self, partition: int) -> list[int]:
        """The partition's next batch is sent and Kafka takes it: the offsets it settled."""
        queue = self.queues[("t", partition)]
        batch = queue.next_batch(0.0, MAX_BYTES)
        assert batch is not None
        taken = queue.succeeded(batch)
        self.tracker.settled(queue, taken)
        frames, records, size = taken
        assert records == sum(frame[2] for frame in frames)
        assert size == sum(len(frame[1]) for frame in frames)
        return [frame[0] for frame in frames]


def test_watermark_starts_at_the_checkpoint() -> None:
    tracker = AckTracker(42, {})
    assert tracker.watermark == 42
    assert tracker.idle
    assert tracker.oldest_pending_appended_ms is None


def test_watermark_waits_for_the_oldest_frame_of_any_partition() -> None:
    parts = Partitions(start=10)
    parts.read(10, 0, 2, appended_ms=1000)
    parts.read(11, 1, 1, appended_ms=2000)
    assert parts.tracker.pending_records == 3
    assert parts.tracker.pending_bytes == len(batch_of(2)) + len(batch_of(1))
    assert parts.deliver_next(1) == [11]
    assert parts.tracker.pending_bytes == len(batch_of(2))
    assert parts.tracker.watermark == 10
    assert parts.tracker.oldest_pending_appended_ms == 1000
    assert parts.tracker.delivered_high == 12
    assert parts.deliver_next(0) == [10]
    assert parts.tracker.watermark == 12
    assert parts.tracker.idle and parts.tracker.pending_records == 0
    assert parts.tracker.pending_bytes == 0
    assert parts.tracker.oldest_pending_appended_ms is None


def test_frames_with_nothing_to_deliver_are_passed() -> None:
    parts = Partitions(start=0)
    parts.tracker.passed(0)  # a frame Kafka holds already, or with no batch
    assert parts.tracker.watermark == 1
    assert parts.tracker.delivered_high == 1
    parts.read(1, 0, 1)
    parts.tracker.passed(2)
    assert parts.tracker.watermark == 1
    assert parts.tracker.delivered_high == 3
    parts.deliver_next(0)
    assert parts.tracker.watermark == 3
    parts.tracker.read(5)  # frames 3 and 4 read with nothing in them for a queue
    assert parts.tracker.watermark == 5


def test_gaps_in_wal_offsets_are_skipped() -> None:
    parts = Partitions(start=5)
    parts.read(9, 0, 1)
    assert parts.tracker.watermark == 9
    parts.deliver_next(0)
    assert parts.tracker.watermark == 10


def test_a_dead_lettered_head_leaves_like_a_delivered_one() -> None:
    parts = Partitions(start=0)
    parts.read(0, 0, 3)
    parts.read(1, 0, 1)
    queue = parts.queues[("t", 0)]
    taken = settled_frames(queue.drop_heads(1, 0, 0.0))
    assert taken[1] == 3
    parts.tracker.settled(queue, taken)
    assert parts.tracker.watermark == 1
    assert parts.tracker.pending_records == 1


def test_a_frame_of_several_batches_holds_until_its_last_is_delivered() -> None:
    parts = Partitions(start=0)
    queue = parts.queues[("t", 0)]
    queue.isolate = True  # one stored batch per request
    for index in range(2):
        queue.add(0, batch_of(1), 1, 0, 0, False, index)
    parts.tracker.read(1, 2)
    parts.deliver_next(0)
    assert parts.tracker.watermark == 0, "half of frame 0 is delivered"
    assert parts.tracker.delivered_high == 0
    parts.deliver_next(0)
    assert parts.tracker.watermark == 1
    assert parts.tracker.delivered_high == 1


def test_more_settled_than_pending_is_refused() -> None:
    parts = Partitions(start=0)
    parts.read(0, 0, 2)
    head = settled_frames([parts.queues[("t", 0)].frames[0]])
    parts.tracker.settled(parts.queues[("t", 0)], head)
    with pytest.raises(ValueError, match="settled"):
        parts.tracker.settled(parts.queues[("t", 0)], head)


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.integers(min_value=0, max_value=3)),
        min_size=1,
        max_size=30,
    ),
    data=st.data(),
)
def test_any_delivery_order_gives_the_lowest_incomplete_frame(
    frames: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Frames of three partitions (a count of 0: nothing to deliver); Kafka answers the
    partitions in any interleaving, each partition's batches in order."""
    start = 100
    parts = Partitions(start, partitions=3)
    waiting: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for position, (partition, records) in enumerate(frames):
        offset = start + position
        if records:
            parts.read(offset, partition, records)
            waiting[partition].append(offset)
        else:
            parts.tracker.passed(offset)
    undelivered = {offset for offsets in waiting.values() for offset in offsets}
    while undelivered:
        partition = data.draw(st.sampled_from([p for p, left in waiting.items() if left]))
        for offset in parts.deliver_next(partition):
            undelivered.discard(offset)
            waiting[partition].remove(offset)
        expected = min(undelivered) if undelivered else start + len(frames)
        assert parts.tracker.watermark == expected
    assert parts.tracker.watermark == start + len(frames)
    assert parts.tracker.idle
