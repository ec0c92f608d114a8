"""Batch headers of idempotent producers, for the sequence-state tests."""

from __future__ import annotations

from durable_producer.buffer_agent.ingest.sequences import SequenceTracker, SequenceVerdict
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
    assert tracker.check("t", partition, batch).verdict is SequenceVerdict.ACCEPT
    tracker.record("t", partition, batch, offset)
