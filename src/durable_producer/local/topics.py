"""Client-side helpers for a local broker: create a topic, read a topic back in full."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

# The admin package re-exports NewTopic without listing it as public for type checkers.
from confluent_kafka.cimpl import NewTopic

from .process import poll_until


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    *,
    replication_factor: int | None = None,
    config: Mapping[str, str] | None = None,
    timeout: float = 15.0,
) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until metadata shows them.

    ``replication_factor`` defaults to the broker's ``default.replication.factor``; ``config``
    sets topic configs (``{"max.message.bytes": "2000"}``).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([new_topic])
    futures[topic].result(timeout=timeout)

    def visible() -> bool:
        metadata = admin.list_topics(topic, timeout=timeout)
        found = metadata.topics.get(topic)
        return found is not None and found.error is None and len(found.partitions) == partitions

    if not poll_until(visible, timeout=timeout, interval=0.1):
        raise TimeoutError(f"topic {topic} did not appear with {partitions} partitions")


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    timeout: float = 30.0,
    idle: float = 2.0,
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning of every partition.

    Stops at ``expected`` records, or once every partition's end offset (taken at the
    start) has been reached and nothing new arrived for ``idle`` seconds, or at ``timeout``.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"consume-all-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    records: list[ConsumedRecord] = []
    try:
        metadata = consumer.list_topics(topic, timeout=10.0)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(records) >= expected:
                break
            drained = expected is None and len(at_eof) == len(partitions)
            if drained and time.monotonic() - last_progress >= idle:
                break
            messages = consumer.consume(num_messages=10_000, timeout=0.2)
            for message in messages:
                # A consumed message (data or end-of-partition) always has both.
                partition, offset = cast(int, message.partition()), cast(int, message.offset())
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_eof.add(partition)
                        continue
                    raise RuntimeError(f"consume error: {error}")
                at_eof.discard(partition)
                last_progress = time.monotonic()
                _, timestamp = message.timestamp()
                headers = cast(list[tuple[str, bytes | None]], message.headers() or [])
                records.append(
                    ConsumedRecord(
                        partition=partition,
                        offset=offset,
                        key=message.key(),
                        value=message.value(),
                        headers=tuple(headers),
                        timestamp_ms=timestamp,
                    )
                )
    finally:
        consumer.close()
    return records
