"""Read a partition's record batches as stored, with producer ids and sequence numbers.

A consumer sees records; this sees the batches a broker wrote, so a test can tell what the
*broker* accepted. librdkafka's mock cluster checks sequence numbers only for transactional
producers: it writes an idempotent producer's batch that arrives after a gap in its
sequence (a real broker answers OUT_OF_ORDER_SEQUENCE_NUMBER), and librdkafka then counts
the records of the gap as delivered ("implicitly acked by subsequent batch success"); it also
writes a retried batch a second time (a real broker answers DUPLICATE_SEQUENCE_NUMBER).
``sequence_anomalies`` finds both in what was stored.
"""

from __future__ import annotations

import datetime
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient
from kafka.record.default_records import DefaultRecordBatch
from kio.serial import entity_reader

from durable_producer.buffer_agent.kafka.protocol import (
    build,
    nested_schema,
    request_schema,
    response_schema,
)
from durable_producer.buffer_agent.kafka.record_batch import (
    BatchHeader,
    iter_batches,
    parse_batch_header,
)
from durable_producer.buffer_agent.kafka.record_decode import iter_decoded

from .kafka_wire import encode_request, recv_exactly

API_FETCH = 1
FETCH_VERSION = 4


@dataclass(frozen=True)
class StoredBatch:
    offset: int
    header: BatchHeader
    keys: tuple[bytes | None, ...]


def _leader_address(bootstrap: str, topic: str, partition: int) -> tuple[str, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    leader = metadata.topics[topic].partitions[partition].leader
    broker = metadata.brokers[leader]
    return broker.host, broker.port


def _fetch_once(sock: socket.socket, topic: str, partition: int, offset: int) -> tuple[bytes, int]:
    schema = request_schema(API_FETCH, FETCH_VERSION)
    body = build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=8 * 1024 * 1024,
        isolation_level=0,
        topics=(
            build(
                nested_schema(schema, "FetchTopic"),
                topic=topic,
                partitions=(
                    build(
                        nested_schema(schema, "FetchPartition"),
                        partition=partition,
                        fetch_offset=offset,
                        partition_max_bytes=8 * 1024 * 1024,
                    ),
                ),
            ),
        ),
    )
    sock.sendall(encode_request(API_FETCH, FETCH_VERSION, offset & 0x7FFFFFFF, body))
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    frame = recv_exactly(sock, size)
    response = response_schema(API_FETCH, FETCH_VERSION)
    _, header_size = entity_reader(response.__header_schema__)(frame, 0)
    decoded, _ = entity_reader(response)(frame, header_size)
    data = decoded.responses[0].partitions[0]
    if data.error_code.value:
        raise RuntimeError(f"fetch {topic}/{partition} at {offset}: error {data.error_code}")
    return bytes(data.records or b""), int(data.high_watermark)


def high_watermark(address: str, topic: str, partition: int) -> int:
    """The partition's high watermark, asked of the broker at ``address`` itself (no metadata
    first: the address may bypass the proxy the broker advertises)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        return _fetch_once(sock, topic, partition, 0)[1]


def raw_batches(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """Every batch of the partition as the broker stores it, from its log start to its high
    watermark (the bytes a consumer's fetch returns)."""
    host, port = _leader_address(bootstrap, topic, partition)
    batches: list[bytes] = []
    offset = 0
    with socket.create_connection((host, port), timeout=10) as sock:
        while True:
            records, high = _fetch_once(sock, topic, partition, offset)
            if not records:
                if offset >= high:
                    return batches
                raise RuntimeError(f"no records at {offset} below the high watermark {high}")
            for header, batch in iter_batches(records, check_crc=False):
                if header.base_offset >= offset:
                    batches.append(bytes(batch))
                    offset = header.base_offset + header.last_offset_delta + 1
            if offset >= high:
                return batches


def stored_batches(bootstrap: str, topic: str, partition: int) -> list[StoredBatch]:
    """Every batch of the partition, with its header and keys."""
    stored = []
    for batch in raw_batches(bootstrap, topic, partition):
        header = parse_batch_header(batch)
        keys = tuple(record.key for decoded in iter_decoded(batch) for record in decoded.records)
        stored.append(StoredBatch(header.base_offset, header, keys))
    return stored


@dataclass(frozen=True)
class SequenceAnomalies:
    """What the mock accepted that a real broker refuses, per producer id and epoch."""

    gap_records: int
    """Sequence numbers never stored below a stored one: records their producer was told
    were delivered (implicitly, by a later batch's success) and that were never written."""
    rewritten_records: int
    """Records of batches written again although their sequences were already stored."""
    reordered_batches: int = 0
    """Batches stored ahead of a sequence gap (filled later or never)."""

    def __add__(self, other: SequenceAnomalies) -> SequenceAnomalies:
        return SequenceAnomalies(
            self.gap_records + other.gap_records,
            self.rewritten_records + other.rewritten_records,
            self.reordered_batches + other.reordered_batches,
        )


def _by_producer(batches: list[StoredBatch]) -> Iterator[list[StoredBatch]]:
    groups: dict[tuple[int, int], list[StoredBatch]] = {}
    for batch in batches:
        if batch.header.is_idempotent:
            key = (batch.header.producer_id, batch.header.producer_epoch)
            groups.setdefault(key, []).append(batch)
    yield from groups.values()


def sequence_anomalies(batches: list[StoredBatch]) -> SequenceAnomalies:
    """Every producer id and epoch starts its sequences at 0 and a broker stores each
    sequence number once, in order; what the log shows otherwise."""
    gaps = rewritten = reordered = 0
    for group in _by_producer(batches):
        stored: set[int] = set()
        contiguous = 0  # the lowest sequence number not stored
        for batch in group:
            base, count = batch.header.base_sequence, batch.header.record_count
            sequences = set(range(base, base + count))
            if base > contiguous:
                reordered += 1
            rewritten += len(sequences & stored)
            stored |= sequences
            while contiguous in stored:
                contiguous += 1
        gaps += max(stored) + 1 - len(stored)
    return SequenceAnomalies(gaps, rewritten, reordered)


StoredRecord = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int, int]
"""key, value, headers, timestamp, timestamp type (0 CreateTime, 1 LogAppendTime)."""


def stored_records(bootstrap: str, topic: str, partition: int) -> list[StoredRecord]:
    """Every record of the partition as the broker stores it, decoded by kafka-python's record
    reader (not the agent's code, and not librdkafka, whose header names end at a NUL byte)."""
    host, port = _leader_address(bootstrap, topic, partition)
    found: list[StoredRecord] = []
    offset = 0
    with socket.create_connection((host, port), timeout=10) as sock:
        while True:
            records, high = _fetch_once(sock, topic, partition, offset)
            if not records:
                if offset >= high:
                    return found
                raise RuntimeError(f"no records at {offset} below the high watermark {high}")
            for header, batch in iter_batches(records, check_crc=False):
                if header.base_offset < offset:
                    continue
                reader = DefaultRecordBatch(bytes(batch))
                found.extend(
                    (r.key, r.value, tuple(r.headers), r.timestamp, reader.timestamp_type)
                    for r in reader
                )
                offset = header.base_offset + header.last_offset_delta + 1
            if offset >= high:
                return found
