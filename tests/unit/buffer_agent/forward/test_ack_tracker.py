"""The acknowledged watermark never passes an undelivered record, in any delivery order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker


def test_watermark_starts_at_the_checkpoint() -> None:
    tracker = AckTracker(start_offset=42)
    assert tracker.watermark == 42
    assert tracker.idle


def test_watermark_waits_for_the_oldest_frame() -> None:
    tracker = AckTracker(start_offset=10)
    tracker.register(10, 2, appended_ms=1000)
    tracker.register(11, 1, appended_ms=2000)
    tracker.ack(11)
    assert tracker.watermark == 10
    assert tracker.oldest_pending_appended_ms == 1000
    assert tracker.delivered_high == 12
    tracker.ack(10)
    assert tracker.watermark == 10
    tracker.ack(10)
    assert tracker.watermark == 12
    assert tracker.idle and tracker.pending_records == 0
    assert tracker.oldest_pending_appended_ms is None


def test_empty_frames_count_as_delivered() -> None:
    tracker = AckTracker(start_offset=0)
    tracker.register(0, 0)
    assert tracker.watermark == 1
    tracker.register(1, 1)
    tracker.register(2, 0)
    assert tracker.watermark == 1
    tracker.ack(1)
    assert tracker.watermark == 3


def test_gaps_in_wal_offsets_are_skipped() -> None:
    tracker = AckTracker(start_offset=5)
    tracker.register(9, 1)
    assert tracker.watermark == 9
    tracker.ack(9)
    assert tracker.watermark == 10


def test_misuse_is_rejected() -> None:
    tracker = AckTracker(start_offset=0)
    tracker.register(3, 1)
    with pytest.raises(ValueError, match="out of order"):
        tracker.register(2, 1)
    with pytest.raises(ValueError, match="acknowledgements"):
        tracker.ack(3, 2)
    with pytest.raises(KeyError):
        tracker.ack(7)


@given(
    counts=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=40),
    data=st.data(),
)
def test_any_delivery_order_gives_the_lowest_incomplete_frame(
    counts: list[int], data: st.DataObject
) -> None:
    start = 100
    tracker = AckTracker(start_offset=start)
    for index, count in enumerate(counts):
        tracker.register(start + index, count)
    acks = [start + index for index, count in enumerate(counts) for _ in range(count)]
    order = data.draw(st.permutations(acks))
    remaining = {start + index: count for index, count in enumerate(counts)}
    for offset in order:
        tracker.ack(offset)
        remaining[offset] -= 1
        incomplete = [o for o, left in remaining.items() if left]
        expected = min(incomplete) if incomplete else start + len(counts)
        assert tracker.watermark == expected
        assert tracker.pending_records == sum(remaining.values())
    assert tracker.watermark == start + len(counts)
    assert tracker.idle
