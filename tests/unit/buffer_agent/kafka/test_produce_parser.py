"""The hand-written Produce request parser agrees with kio on every version, copies nothing,
and turns any truncation or corruption into MalformedFrame."""

from __future__ import annotations

import contextlib
import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from durable_producer.buffer_agent.kafka.protocol import (
    API_PRODUCE,
    MalformedFrame,
    build,
    nested_schema,
    parse_produce,
    parse_request,
    request_schema,
)
from support.kafka_wire import encode_request_body

VERSIONS = range(3, 10)

partitions = st.lists(
    st.tuples(st.integers(0, 2**31 - 1), st.none() | st.binary(max_size=300)), max_size=4
)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=20), partitions), max_size=4)


def produce_frame(
    version: int, transactional_id: str | None, acks: int, topic_list: list, client_id: str
) -> bytes:
    schema = request_schema(API_PRODUCE, version)
    topic_schema = nested_schema(schema, "TopicProduceData")
    partition_schema = nested_schema(schema, "PartitionProduceData")
    body = build(
        schema,
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=1234),
        topic_data=tuple(
            build(
                topic_schema,
                name=name,
                partition_data=tuple(
                    build(partition_schema, index=index, records=records)
                    for index, records in partition_list
                ),
            )
            for name, partition_list in topic_list
        ),
    )
    return encode_request_body(API_PRODUCE, version, 77, body, client_id=client_id)


def kio_parse(frame: bytes, version: int) -> tuple[object, object]:
    schema = request_schema(API_PRODUCE, version)
    header, header_size = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, header_size)
    return header, body


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    transactional_id=st.none() | st.text(max_size=10),
    acks=st.sampled_from([-1, 0, 1]),
    topic_list=topics,
    client_id=st.text(max_size=15),
)
def test_agrees_with_kio(
    version: int, transactional_id: str | None, acks: int, topic_list: list, client_id: str
) -> None:
    frame = produce_frame(version, transactional_id, acks, topic_list, client_id)
    request = parse_produce(frame)
    header, expected = kio_parse(frame, version)
    assert (request.api_key, request.api_version, request.correlation_id) == (0, version, 77)
    assert request.client_id == header.client_id
    body = request.body
    assert (body.transactional_id, body.acks) == (expected.transactional_id, expected.acks)
    assert body.timeout_ms == 1234
    assert [
        (
            t.name,
            [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data],
        )
        for t in body.topic_data
    ] == [(t.name, [(p.index, p.records) for p in t.partition_data]) for t in expected.topic_data]


def test_record_batches_are_read_only_views_of_the_frame() -> None:
    frame = bytearray(produce_frame(9, None, -1, [("t", [(0, b"batch-bytes")])], "c"))
    records = parse_request(memoryview(frame)).body.topic_data[0].partition_data[0].records
    assert records is not None and records.readonly
    position = bytes(frame).index(b"batch-bytes")
    frame[position] = ord("B")
    assert bytes(records) == b"Batch-bytes"  # the same memory, not a copy


def test_unknown_tagged_fields_are_skipped() -> None:
    frame = produce_frame(9, None, -1, [("t", [(3, b"xyz")])], "cid")
    header_end = 8 + 2 + len("cid")
    assert frame[header_end] == 0  # the header's empty tag buffer
    tagged = frame[:header_end] + b"\x01\x05\x03abc" + frame[header_end + 1 :]
    body = parse_produce(tagged).body
    assert [(p.index, bytes(p.records)) for p in body.topic_data[0].partition_data] == [(3, b"xyz")]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_malformed(version: int) -> None:
    frame = produce_frame(version, "tx", -1, [("topic", [(1, b"r" * 40), (2, None)])], "id")
    for end in range(8, len(frame)):
        with pytest.raises(MalformedFrame):
            parse_produce(frame[:end])
    with pytest.raises(MalformedFrame, match="trailing"):
        parse_produce(frame + b"\x00")


@pytest.mark.parametrize(
    ("version", "patch", "match"),
    [
        (8, lambda f: f[:-8] + struct.pack(">i", 10**6) + f[-4:], "overruns"),
        (8, lambda f: f[:-8] + struct.pack(">i", -2) + f[-4:], "overruns"),
        (8, lambda f: f[:10] + struct.pack(">h", -7) + f[12:], "overruns"),
        (9, lambda f: f[:-1] + b"\xff", "varint|overruns"),
    ],
)
def test_corrupt_lengths_are_malformed(version: int, patch, match: str) -> None:
    frame = produce_frame(version, None, -1, [("t", [(0, b"abcd")])], "")
    with pytest.raises(MalformedFrame, match=match):
        parse_produce(patch(frame))


@settings(max_examples=300, deadline=None)
@given(noise=st.binary(max_size=200), version=st.sampled_from(VERSIONS))
def test_random_bodies_never_raise_anything_but_malformed(noise: bytes, version: int) -> None:
    frame = struct.pack(">hhi", API_PRODUCE, version, 1) + noise
    with contextlib.suppress(MalformedFrame):
        parse_produce(frame)
