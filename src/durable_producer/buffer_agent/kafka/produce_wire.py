"""Produce requests with record batches passed through untouched, and their responses.

The request is encoded by hand as a list of parts (the batches are not copied into it); the
answer is read by hand too (``read_answer``), as ``protocol.parse_produce`` reads requests: only
what the forwarder uses is kept. Versions 3 to ``HIGHEST_PRODUCE_VERSION`` (v13 names topics by
id). ``produce`` sends one (acks=all) on a connection: the forwarder's and ``dead-letters
resend``'s.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from durable_producer.buffer_agent.kafka.connection import BrokerConnection, decode_answer
from durable_producer.buffer_agent.kafka.protocol import API_PRODUCE, MalformedFrame, WireCursor
from durable_producer.buffer_agent.kafka.varint import encode_uvarint
from durable_producer.buffer_agent.kafka.wire_bounds import KNOWN_ERROR_CODES

LOWEST_PRODUCE_VERSION = 3  # record batch v2
HIGHEST_PRODUCE_VERSION = 11
_FIRST_FLEXIBLE = 9
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
MAX_TIMEOUT_MS = 2**31 - 1
"""A Produce request's timeout is a 32-bit count of milliseconds (about 24.8 days): the most
``--request-timeout`` may ask, and the most any client's request can wait (``--block-timeout``)."""
_PARTITION_V3 = struct.Struct(">ihq8x")
"""A partition's answer up to v4: index, error code, base offset (its log append time skipped)."""
_PARTITION_V5 = struct.Struct(">ihq16x")
"""From v5: the same, its log start offset skipped too."""
_FIRST_DETAILED = 8
"""From v8 a partition's answer ends with its record errors and an error message."""
_QUIET = b"\x00\x00\x00\x00\xff\xff"
"""v8: no record errors, no message."""
_QUIET_FLEXIBLE = b"\x01\x00\x00"
"""v9 on: no record errors, no message, no tagged fields."""

ANSWER_GRACE_S = 5.0
"""An answer is awaited this much longer than the broker is given: its own timeout first."""

BatchParts = Sequence[bytes | memoryview]
"""One record batch as parts that, joined, are its bytes."""
TopicBatches = Sequence[tuple[str, Sequence[tuple[int, BatchParts]]]]
"""Per topic, its partitions' batches (one a partition)."""


@dataclass(slots=True)
class PartitionAnswer:
    """One partition's answer, as the forwarder uses it (not frozen: made 4x faster)."""

    topic: str
    partition: int
    error_code: int
    base_offset: int
    error_message: str | None


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


def read_answer(version: int, data: bytes, partitions: int) -> tuple[list[PartitionAnswer], int]:
    """A Produce answer's body: the partitions' answers and the throttle time in milliseconds,
    to a request of ``partitions`` partitions (a broker answers each once: an answer naming
    more is malformed, so what it takes to read is bounded by the request, not only by the
    answer's bytes).

    Read by hand, not by kio, which made objects of about 4 times an answer's bytes and had to
    be walked first lest a declared count make it reserve gigabytes (``wire_bounds``): nothing
    is reserved here, a count beyond the bytes fails at the first element that does not fit
    (MalformedFrame). Record errors (the batch is refused whole) and tagged fields, known
    (``current_leader``, ``node_endpoints``: the forwarder refreshes its metadata instead) or
    not, are skipped by their size, as Kafka's clients skip unknown ones. An error code newer
    than kio's is UNKNOWN_SERVER_ERROR (-1), as Kafka's clients read it.
    """
    if not LOWEST_PRODUCE_VERSION <= version <= HIGHEST_PRODUCE_VERSION:
        raise ValueError(f"Produce v{version} answers are not read here")
    cursor = WireCursor(memoryview(data), 0)
    flexible = version >= _FIRST_FLEXIBLE
    fixed = _PARTITION_V5 if version >= 5 else _PARTITION_V3
    detailed = version >= _FIRST_DETAILED
    quiet = _QUIET_FLEXIBLE if flexible else _QUIET
    unpack, size, end = fixed.unpack_from, fixed.size, len(data)
    answers: list[PartitionAnswer] = []
    for _ in range(_at_most(cursor.array_length(flexible), partitions, "topics")):
        topic = cursor.string(flexible)
        left = partitions - len(answers)
        for _ in range(_at_most(cursor.array_length(flexible), left, "partitions")):
            pos = cursor.pos
            if pos + size > end:
                raise MalformedFrame(f"the Produce answer ends inside a partition at byte {pos}")
            partition, code, base_offset = unpack(data, pos)
            if code not in KNOWN_ERROR_CODES:
                code = -1
            cursor.pos = pos = pos + size
            message = None
            if detailed:
                if data.startswith(quiet, pos):
                    cursor.pos = pos + len(quiet)
                else:
                    message = _details(cursor, flexible)
            answers.append(PartitionAnswer(topic, partition, code, base_offset, message))
        if flexible:
            cursor.skip_tagged_fields()
    (throttle_ms,) = cursor.unpack(_INT32)
    if flexible:
        cursor.skip_tagged_fields()
    return answers, throttle_ms  # bytes after it are left, as Kafka's clients and kio leave them


def _at_most(count: int, most: int, what: str) -> int:
    if count > most:
        raise MalformedFrame(
            f"the Produce answer declares {count} {what} where the request leaves {most}"
        )
    return count


def _details(cursor: WireCursor, flexible: bool) -> str | None:
    """A partition answer's record errors (skipped), its error message and tagged fields."""
    for _ in range(cursor.array_length(flexible)):
        cursor.unpack(_INT32)  # the record's index
        cursor.nullable_string(flexible)
        if flexible:
            cursor.skip_tagged_fields()
    message = cursor.nullable_string(flexible)
    if flexible:
        cursor.skip_tagged_fields()
    return message


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
    partitions = sum(len(batches) for _, batches in topics)
    answer: tuple[list[PartitionAnswer], int] = decode_answer(
        connection, API_PRODUCE, version, data, lambda v, d: read_answer(v, d, partitions)
    )
    return answer
