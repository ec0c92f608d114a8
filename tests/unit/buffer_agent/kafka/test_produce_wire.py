"""produce_wire.read_answer: a broker's Produce answer read by hand, as kio read it before.

Every version the forwarder asks for is checked against kio's reader on the same bytes (kio
writes them, with every field set); then what kio could not read, or read at a cost: tagged
fields no version knows, error codes newer than kio's, counts beyond the bytes, truncations.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import tracemalloc
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from durable_producer.buffer_agent.forward.failure_policy import AnswerVerdict, judge
from durable_producer.buffer_agent.kafka.produce_wire import (
    HIGHEST_PRODUCE_VERSION,
    LOWEST_PRODUCE_VERSION,
    PartitionAnswer,
    read_answer,
)
from durable_producer.buffer_agent.kafka.protocol import (
    API_PRODUCE,
    MalformedFrame,
    decode_body,
    response_schema,
)
from durable_producer.buffer_agent.kafka.varint import encode_uvarint
from support.kafka_wire import CURRENT_LEADER, UNKNOWN_TAG, full_sample, produce_answer

VERSIONS = range(LOWEST_PRODUCE_VERSION, HIGHEST_PRODUCE_VERSION + 1)
START_MS = 1_700_000_000_000


def encoded(version: int, answer: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(response_schema(API_PRODUCE, version))(buffer, answer)
    return buffer.getvalue()


def as_kio_read_it(version: int, data: bytes) -> tuple[list[PartitionAnswer], int]:
    """What the forwarder took from kio's reading of ``data`` before ``read_answer``."""
    body = decode_body(API_PRODUCE, version, data)
    answers = [
        PartitionAnswer(
            str(topic.name),
            int(partition.index),
            int(partition.error_code),
            int(partition.base_offset),
            getattr(partition, "error_message", None),
        )
        for topic in body.responses
        for partition in topic.partition_responses
    ]
    return answers, int(body.throttle_time.total_seconds() * 1000)


def quiet(answer: Any) -> Any:
    """``answer`` with every partition taken as a broker answers a success: no record
    errors, no message, no current leader (the reader's short way)."""
    responses = []
    for topic in answer.responses:
        partitions = []
        for partition in topic.partition_responses:
            changes: dict[str, Any] = {"error_code": ErrorCode.none}
            names = {field.name for field in dataclasses.fields(partition)}
            if "record_errors" in names:
                changes.update(record_errors=(), error_message=None)
            if "current_leader" in names:
                changes["current_leader"] = type(partition.current_leader)()
            partitions.append(dataclasses.replace(partition, **changes))
        responses.append(dataclasses.replace(topic, partition_responses=tuple(partitions)))
    return dataclasses.replace(answer, responses=tuple(responses))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["full", "quiet"])
def test_an_answer_reads_as_kio_read_it(version: int, kind: str) -> None:
    """full: every field set (record errors, a message, tagged fields from v10: the long
    way); quiet: what a broker answers to a batch it took."""
    answer = full_sample(response_schema(API_PRODUCE, version))
    data = encoded(version, answer if kind == "full" else quiet(answer))

    answers, throttle_ms = read_answer(version, data, 4)

    assert (answers, throttle_ms) == as_kio_read_it(version, data)
    assert len(answers) == 4 and throttle_ms == 1500
    assert answers[0] == PartitionAnswer(
        "topic-a",
        3,
        3 if kind == "full" else 0,
        3,
        "topic-a" if kind == "full" and version >= 8 else None,
    )


def test_tagged_fields_are_skipped_known_or_not() -> None:
    """A broker adds a tagged field to an answer without a new version; Kafka's readers
    skip one they do not know, and the forwarder reads none it knows either."""
    plain = read_answer(11, produce_answer(b"\x00", b"\x00", b"\x00"), 1)
    inside = struct.pack(">ii", 2, 7) + b"\x01" + UNKNOWN_TAG  # a known one holding one
    tagged = produce_answer(
        b"\x03" + CURRENT_LEADER + UNKNOWN_TAG + b"\x01" + bytes([len(inside)]) + inside,
        b"\x01" + UNKNOWN_TAG,
        b"\x02" + UNKNOWN_TAG + b"\x64\x00",
    )
    assert read_answer(11, tagged, 1) == plain == ([PartitionAnswer("t", 0, 0, 5, None)], 0)


