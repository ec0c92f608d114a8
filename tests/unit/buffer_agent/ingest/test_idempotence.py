"""idempotence: broker-style sequence checks, producer ids and state persistence."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest.idempotence import (
    TRACKED_BATCHES,
    ProducerIdAllocator,
    ProducerStateStore,
    SequenceTracker,
    Verdict,
)
from durable_producer.buffer_agent.kafka.record_batch import BatchHeader


def header(producer_id: int, epoch: int, base_sequence: int, records: int = 1) -> BatchHeader:
    return BatchHeader(
        base_offset=0,
        batch_length=100,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=records - 1,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        record_count=records,
    )


def accept(tracker: SequenceTracker, batch: BatchHeader, offset: int, partition: int = 0) -> None:
    assert tracker.check("t", partition, batch).verdict is Verdict.ACCEPT
    tracker.record("t", partition, batch, offset)


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


def test_snapshot_keeps_confirmed_batches_only(tmp_path: Path) -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0, records=4), 20)
    tracker.record("t", 0, header(7, 1, 4))  # append still running
    store = ProducerStateStore(tmp_path)
    store.save(tracker, 21)
    restored, offset = store.load()
    assert offset == 21
    assert restored.check("t", 0, header(7, 1, 0, records=4)).verdict is Verdict.DUPLICATE
    assert restored.check("t", 0, header(7, 1, 4)).verdict is Verdict.ACCEPT
    assert restored.check("t", 0, header(7, 0, 4)).verdict is Verdict.INVALID_EPOCH


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


def test_corrupt_snapshot_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "producer_state.json").write_text("{not json")
    tracker, offset = ProducerStateStore(tmp_path).load()
    assert len(tracker) == 0 and offset == 0


def test_producer_ids_are_unique_across_restarts(tmp_path: Path) -> None:
    first = ProducerIdAllocator(tmp_path, block_size=3)
    issued = [first.allocate() for _ in range(5)]
    second = ProducerIdAllocator(tmp_path, block_size=3)  # "restart": unused ids are skipped
    issued += [second.allocate() for _ in range(4)]
    assert len(set(issued)) == len(issued)
    assert issued[:5] == [0, 1, 2, 3, 4]
    assert min(issued[5:]) >= 6


def test_producer_ids_stay_above_ids_seen_in_the_wal(tmp_path: Path) -> None:
    allocator = ProducerIdAllocator(tmp_path)
    allocator.ensure_above(41)
    assert allocator.allocate() == 42


def test_allocator_rejects_empty_blocks(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ProducerIdAllocator(tmp_path, block_size=0)


def test_idle_producers_expire_and_survive_snapshots(tmp_path: Path) -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    accept(tracker, header(8, 0, 0), 2)
    store = ProducerStateStore(tmp_path)
    store.save(tracker, 3)
    restored, _ = store.load()
    assert restored.expire(idle_s=3600) == 0
    assert restored.expire(idle_s=3600, now=time.time() + 7200) == 2
    assert len(restored) == 0
