"""Duplicates are counted by what is known: certain when an earlier copy was acknowledged,
possible when an earlier copy's outcome was never known; and the marks that carry this
knowledge across a crash survive torn writes."""

from __future__ import annotations

import os
from pathlib import Path

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.delivery_marks import (
    MARKS_FILE,
    SLOT_BYTES,
    DeliveryMarks,
    MarksFile,
    read_marks,
)
from durable_producer.buffer_agent.forward.replay_accounting import ReplayAccount

P0, P1 = ("t", 0), ("t", 1)


def _tracker(frames: list[tuple[int, tuple[str, int], int]], settled: set[int]) -> AckTracker:
    """Frames (offset, partition, records) registered in order; ``settled`` ones acked."""
    tracker = AckTracker(frames[0][0])
    for offset, key, records in frames:
        tracker.register(offset, records, key=key)
    for offset, _, records in frames:
        if offset in settled:
            tracker.ack(offset, records)
    return tracker


def test_delivered_prefixes_stop_at_each_partitions_first_pending_frame() -> None:
    tracker = _tracker(
        [(0, P0, 1), (1, P1, 1), (2, P0, 1), (3, P1, 1), (4, P0, 1)], settled={1, 2, 4}
    )

    assert tracker.watermark == 0
    assert tracker.settled_offsets() == [1, 2, 4]
    assert tracker.delivered_prefixes() == {P1: 1}, "P0 waits for frame 0, P1 for frame 3"


def test_after_a_reset_settled_frames_count_certain_and_in_flight_ones_possible() -> None:
    tracker = _tracker([(10, P0, 2), (11, P1, 3), (12, P0, 4)], settled={11})
    account = ReplayAccount(checkpoint=10)

    account.after_reset(tracker)  # frames 10 and 12 were in flight: 6 records abandoned

    assert account.possible == {"restart": 0, "reset": 6}
    assert account.until == 13
    for offset, key, records in [(10, P0, 2), (11, P1, 3), (12, P0, 4)]:
        account.sent_again(offset, *key, records)
        account.settled_again(offset, *key, records)
    assert account.certain == {"restart": 0, "reset": 3}, "only frame 11 had a known copy"


def test_a_second_reset_counts_the_copies_it_abandons_again() -> None:
    account = ReplayAccount(checkpoint=0)
    first = _tracker([(0, P0, 5)], settled={0})
    first.register(1, 2, key=P1)
    account.after_reset(first)  # frame 0 known, frame 1 abandoned (2 possible)
    second = AckTracker(1)
    second.register(1, 2, key=P1)
    account.after_reset(second)  # its new copy abandoned too

    account.settled_again(1, *P1, 2)

    assert account.possible["reset"] == 4
    assert account.certain_duplicates == 0, "no copy of frame 1 was ever acknowledged"


def test_after_a_crash_the_marks_say_which_replayed_frames_kafka_had() -> None:
    marks = DeliveryMarks(
        checkpoint=100, delivered_below=103, sent_below=110, partition_delivered={P1: 106}
    )
    account = ReplayAccount(checkpoint=100, marks=marks)
    assert account.until == 110

    replayed = [(100, P0), (102, P1), (105, P0), (106, P1), (108, P1), (111, P0)]
    for offset, key in replayed:
        account.sent_again(offset, *key, 10)
        account.sent_again(offset, *key, 10)  # sent again after a reset: counted once
        account.settled_again(offset, *key, 10)

    # 100, 102 (below delivered_below) and 106 (P1's prefix): certain; 105 and 108: their
    # earlier copies' fate is unknown; 111 was never sent before.
    assert account.certain == {"restart": 30, "reset": 0}
    assert account.possible == {"restart": 20, "reset": 0}


def test_marks_that_do_not_fit_the_wal_are_ignored() -> None:
    stale = DeliveryMarks(checkpoint=500, delivered_below=600, sent_below=700)

    account = ReplayAccount(checkpoint=0, until=3, marks=stale)  # a WAL started over

    assert account.until == 3 and not account.known(10, *P0)


def test_marks_are_written_before_sending_and_read_back(tmp_path: Path) -> None:
    account = ReplayAccount(checkpoint=0, marks_file=MarksFile(tmp_path))
    tracker = _tracker([(0, P0, 1), (1, P1, 1), (2, P1, 1)], settled={0, 1})

    account.before_sending(3, tracker, checkpoint=0)
    account.maybe_write(tracker, checkpoint=0, delivered=2)

    # P1's prefix (frame 1) is below the watermark (2): not worth keeping.
    assert read_marks(tmp_path) == DeliveryMarks(checkpoint=0, delivered_below=2, sent_below=3)
    assert os.path.getsize(tmp_path / MARKS_FILE) == 2 * SLOT_BYTES, "preallocated"


def test_a_torn_slot_leaves_the_previous_record(tmp_path: Path) -> None:
    marks_file = MarksFile(tmp_path)
    marks_file.write(DeliveryMarks(checkpoint=1, delivered_below=2, sent_below=3))  # slot 1
    marks_file.write(DeliveryMarks(checkpoint=1, delivered_below=5, sent_below=9))  # slot 0
    path = tmp_path / MARKS_FILE
    assert read_marks(tmp_path) == DeliveryMarks(1, 5, 9)
    data = bytearray(path.read_bytes())

    data[30] ^= 0xFF  # a crash tore the newer record
    path.write_bytes(data)
    assert read_marks(tmp_path) == DeliveryMarks(1, 2, 3)

    data[SLOT_BYTES + 30] ^= 0xFF
    path.write_bytes(data)
    assert read_marks(tmp_path) is None, "both torn: nothing is trusted"

    MarksFile(tmp_path).write(DeliveryMarks(2, 6, 10))  # a new run writes over the damage
    assert read_marks(tmp_path) == DeliveryMarks(2, 6, 10)


def test_too_many_partitions_keep_the_global_marks(tmp_path: Path) -> None:
    many = {("topic-with-a-long-name", partition): partition for partition in range(5000)}
    MarksFile(tmp_path).write(DeliveryMarks(0, 4, 8, many))

    assert read_marks(tmp_path) == DeliveryMarks(0, 4, 8)


def test_a_marks_file_that_cannot_be_written_costs_only_exactness(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("x")

    assert MarksFile(blocked).write(DeliveryMarks()) is False
    assert read_marks(blocked) is None
