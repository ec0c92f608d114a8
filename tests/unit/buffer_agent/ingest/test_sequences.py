"""sequences: broker-style sequence checks, duplicates, epochs, replay and lenient partitions."""

from __future__ import annotations

from durable_producer.buffer_agent.ingest.sequences import (
    TRACKED_BATCHES,
    SequenceTracker,
    Verdict,
)
from support.producer_batches import accept, header


def test_in_order_batches_are_accepted_and_retries_are_duplicates() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0, records=3), 10)
    accept(tracker, header(7, 0, 3, records=2), 11)
    check = tracker.check("t", 0, header(7, 0, 0, records=3))
    assert check.verdict is Verdict.DUPLICATE
    assert check.duplicate_of is not None and check.duplicate_of.wal_offset == 10
    assert tracker.check("t", 0, header(7, 0, 3, records=2)).verdict is Verdict.DUPLICATE


def test_gap_is_out_of_order() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0, records=3), 1)
    check = tracker.check("t", 0, header(7, 0, 5))
    assert check.verdict is Verdict.OUT_OF_ORDER
    assert "expected sequence 3, got 5" in check.reason


def test_only_the_last_five_batches_are_remembered() -> None:
    tracker = SequenceTracker()
    for sequence in range(TRACKED_BATCHES + 1):
        accept(tracker, header(7, 0, sequence), sequence)
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is Verdict.OUT_OF_ORDER
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is Verdict.DUPLICATE


def test_epochs() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 2, 0), 1)
    older = tracker.check("t", 0, header(7, 1, 1))
    assert older.verdict is Verdict.INVALID_EPOCH
    assert "epoch 1 is older than the current epoch 2" in older.reason
    assert tracker.check("t", 0, header(7, 3, 4)).verdict is Verdict.OUT_OF_ORDER
    accept(tracker, header(7, 3, 0), 2)
    assert dict(tracker.producers()) == {7: 3}


def test_partitions_and_producers_are_independent() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1, partition=0)
    accept(tracker, header(7, 0, 0), 2, partition=1)
    accept(tracker, header(8, 0, 0), 3, partition=0)
    assert tracker.check("t", 1, header(7, 0, 1)).verdict is Verdict.ACCEPT
    assert tracker.check("other", 0, header(7, 0, 0)).verdict is Verdict.ACCEPT


def test_sequence_wraps_around() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 2**31 - 2, records=2), 1)
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is Verdict.ACCEPT


def test_non_idempotent_batches_are_not_tracked() -> None:
    tracker = SequenceTracker()
    plain = header(-1, -1, -1)
    assert tracker.check("t", 0, plain).verdict is Verdict.ACCEPT
    assert tracker.record("t", 0, plain, 1) is None
    assert len(tracker) == 0


def test_forget_undoes_a_failed_append() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    pending = tracker.record("t", 0, header(7, 0, 1))
    assert pending is not None and pending.wal_offset is None
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is Verdict.DUPLICATE
    tracker.forget("t", 0, 7, pending)
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is Verdict.ACCEPT


def test_replay_is_idempotent_and_respects_epochs() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0), 5)
    tracker.replay("t", 0, header(7, 1, 0), 5)
    tracker.replay("t", 0, header(7, 0, 9), 3)
    tracker.replay("t", 0, header(7, 1, 1), 6)
    assert tracker.check("t", 0, header(7, 1, 2)).verdict is Verdict.ACCEPT
    assert tracker.check("t", 0, header(7, 1, 1)).verdict is Verdict.DUPLICATE


def test_lenient_partitions_accept_one_gap_after_lost_history() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    tracker.mark_lenient()
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is Verdict.DUPLICATE
    accept(tracker, header(7, 0, 40), 2)
    assert tracker.check("t", 0, header(7, 0, 60)).verdict is Verdict.OUT_OF_ORDER
