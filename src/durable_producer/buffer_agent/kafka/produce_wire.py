"""Produce requests with record batches passed through untouched, and their responses.

The request is encoded by hand as a list of parts (the batches are not copied into it); the
response is decoded by kio. Versions 3 to ``HIGHEST_PRODUCE_VERSION`` (v13 names topics by id).
``produce`` sends one (acks=all) on a connection: the forwarder's and ``dead-letters resend``'s.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from durable_producer.buffer_agent.kafka.connection import BrokerConnection, decode_answer
from durable_producer.buffer_agent.kafka.protocol import API_PRODUCE
from durable_producer.buffer_agent.kafka.varint import encode_uvarint

LOWEST_PRODUCE_VERSION = 3  # record batch v2
HIGHEST_PRODUCE_VERSION = 11
_FIRST_FLEXIBLE = 9
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")

ANSWER_GRACE_S = 5.0
"""An answer is awaited this much longer than the broker is given: its own timeout first."""

BatchParts = Sequence[bytes | memoryview]
"""One record batch as parts that, joined, are its bytes."""
TopicBatches = Sequence[tuple[str, Sequence[tuple[int, BatchParts]]]]
"""Per topic, its partitions' batches (one a partition)."""


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    topic: str
    partition: int
    error_code: int
    base_offset: int
    error_message: str | None
    log_start_offset: int = -1


def encode_produce(
    version: int,
    acks: int,
    timeout_ms: int,
    topics: TopicBatches,
) -> list[bytes | memoryview]:
    """The request body: one batch per partition (Kafka refuses more), as parts."""
    flexible = version >= _FIRST_FLEXIBLE
    parts: list[bytes | memoryview] = []
    head = b"\x00" if flexible else _INT16.pack(-1)  # no transactional id
    head += _ACKS_TIMEOUT.pack(acks, timeout_ms)
    head += encode_uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics))
    for topic, partitions in topics:
        name = topic.encode()
        if flexible:
            head += encode_uvarint(len(name) + 1) + name + encode_uvarint(len(partitions) + 1)
        else:
            head += _INT16.pack(len(name)) + name + _INT32.pack(len(partitions))
        for partition, batch in partitions:
            size = sum(len(part) for part in batch)
            head += _INT32.pack(partition)
            head += encode_uvarint(size + 1) if flexible else _INT32.pack(size)
            parts.append(head)
            parts.extend(batch)
            head = b"\x00" if flexible else b""  # the partition's tagged fields
        if flexible:
            head += b"\x00"  # the topic's tagged fields
    if flexible:
        head += b"\x00"
    parts.append(head)
    return parts


def _answers(body: Any) -> tuple[list[PartitionAnswer], int]:
    """The partitions' answers and the throttle time in milliseconds."""
    answers = [
        PartitionAnswer(
            str(topic.name),
            int(partition.index),
            int(partition.error_code),
            int(partition.base_offset),
            getattr(partition, "error_message", None),
            int(getattr(partition, "log_start_offset", -1)),
        )
        for topic in body.responses
        for partition in topic.partition_responses
    ]
    return answers, int(body.throttle_time.total_seconds() * 1000)


def produce_version(connection: BrokerConnection) -> int:
    """The Produce version to use on ``connection``; ValueError if the broker has none."""
    return connection.version(API_PRODUCE, HIGHEST_PRODUCE_VERSION, LOWEST_PRODUCE_VERSION)


async def produce(
    connection: BrokerConnection, version: int, topics: TopicBatches, timeout_s: float
) -> tuple[list[PartitionAnswer], int]:
    """One Produce request (acks=all), the broker given ``timeout_s``: the partitions'
    answers and the throttle time in milliseconds. ``TimeoutError`` if no answer comes
    within ``ANSWER_GRACE_S`` more; ``BrokerUnreachable`` if the connection drops;
    ``UndecodableAnswer`` if the answer does not decode (all three OSErrors)."""
    body = encode_produce(version, -1, int(timeout_s * 1000), topics)
    request = connection.request(API_PRODUCE, version, body)
    data = await asyncio.wait_for(request, timeout_s + ANSWER_GRACE_S)
    return _answers(decode_answer(connection, API_PRODUCE, version, data))
