"""kafka_protocol: framing, header versions and response encoding through kio."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.kafka import protocol
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_METADATA,
    API_PRODUCE,
    SUPPORTED_API_VERSIONS,
    MalformedFrame,
    PartitionResult,
    UnsupportedRequest,
    build,
    encode_produce_response,
    encode_response,
    nested_schema,
    parse_request,
    request_schema,
    response_schema,
)
from support.kafka_wire import encode_request_body


def metadata_request(version: int, topics: list[str]) -> object:
    schema = request_schema(API_METADATA, version)
    topic_schema = nested_schema(schema, "MetadataRequestTopic")
    return build(
        schema,
        topics=tuple(build(topic_schema, name=name, topic_id=None) for name in topics),
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@pytest.mark.parametrize("version", [0, 1, 8, 9, 12])
def test_metadata_request_round_trip_across_header_versions(version: int) -> None:
    frame = encode_request_body(API_METADATA, version, 4242, metadata_request(version, ["a", "b"]))
    request = parse_request(frame)
    assert (request.api_key, request.api_version, request.correlation_id) == (3, version, 4242)
    assert request.client_id == "raw-client"
    assert [topic.name for topic in request.body.topics] == ["a", "b"]


def test_unsupported_version_is_reported_with_its_correlation_id() -> None:
    frame = struct.pack(">hhi", API_PRODUCE, 2, 99) + b"\x00\x00"
    with pytest.raises(UnsupportedRequest) as raised:
        parse_request(frame)
    assert (raised.value.api_key, raised.value.api_version) == (API_PRODUCE, 2)
    assert raised.value.correlation_id == 99


def test_unknown_api_key_is_unsupported() -> None:
    with pytest.raises(UnsupportedRequest):
        parse_request(struct.pack(">hhi", 9999, 0, 1))


def test_truncated_body_is_malformed() -> None:
    frame = encode_request_body(API_METADATA, 9, 1, metadata_request(9, ["topic"]))
    with pytest.raises(MalformedFrame):
        parse_request(frame[:-4])


def test_trailing_bytes_are_malformed() -> None:
    frame = encode_request_body(API_METADATA, 1, 1, metadata_request(1, ["topic"]))
    with pytest.raises(MalformedFrame, match="trailing"):
        parse_request(frame + b"xx")


def test_short_frame_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        parse_request(b"\x00\x03")


def api_versions_response(version: int) -> object:
    schema = response_schema(API_API_VERSIONS, version)
    entry = nested_schema(schema, "ApiVersion")
    return build(
        schema,
        error_code=ErrorCode.none,
        api_keys=(build(entry, api_key=0, min_version=3, max_version=9),),
        throttle_time=datetime.timedelta(0),
    )


def test_api_versions_v3_response_uses_header_v0() -> None:
    data = encode_response(7, api_versions_response(3))
    size, correlation_id, error_code = struct.unpack_from(">iih", data)
    assert size == len(data) - 4
    assert correlation_id == 7
    assert error_code == 0  # no tagged-field byte between correlation id and body


def test_flexible_response_uses_header_v1() -> None:
    schema = response_schema(API_METADATA, 12)
    data = encode_response(
        11,
        build(
            schema,
            throttle_time=datetime.timedelta(0),
            brokers=(),
            topics=(),
            cluster_id=None,
            controller_id=0,
        ),
    )
    size, correlation_id, header_tags = struct.unpack_from(">iib", data)
    assert (size, correlation_id, header_tags) == (len(data) - 4, 11, 0)


def test_supported_versions_all_have_kio_schemas() -> None:
    for api_key, (low, high) in SUPPORTED_API_VERSIONS.items():
        for version in range(low, high + 1):
            assert request_schema(api_key, version).__version__ == version
            assert response_schema(api_key, version).__version__ == version


@pytest.mark.parametrize("version", range(3, 10))
def test_hand_encoded_produce_response_matches_kio(version: int) -> None:
    results = [
        ("orders", [PartitionResult(0, 0, 42), PartitionResult(3, 10, -1, "too large: é")]),
        ("audit", [PartitionResult(1, 19, -1, None)]),
    ]
    schema = response_schema(API_PRODUCE, version)
    topic_schema = nested_schema(schema, "TopicProduceResponse")
    partition_schema = nested_schema(schema, "PartitionProduceResponse")
    response = build(
        schema,
        responses=tuple(
            build(
                topic_schema,
                name=name,
                partition_responses=tuple(
                    build(
                        partition_schema,
                        index=p.index,
                        error_code=ErrorCode(p.error_code),
                        base_offset=p.base_offset,
                        log_append_time=None,
                        log_start_offset=-1,
                        record_errors=(),
                        error_message=p.error_message,
                    )
                    for p in partitions
                ),
            )
            for name, partitions in results
        ),
        throttle_time=datetime.timedelta(0),
    )
    assert encode_produce_response(77, version, results) == encode_response(77, response)


def test_a_panic_of_kios_native_reader_is_a_value_error() -> None:
    """pyo3 raises a panic of native code (a failed allocation under memory pressure, found
    under a 230 MB address-space limit) as PanicException, a BaseException: it went past every
    reader's caller (``except Exception``), and the connection was left open."""
    class PanicException(BaseException):
        pass

    def panicking(data: bytes, pos: int) -> None:
        raise PanicException("out of memory")

    with pytest.raises(ValueError, match="kio's reader failed: out of memory"):
        protocol._kio_read(panicking, b"", 0)

    def interrupted(data: bytes, pos: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        protocol._kio_read(interrupted, b"", 0)
