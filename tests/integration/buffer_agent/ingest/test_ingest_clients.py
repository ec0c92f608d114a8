"""Real Kafka clients produce through the agent; every record is read back from the WAL."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from kafka import KafkaProducer

from durable_producer.buffer_agent.ingest.config import IngestConfig
from support.ingest_harness import FakeCluster, RunningAgent, StoredRecord

pytestmark = pytest.mark.integration

TOPIC = "events"
PARTITIONS = 4
BASE_TIMESTAMP_MS = 1_700_000_000_000


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    with RunningAgent(tmp_path, FakeCluster({TOPIC: PARTITIONS, "other": 1})) as running:
        yield running


def expected_records(
    count: int, value_size: int = 50, *, null_headers: bool = True
) -> list[StoredRecord]:
    """Keys, null keys, null and empty values, headers (one null), explicit partitions.

    kafka-python refuses null header values and records with neither key nor value:
    ``null_headers=False`` avoids both.
    """
    records = []
    for index in range(count):
        value: bytes | None = os.urandom(value_size // 2).hex().encode()
        if index % 17 == 3:
            value = None
        elif index % 19 == 5:
            value = b""
        key = None if index % 5 == 0 and (null_headers or value is not None) else b"k%d" % index
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if index % 3 == 0:
            headers = (
                ("trace", b"t-%d" % index),
                ("empty", None if null_headers else b""),
                ("trace", b"dup"),
            )
        records.append(
            StoredRecord(
                topic=TOPIC if index % 7 else "other",
                partition=index % PARTITIONS if index % 7 else 0,
                key=key,
                value=value,
                headers=headers,
                timestamp_ms=BASE_TIMESTAMP_MS + index * 7 + 1,  # odd milliseconds on purpose
            )
        )
    return records


def produce_with_confluent(bootstrap: str, records: list[StoredRecord], **config: object) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    errors: list[object] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            errors.append(error)

    for record in records:
        producer.produce(
            record.topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=list(record.headers),
            timestamp=record.timestamp_ms,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []


def assert_stored_exactly(agent: RunningAgent, expected: list[StoredRecord]) -> None:
    stored = agent.records()
    assert len(stored) == len(expected)

    # per-partition order is preserved; compare partition by partition
    def by_partition(records: list[StoredRecord]) -> dict[tuple[str, int], list[StoredRecord]]:
        grouped: dict[tuple[str, int], list[StoredRecord]] = {}
        for record in records:
            grouped.setdefault((record.topic, record.partition), []).append(record)
        return grouped

    assert by_partition(stored) == by_partition(expected)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_confluent_producer_records_are_stored_byte_exact(
    agent: RunningAgent, compression: str, idempotent: bool
) -> None:
    expected = expected_records(300)
    produce_with_confluent(
        agent.bootstrap,
        expected,
        **{"compression.type": compression, "enable.idempotence": idempotent},
    )
    assert_stored_exactly(agent, expected)
    frames = agent.frames()
    assert all(frame.record_count > 0 for frame in frames)
    assert sum(frame.record_count for frame in frames) == len(expected)
    assert agent.server is not None and agent.server.stats.duplicate_batches == 0


def test_large_batches(agent: RunningAgent) -> None:
    records = [
        StoredRecord(TOPIC, index % 2, b"k", os.urandom(100_000), (), BASE_TIMESTAMP_MS + index)
        for index in range(30)
    ]
    produce_with_confluent(
        agent.bootstrap,
        records,
        **{"batch.size": 1_000_000, "linger.ms": 50, "enable.idempotence": True},
    )
    assert_stored_exactly(agent, records)
    assert max(len(frame.payload) for frame in agent.frames()) > 300_000


def test_acks_zero_is_still_appended(agent: RunningAgent) -> None:
    records = expected_records(50)
    producer = Producer({"bootstrap.servers": agent.bootstrap, "acks": 0, "linger.ms": 5})
    for record in records:
        producer.produce(
            record.topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=list(record.headers),
            timestamp=record.timestamp_ms,
        )
    assert producer.flush(10) == 0
    deadline = time.monotonic() + 10
    while len(agent.records()) < len(records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_stored_exactly(agent, records)


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_producer_records_are_stored_byte_exact(
    agent: RunningAgent, compression: str | None
) -> None:
    expected = expected_records(200, null_headers=False)
    producer = KafkaProducer(
        bootstrap_servers=agent.bootstrap,
        enable_idempotence=True,
        compression_type=compression,
        linger_ms=5,
    )
    try:
        futures = [
            producer.send(
                record.topic,
                value=record.value,
                key=record.key,
                partition=record.partition,
                headers=list(record.headers),
                timestamp_ms=record.timestamp_ms,
            )
            for record in expected
        ]
        for future in futures:
            future.get(timeout=20)
    finally:
        producer.close(timeout=5)
    assert_stored_exactly(agent, expected)


def test_partition_counts_come_from_the_cluster(agent: RunningAgent) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap})
    metadata = producer.list_topics(TOPIC, timeout=10)
    topic = metadata.topics[TOPIC]
    assert topic.error is None
    assert sorted(topic.partitions) == list(range(PARTITIONS))
    assert {p.leader for p in topic.partitions.values()} == {0}
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [
        ("127.0.0.1", agent.server.port if agent.server else 0)
    ]
    missing = producer.list_topics("no-such-topic", timeout=10).topics["no-such-topic"]
    assert missing.error is not None and missing.error.name() == "TOPIC_AUTHORIZATION_FAILED"


def test_unknown_topic_during_outage_is_retriable_then_served(tmp_path: Path) -> None:
    cluster = FakeCluster({"late": 2}, reachable=False)
    with RunningAgent(tmp_path, cluster) as agent:
        producer = Producer({"bootstrap.servers": agent.bootstrap, "message.timeout.ms": 60_000})
        first = producer.list_topics("late", timeout=10).topics["late"]
        assert first.error is not None and first.error.name() == "LEADER_NOT_AVAILABLE"
        outcomes: list[object] = []
        producer.produce(
            "late", value=b"held", partition=1, on_delivery=lambda e, _m: outcomes.append(e)
        )
        assert producer.flush(1.0) == 1  # held by the client, not failed
        cluster.reachable = True
        assert producer.flush(20) == 0
        assert outcomes == [None]
        assert [(r.topic, r.partition, r.value) for r in agent.records()] == [("late", 1, b"held")]


def test_default_partition_count_during_outage(tmp_path: Path) -> None:
    with RunningAgent(tmp_path, FakeCluster(reachable=False), default_partitions=3) as agent:
        expected = [StoredRecord("fresh", 2, b"k", b"v", (), BASE_TIMESTAMP_MS)]
        produce_with_confluent(agent.bootstrap, expected)
        assert_stored_exactly(agent, expected)


def test_transactional_producer_is_refused_with_a_clear_error(agent: RunningAgent) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "transactional.id": "tx-1"})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(10)
    assert "authorization" in str(raised.value).lower()
    assert agent.server is not None
    assert agent.server.stats.refusals["find_coordinator"] >= 1
    assert agent.records() == []


def test_batch_over_the_size_limit_is_message_too_large(tmp_path: Path) -> None:
    with RunningAgent(
        tmp_path, FakeCluster({TOPIC: 1}), ingest=IngestConfig(max_batch_bytes=10_000)
    ) as agent:
        producer = Producer(
            {"bootstrap.servers": agent.bootstrap, "linger.ms": 20, "message.max.bytes": 100_000}
        )
        errors: list[str] = []
        producer.produce(
            TOPIC,
            value=os.urandom(50_000),
            partition=0,
            on_delivery=lambda error, _m: errors.append(error.name() if error else "ok"),
        )
        producer.flush(10)
        assert errors == ["MSG_SIZE_TOO_LARGE"]
        assert agent.records() == []
