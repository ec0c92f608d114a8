"""sequences: broker-style sequence checks, duplicates, epochs, replay and lenient partitions."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from durable_producer.buffer_agent.ingest import sequences
from durable_producer.buffer_agent.ingest.sequences import (
    TRACKED_BATCHES,
    SequenceTracker,
    SequenceVerdict,
)
from support.producer_batches import accept, header


def test_in_order_batches_are_accepted_and_retries_are_duplicates() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0, records=3), 10)
    accept(tracker, header(7, 0, 3, records=2), 11)
    check = tracker.check("t", 0, header(7, 0, 0, records=3))
    assert check.verdict is SequenceVerdict.DUPLICATE
    assert check.duplicate_of is not None and check.duplicate_of.wal_offset == 10
    assert tracker.check("t", 0, header(7, 0, 3, records=2)).verdict is SequenceVerdict.DUPLICATE


def test_gap_is_out_of_order() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0, records=3), 1)
    check = tracker.check("t", 0, header(7, 0, 5))
    assert check.verdict is SequenceVerdict.OUT_OF_ORDER
    assert "expected sequence 3, got 5" in check.reason


def test_only_the_last_five_batches_are_remembered() -> None:
    tracker = SequenceTracker()
    for sequence in range(TRACKED_BATCHES + 1):
        accept(tracker, header(7, 0, sequence), sequence)
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is SequenceVerdict.OUT_OF_ORDER
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.DUPLICATE


def test_epochs() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 2, 0), 1)
    older = tracker.check("t", 0, header(7, 1, 1))
    assert older.verdict is SequenceVerdict.INVALID_EPOCH
    assert "epoch 1 is older than the current epoch 2" in older.reason
    assert tracker.check("t", 0, header(7, 3, 4)).verdict is SequenceVerdict.OUT_OF_ORDER
    accept(tracker, header(7, 3, 0), 2)
    assert dict(tracker.producers()) == {7: 3}


def test_partitions_and_producers_are_independent() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1, partition=0)
    accept(tracker, header(7, 0, 0), 2, partition=1)
    accept(tracker, header(8, 0, 0), 3, partition=0)
    assert tracker.check("t", 1, header(7, 0, 1)).verdict is SequenceVerdict.ACCEPT
    assert tracker.check("other", 0, header(7, 0, 0)).verdict is SequenceVerdict.ACCEPT


def test_sequence_wraps_around() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 2**31 - 2, records=2), 1)
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is SequenceVerdict.ACCEPT


def test_non_idempotent_batches_are_not_tracked() -> None:
    tracker = SequenceTracker()
    plain = header(-1, -1, -1)
    assert tracker.check("t", 0, plain).verdict is SequenceVerdict.ACCEPT
    assert tracker.record("t", 0, plain, 1) is None
    assert len(tracker) == 0


def test_forget_undoes_a_failed_append() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    pending = tracker.record("t", 0, header(7, 0, 1))
    assert pending is not None and pending.wal_offset is None
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.DUPLICATE
    tracker.forget("t", 0, 7, pending)
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.ACCEPT


def test_epochs_are_per_partition_as_on_a_broker() -> None:
    """A broker keeps producer state in each partition's log: a new epoch stored on one
    partition does not refuse the older epoch's batches on another (the Java client retries
    those after bumping its epoch when a batch expired)."""
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1, partition=0)
    accept(tracker, header(7, 0, 0), 2, partition=1)
    accept(tracker, header(7, 1, 0), 3, partition=1)
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.ACCEPT
    older = tracker.check("t", 1, header(7, 0, 1))
    assert older.verdict is SequenceVerdict.INVALID_EPOCH
    assert older.reason == "producer 7 epoch 0 is older than the current epoch 1 on t-1"
    assert dict(tracker.producers()) == {7: 1}


def test_a_refused_batch_of_a_new_epoch_leaves_the_epoch_as_it_was() -> None:
    """A broker takes a producer's new epoch only with a batch it writes: the refused first
    batch of a new epoch (the WAL is full) must not make the agent answer the client's retries
    of the older ones INVALID_PRODUCER_EPOCH."""
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0, records=2), 1)
    bumped = tracker.record("t", 0, header(7, 1, 0))
    assert bumped is not None
    tracker.forget("t", 0, 7, bumped)  # its append was refused: the WAL is full
    assert dict(tracker.producers()) == {7: 0}
    assert tracker.check("t", 0, header(7, 0, 2)).verdict is SequenceVerdict.ACCEPT
    assert tracker.check("t", 0, header(7, 0, 0, records=2)).verdict is SequenceVerdict.DUPLICATE
    assert tracker.check("t", 0, header(7, 1, 0)).verdict is SequenceVerdict.ACCEPT


def test_a_new_epoch_stays_while_one_of_its_batches_is_stored_or_pending() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    first = tracker.record("t", 0, header(7, 1, 0))
    second = tracker.record("t", 0, header(7, 1, 1))
    assert first is not None and second is not None
    tracker.forget("t", 0, 7, second)
    assert dict(tracker.producers()) == {7: 1}
    first.wal_offset = 2  # stored
    refused = tracker.record("t", 0, header(7, 1, 1))
    assert refused is not None
    tracker.forget("t", 0, 7, refused)
    assert dict(tracker.producers()) == {7: 1}
    assert tracker.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.INVALID_EPOCH
    assert tracker.check("t", 0, header(7, 1, 1)).verdict is SequenceVerdict.ACCEPT


def test_snapshots_keep_each_partitions_epoch_and_read_the_older_format() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1, partition=0)
    accept(tracker, header(7, 2, 0), 2, partition=1)
    restored = SequenceTracker.from_json(json.loads(tracker.to_json_text()))
    assert restored.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.ACCEPT
    assert restored.check("t", 1, header(7, 1, 1)).verdict is SequenceVerdict.INVALID_EPOCH
    older = {
        "producers": {"7": {"epoch": 2, "last_seen": 0, "partitions": [["t", 0, [[0, 0, 1]]]]}}
    }
    assert SequenceTracker.from_json(older).check("t", 0, header(7, 1, 1)).verdict is (
        SequenceVerdict.INVALID_EPOCH
    )


def test_a_producer_whose_first_batch_is_refused_stays_unknown() -> None:
    """Unknown, its older epoch's batches are accepted at any sequence, as by a broker."""
    tracker = SequenceTracker()
    refused = tracker.record("t", 0, header(7, 3, 0))
    assert refused is not None
    tracker.forget("t", 0, 7, refused)
    assert dict(tracker.producers()) == {}
    assert tracker.check("t", 0, header(7, 2, 9)).verdict is SequenceVerdict.ACCEPT
    assert tracker.to_json_text() == '{"producers":{}}'


