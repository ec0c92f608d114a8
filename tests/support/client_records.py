"""Records a Kafka client sends in the client-compatibility tests, and the check that Kafka holds
exactly them: the same for every client (the Java client, aiokafka...), so the clients are held
to one standard.

``sample_records`` covers what clients may send: keys null, empty and binary; values null, empty,
binary and one of 300 KB; headers with repeated names, null and empty values and a non-ASCII
name; explicit partitions and timestamps (odd milliseconds) on some records, the client's choice
on the others. ``assert_topic_holds_exactly`` reads the topic back and compares byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka.partitioner.default import murmur2

from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)
from durable_producer.local.topics import ConsumedRecord, consume_all

# A client's codec name -> the batch attribute's compression bits, for every client test.
CODECS = {
    "none": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}

SAMPLE_PARTITIONS = 4
SAMPLE_RECORDS = 400
BASE_TIMESTAMP_MS = 1_700_000_000_000
KEEP_OLD_TIMESTAMPS = {"retention.ms": "-1"}
"""Topic config for the sample: its timestamps are from 2023 on purpose, and time-based retention
would delete them at the broker's next retention check."""


@dataclass(frozen=True, slots=True)
class ClientRecord:
    """One record to send: ``partition``/``timestamp_ms`` None leave them to the client."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the client reported for one record (its delivery callback or future)."""

    partition: int | None
    offset: int | None
    timestamp_ms: int | None
    error: str | None


def java_partition(key: bytes, partitions: int) -> int:
    """The Java producer's partition of a keyed record (``BuiltInPartitioner``: murmur2)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def sample_records(topic: str, count: int = SAMPLE_RECORDS) -> list[ClientRecord]:
    """The same ``count`` records every call (see the module docstring)."""
    rng = random.Random(25)
    records = []
    for index in range(count):
        key: bytes | None = rng.randbytes(rng.randrange(1, 30))
        if index % 5 == 0:
            key = None
        elif index % 11 == 0:
            key = b""
        value: bytes | None = (b"value-%d-" % index) * rng.randrange(1, 20) + rng.randbytes(8)
        if index % 17 == 3:
            value = None
        elif index % 19 == 5:
            value = b""
        elif index == 50:
            value = rng.randbytes(300_000)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if index % 3 == 0:
            headers = (
                ("trace", b"t-%d" % index),
                ("empty", None),
                ("trace", b"dup"),
                ("ключ", b""),
            )
        elif index % 3 == 2:
            headers = (("only", rng.randbytes(5)),)
        records.append(
            ClientRecord(
                topic,
                key,
                value,
                headers,
                partition=index % SAMPLE_PARTITIONS if index % 7 == 0 else None,
                timestamp_ms=None if index % 13 == 0 else BASE_TIMESTAMP_MS + index * 7 + 1,
            )
        )
    return records


def content(record: ClientRecord | ConsumedRecord) -> tuple[Any, ...]:
    """What must arrive byte for byte: key, value and headers (in order)."""
    return (record.key, record.value, record.headers)


def assert_topic_holds_exactly(
    bootstrap: str,
    topic: str,
    sent: Sequence[ClientRecord],
    outcomes: Sequence[Outcome],
    partitions: int = SAMPLE_PARTITIONS,
    client_clock: tuple[int, int] | None = None,
) -> list[ConsumedRecord]:
    """Kafka holds every sent record once, byte for byte, in send order within the partition
    the client reported (keyed records where the Java producer puts them), with the timestamp
    the client gave it; returns what it holds.

    An outcome's ``timestamp_ms`` None means the client stamped the record itself and did not
    report the stamp reliably: the stored timestamp must then lie in ``client_clock``
    (milliseconds, from before the first send to after the last answer)."""
    assert [outcome.error for outcome in outcomes if outcome.error is not None] == []
    stored = consume_all(bootstrap, topic, expected=len(sent), timeout=60)
    assert len(stored) == len(sent)
    for record, outcome in zip(sent, outcomes, strict=True):
        assert outcome.partition is not None
        if record.partition is not None:
            assert outcome.partition == record.partition
        elif record.key is not None:
            assert outcome.partition == java_partition(record.key, partitions)
        if record.timestamp_ms is not None:
            assert outcome.timestamp_ms == record.timestamp_ms
        elif outcome.timestamp_ms is None:
            assert client_clock is not None, "the client reported no timestamp"
    for partition in range(partitions):
        expected = [
            (*content(record), outcome.timestamp_ms)
            for record, outcome in zip(sent, outcomes, strict=True)
            if outcome.partition == partition
        ]
        found = [
            (*content(record), record.timestamp_ms)
            for record in sorted(stored, key=lambda r: r.offset)
            if record.partition == partition
        ]
        if client_clock is not None:
            earliest, latest = client_clock
            found = [
                (*got[:3], None)
                if want[3] is None and got[3] is not None and earliest <= got[3] <= latest
                else got
                for got, want in zip(found, expected, strict=False)
            ] + found[len(expected) :]
        assert found == expected, f"partition {partition} differs from what the client sent"
    return stored
