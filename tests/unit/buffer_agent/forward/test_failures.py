"""A dead letter the disk has no room for keeps its frame unsettled (so it stays in the WAL)
until the letter is written."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.delivery import DeliveryLedger, DeliveryMode
from durable_producer.buffer_agent.forward.failures import LETTER_RETRY_S, FailureHandler
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.wal import Frame


class FullDisk(DeadLetterStore):
    """Refuses ``refusals`` appends with ENOSPC, then writes."""

    def __init__(self, directory: Path, refusals: int) -> None:
        super().__init__(directory)
        self.refusals = refusals

    def _append(self, name: str, entry: Any) -> None:
        if self.refusals:
            self.refusals -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._append(name, entry)


def test_an_undecodable_frame_waits_in_the_wal_until_its_letter_is_written(
    tmp_path: Path,
) -> None:
    metrics = AgentMetrics()
    store = FullDisk(tmp_path, refusals=2)
    failures = FailureHandler(
        store, DeliveryMode(), metrics, unknown_topic_wait_s=1.0, retry_backoff_s=1.0
    )
    ledger = DeliveryLedger(AckTracker(0), failures)
    for offset in (0, 1):
        frame = Frame(offset, "t", 0, b"not a record batch", 1, appended_ms=5)
        produced = ledger.produce_frame(
            frame,
            None,
            sparse=True,
            wait_for_room=lambda: True,  # type: ignore[arg-type]
        )
        assert produced == 0
    assert ledger.tracker.watermark == 0, "the checkpoint must not pass an unwritten letter"
    assert len(failures.waiting_letters) == 2
    failures.write_waiting_letters(100.0, ledger.generation)  # the second refusal
    assert ledger.tracker.watermark == 0
    failures.write_waiting_letters(100.0 + LETTER_RETRY_S / 2, ledger.generation)  # not yet due
    assert len(failures.waiting_letters) == 2
    failures.write_waiting_letters(100.0 + LETTER_RETRY_S, ledger.generation)
    assert ledger.tracker.watermark == 2 and not failures.waiting_letters
    assert [letter.id for letter in list_dead_letters(tmp_path)] == ["0-frame", "1-frame"]
    assert failures.dead_letter_count == 2
    assert metrics.write_errors.labels(file="dead_letter")._value.get() == 2


def test_letters_of_a_replaced_producer_are_dropped_their_frame_is_replayed(
    tmp_path: Path,
) -> None:
    failures = FailureHandler(
        FullDisk(tmp_path, refusals=1),
        DeliveryMode(),
        None,
        unknown_topic_wait_s=1.0,
        retry_backoff_s=1.0,
    )
    ledger = DeliveryLedger(AckTracker(0), failures)
    frame = Frame(0, "t", 0, b"not a record batch", 1, appended_ms=5)
    ledger.produce_frame(frame, None, sparse=True, wait_for_room=lambda: True)  # type: ignore[arg-type]
    failures.write_waiting_letters(10.0, ledger.generation + 1)
    assert not failures.waiting_letters
    assert list_dead_letters(tmp_path) == []


def test_a_letter_written_at_once_settles_at_once(tmp_path: Path) -> None:
    failures = FailureHandler(
        FullDisk(tmp_path, refusals=0),
        DeliveryMode(),
        None,
        unknown_topic_wait_s=1.0,
        retry_backoff_s=1.0,
    )
    ledger = DeliveryLedger(AckTracker(0), failures)
    frame = Frame(0, "t", 0, b"not a record batch", 1, appended_ms=5)
    ledger.produce_frame(frame, None, sparse=True, wait_for_room=lambda: True)  # type: ignore[arg-type]
    assert ledger.tracker.watermark == 1 and not failures.waiting_letters


def test_refusals_reported_after_a_reset_are_counted_but_not_the_old_queues_purge(
    tmp_path: Path,
) -> None:
    """A record a reset producer sent may still be refused by Kafka, and land after later
    records of its partition once replayed: the refusal is counted like any other."""
    metrics = AgentMetrics()
    health = ForwarderHealth(stall_after_s=10.0, on_error=metrics.count_kafka_error)
    failures = FailureHandler(
        DeadLetterStore(tmp_path),
        DeliveryMode(),
        metrics,
        unknown_topic_wait_s=1.0,
        retry_backoff_s=1.0,
        health=health,
    )
    failures.refused_after_reset(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))
    failures.refused_after_reset(KafkaError(KafkaError._PURGE_QUEUE))

    counted = metrics.kafka_errors.labels(kind="delivery", error="INVALID_PRODUCER_EPOCH")
    assert counted._value.get() == 1
    assert metrics.kafka_errors.labels(kind="delivery", error="_PURGE_QUEUE")._value.get() == 0
    assert not failures.retries and not failures.waiting_letters