def test_an_error_code_newer_than_the_agent_is_an_unknown_server_error() -> None:
    """As Kafka's clients read it, and as the walk made it for kio; retried. (Kept as it
    came, each new code would be a label value of the agent's metrics.)"""
    data = produce_answer(b"\x00", b"\x00", b"\x00").replace(
        struct.pack(">ih", 0, 0), struct.pack(">ih", 0, 1234), 1
    )
    (answer,), _ = read_answer(9, data, 1)
    assert answer.error_code == -1
    assert judge(answer.error_code, head_of_line=True) is AnswerVerdict.RETRY


@pytest.mark.parametrize(
    ("version", "data"),
    [
        (9, b"\xff\xff\xff\xff\x0f\x00"),  # 2**32 - 2 topics, compact: kio asked for 34 GB
        (3, struct.pack(">i", 2**31 - 1)),  # legacy
        (9, b"\x02\x02t\xff\xff\xff\xff\x0f"),  # 2**32 - 2 partitions
        (8, b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01" + bytes(34) + b"\x7f\xff\xff\xff"),
        (11, b"\x01" + bytes(4) + b"\xff\xff\xff\xff\x0f"),  # 2**32 - 2 tagged fields
        (11, b"\x01" + bytes(4) + b"\x01\x00\x05\xff\xff\xff\xff\x0f"),  # endpoints: skipped
    ],
    ids=["topics", "legacy-topics", "partitions", "record-errors", "tags", "known-tag"],
)
def test_a_count_beyond_the_bytes_is_malformed(version: int, data: bytes) -> None:
    """Nothing is reserved from a count: the first element that does not fit ends it. The
    last answer is well formed: the endpoints it declares are never read."""
    if data.endswith(b"\x05\xff\xff\xff\xff\x0f"):
        assert read_answer(version, data, 1) == ([], 0)
        return
    with pytest.raises(MalformedFrame, match=r"ends|overruns|null"):
        read_answer(version, data, 2**40)  # the bytes end first, whatever the request


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_naming_more_than_the_request_is_malformed(version: int) -> None:
    """A broker answers each partition of a request once: the answer's size no longer bounds
    what reading it takes (a 256 MiB answer of empty topics held the loop for a minute)."""
    data = encoded(version, full_sample(response_schema(API_PRODUCE, version)))  # 2 x 2
    with pytest.raises(MalformedFrame, match="declares 2 partitions where the request leaves 1"):
        read_answer(version, data, 3)
    with pytest.raises(MalformedFrame, match="declares 2 topics where the request leaves 1"):
        read_answer(version, data, 1)


@pytest.mark.parametrize("version", [2, 12, 13])
def test_a_version_the_forwarder_does_not_ask_for_is_not_read(version: int) -> None:
    """v13 names topics by id: read as v11, its id would be taken for a name's length."""
    with pytest.raises(ValueError, match=f"Produce v{version} answers are not read here"):
        read_answer(version, produce_answer(b"\x00", b"\x00", b"\x00"), 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_malformed_and_bytes_after_the_answer_are_left(version: int) -> None:
    """Bytes after the answer are left, as Kafka's clients and kio left them."""
    data = encoded(version, full_sample(response_schema(API_PRODUCE, version)))
    for end in range(len(data)):
        with pytest.raises(MalformedFrame):
            read_answer(version, data[:end], 4)
    assert read_answer(version, data + b"\x00\x01", 4) == read_answer(version, data, 4)


def test_a_null_array_of_record_errors_is_malformed() -> None:
    """As Kafka's Java client reads it ("non-nullable field recordErrors was serialized as
    null"); kio read it as empty."""
    data = produce_answer(b"\x00", b"\x00", b"\x00").replace(b"\x01\x00\x00", b"\x00\x00\x00", 1)
    with pytest.raises(MalformedFrame, match="null array"):
        read_answer(9, data, 1)


def test_a_large_answer_takes_a_few_times_its_bytes() -> None:
    """About 150 bytes a partition (its PartitionAnswer and offsets): 4.4 times a v9 answer's
    bytes; kio's objects and their conversion took 10 times (tracemalloc)."""
    partitions = 50_000
    body = b"".join(
        struct.pack(">ihqqq", index, 0, 10**9 + 1000 * index, START_MS + index, 10**9)
        + b"\x01\x00\x00"
        for index in range(partitions)
    )
    data = b"\x02\x02t" + encode_uvarint(partitions + 1) + body + b"\x00" + bytes(4) + b"\x00"
    tracemalloc.start()
    try:
        answers, _ = read_answer(9, data, partitions)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(answers) == partitions and answers[-1].partition == partitions - 1
    assert answers[-1].base_offset == 10**9 + 1000 * (partitions - 1)
    assert peak < 6 * len(data), f"{peak / len(data):.1f} times the answer's bytes"
