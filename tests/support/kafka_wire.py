"""Kafka requests encoded independently of the agent's own response code (kio), for tests
and benchmarks that speak the protocol directly."""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import uuid
from typing import Any

from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_schema_field_type,
)

from durable_producer.buffer_agent.kafka.protocol import (
    API_PRODUCE,
    build,
    nested_schema,
    request_schema,
)


def encode_request_body(
    api_key: int, version: int, correlation_id: int, body: object, client_id: str = "raw-client"
) -> bytes:
    """Header + body of a request, without the size prefix (what the agent calls a frame)."""
    schema = request_schema(api_key, version)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_schema)(
        buffer,
        header_schema(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(schema)(buffer, body)
    return buffer.getvalue()


def encode_request(api_key: int, version: int, correlation_id: int, body: object) -> bytes:
    """A size-prefixed request, ready to send."""
    frame = encode_request_body(api_key, version, correlation_id, body)
    return struct.pack(">i", len(frame)) + frame


def produce_body(
    topic: str,
    partition: int,
    records: bytes,
    *,
    version: int = 9,
    acks: int = -1,
    transactional_id: str | None = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=5),
) -> object:
    """A Produce request body carrying ``records`` (one or more v2 batches) to one partition."""
    schema = request_schema(API_PRODUCE, version)
    topic_schema = nested_schema(schema, "TopicProduceData")
    partition_schema = nested_schema(schema, "PartitionProduceData")
    return build(
        schema,
        transactional_id=transactional_id,
        acks=acks,
        timeout=timeout,
        topic_data=(
            build(
                topic_schema,
                name=topic,
                partition_data=(build(partition_schema, index=partition, records=records),),
            ),
        ),
    )


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError(f"closed after {len(chunks)} of {size} bytes")
        chunks += chunk
    return bytes(chunks)


def exchange(port: int, frame: bytes) -> bytes:
    """Send one size-prefixed request to 127.0.0.1:``port``: the whole answer (its size
    prefix included), or b"" if the other side closes first or 5 s pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        try:
            size = recv_exactly(sock, 4)
            return size + recv_exactly(sock, struct.unpack(">i", size)[0])
        except (TimeoutError, ConnectionError):
            return b""


UNKNOWN_TAG = b"\x63\x03abc"
"""A tagged field no version of the answers the agent reads knows: tag 99, 3 bytes."""
CURRENT_LEADER = b"\x00\x09" + struct.pack(">ii", 2, 7) + b"\x00"
"""A tagged field Produce answers know from v10: a partition's current leader (tag 0)."""


def produce_answer(partition_tags: bytes, topic_tags: bytes, top_tags: bytes) -> bytes:
    """A flexible Produce answer's body: one topic "t", one partition (0, base offset 5, no
    record errors, no message), each level's tagged fields as given."""
    partition = struct.pack(">ihqqq", 0, 0, 5, -1, 0) + b"\x01\x00" + partition_tags
    return b"\x02\x02t\x02" + partition + topic_tags + struct.pack(">i", 0) + top_tags


_SAMPLES: dict[str, Any] = {
    "string": "topic-a",
    "bytes": b"\x01\x02",
    "records": b"\x01\x02\x03",
    "uuid": uuid.UUID(int=7),
    "bool": True,
    "timedelta_i32": datetime.timedelta(milliseconds=1500),
    "timedelta_i64": datetime.timedelta(milliseconds=1500),
    "datetime_i64": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
}


def full_sample(schema: type) -> Any:
    """An entity with every field set (tagged ones too, so they are written), and two
    elements in every array."""
    values = {}
    for field in dataclasses.fields(schema):
        kind = classify_field(field)
        if isinstance(kind, (EntityField, EntityTupleField)):
            one = full_sample(kind.type_)
        else:
            kafka_type = get_schema_field_type(field)
            one = _SAMPLES[kafka_type] if kafka_type in _SAMPLES else kind.type_(3)
        values[field.name] = (one, one) if kind.is_array else one
    return schema(**values)