def test_replay_is_idempotent_and_respects_epochs() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0), 5)
    tracker.replay("t", 0, header(7, 1, 0), 5)
    tracker.replay("t", 0, header(7, 0, 9), 3)
    tracker.replay("t", 0, header(7, 1, 1), 6)
    assert tracker.check("t", 0, header(7, 1, 2)).verdict is SequenceVerdict.ACCEPT
    assert tracker.check("t", 0, header(7, 1, 1)).verdict is SequenceVerdict.DUPLICATE


def test_lenient_partitions_accept_one_gap_after_lost_history() -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    tracker.mark_lenient()
    assert tracker.check("t", 0, header(7, 0, 0)).verdict is SequenceVerdict.DUPLICATE
    accept(tracker, header(7, 0, 40), 2)
    assert tracker.check("t", 0, header(7, 0, 60)).verdict is SequenceVerdict.OUT_OF_ORDER


def test_entries_are_bounded_and_the_least_recently_seen_producers_go_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review finding 8: state grew with every producer id for a day (Spark makes one per
    task): 20k producers on 50 partitions held ~1 GB."""
    now = [1000.0]
    monkeypatch.setattr(sequences.time, "time", lambda: now[0])
    tracker = SequenceTracker(max_partitions=5_000)
    tracemalloc.start()
    try:
        for producer_id in range(2_000):  # 100k (producer, partition) entries offered
            now[0] += 1
            for partition in range(50):
                tracker.record("t", partition, header(producer_id, 0, 0), producer_id)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tracker._partitions <= 5_000
    assert held < 5_000 * 400, f"{held} bytes for at most 5,000 entries"
    assert tracker.forgotten > 0
    kept = {producer_id for producer_id, _ in tracker.producers()}
    assert 1_999 in kept and 0 not in kept  # the newest stay, the oldest went
    retry = tracker.check("t", 0, header(1_999, 0, 0))
    assert retry.verdict is SequenceVerdict.DUPLICATE  # a retry of a kept producer is still caught
    assert tracker.check("t", 0, header(0, 0, 7)).verdict is SequenceVerdict.ACCEPT  # unknown again


def test_the_snapshot_text_renders_only_producers_changed_since_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = SequenceTracker()
    for producer_id in range(100):
        tracker.record("t", 0, header(producer_id, 0, 0), producer_id)
    first = tracker.to_json_text()
    rendered: list[int] = []
    real_render = sequences._render

    def counting_render(producer_id: int, producer: object) -> tuple[str, bool]:
        rendered.append(producer_id)
        return real_render(producer_id, producer)  # type: ignore[arg-type]

    monkeypatch.setattr(sequences, "_render", counting_render)
    assert tracker.to_json_text() == first
    assert rendered == []
    tracker.record("t", 0, header(7, 0, 1), 100)
    pending = tracker.record("t", 1, header(8, 0, 0))  # its append still running
    document = json.loads(tracker.to_json_text())
    assert sorted(rendered) == [7, 8]
    # partition 1's batch is not confirmed (its append runs): not stored yet
    assert document["producers"]["8"]["partitions"] == [["t", 0, [[0, 0, 8]], 0]]
    assert pending is not None
    pending.wal_offset = 101
    rendered.clear()
    document = json.loads(tracker.to_json_text())
    assert rendered == [8]  # rendered again until confirmed
    assert document["producers"]["8"]["partitions"] == [
        ["t", 0, [[0, 0, 8]], 0],
        ["t", 1, [[0, 0, 101]], 0],
    ]
    assert SequenceTracker.from_json(document).to_json() == document
