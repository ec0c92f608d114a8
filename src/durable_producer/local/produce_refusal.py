"""The answer a broker gives to a Produce request whose record batch is over its
``max.message.bytes``: MESSAGE_TOO_LARGE. The fault proxy stands in for that broker limit
(tansu does not enforce it)."""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from durable_producer.buffer_agent.kafka.protocol import (
    API_PRODUCE,
    build,
    encode_response,
    nested_schema,
    request_schema,
    response_schema,
)

_SIZE = struct.Struct(">i")


def produce_refusal(
    frame: bytes, api_version: int, correlation_id: int, limit: int | None
) -> tuple[bytes | None, int]:
    """``(response refusing the request or None, acks)`` for a size-prefixed Produce request.

    ``None`` when ``limit`` is ``None`` or every partition's record batch fits. Otherwise
    every partition of the request gets an error: MESSAGE_TOO_LARGE where its batch is over
    ``limit``, REQUEST_TIMED_OUT for the others (librdkafka sends one partition per request).
    """
    request_type: Any = request_schema(API_PRODUCE, api_version)
    _header, header_size = entity_reader(request_type.__header_schema__)(frame, _SIZE.size)
    request, _ = entity_reader(request_type)(frame, _SIZE.size + header_size)
    acks = int(request.acks)
    if limit is None or all(
        len(partition.records or b"") <= limit
        for topic in request.topic_data
        for partition in topic.partition_data
    ):
        return None, acks
    schema = response_schema(API_PRODUCE, api_version)
    topics = []
    for topic in request.topic_data:
        partitions = tuple(
            build(
                nested_schema(schema, "PartitionProduceResponse"),
                index=partition.index,
                error_code=ErrorCode.message_too_large
                if len(partition.records or b"") > limit
                else ErrorCode.request_timed_out,
                base_offset=-1,
                log_append_time=None,
                log_start_offset=-1,
                record_errors=(),
                error_message=f"record batch larger than max.message.bytes={limit}",
            )
            for partition in topic.partition_data
        )
        identity = {
            name: getattr(topic, name) for name in ("name", "topic_id") if hasattr(topic, name)
        }
        topics.append(
            build(
                nested_schema(schema, "TopicProduceResponse"),
                **identity,
                partition_responses=partitions,
            )
        )
    response = build(schema, responses=tuple(topics))
    return encode_response(correlation_id, response), acks
