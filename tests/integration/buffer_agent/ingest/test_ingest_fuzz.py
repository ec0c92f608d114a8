"""Hostile bytes at the listener: no crash, no hang, a well-behaved client keeps being served."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_METADATA,
    SUPPORTED_API_VERSIONS,
    build,
    nested_schema,
    request_schema,
)
from support.ingest_harness import (
    FakeCluster,
    RawClient,
    RunningAgent,
    produce_error,
    record_batch,
)
from support.kafka_wire import encode_request

pytestmark = pytest.mark.integration

MAX_FRAME = 64 * 1024


def valid_requests() -> list[bytes]:
    metadata = request_schema(API_METADATA, 9)
    topic = nested_schema(metadata, "MetadataRequestTopic")
    api_versions = request_schema(API_API_VERSIONS, 3)
    return [
        encode_request(
            API_METADATA,
            9,
            1,
            build(
                metadata,
                topics=(build(topic, name="events"),),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            ),
        ),
        encode_request(
            API_API_VERSIONS,
            3,
            2,
            build(api_versions, client_software_name="x", client_software_version="1"),
        ),
    ]


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


supported_headers = st.sampled_from(sorted(SUPPORTED_API_VERSIONS.items())).flatmap(
    lambda item: st.tuples(
        st.just(item[0]), st.integers(item[1][0], item[1][1]), st.integers(-(2**31), 2**31 - 1)
    )
)

hostile_payloads = st.one_of(
    st.binary(max_size=200),  # raw garbage, any prefix
    st.binary(max_size=200).map(sized),  # well-framed garbage
    st.tuples(supported_headers, st.binary(max_size=300)).map(  # right header, random body
        lambda t: sized(struct.pack(">hhi", *t[0]) + t[1])
    ),
    st.tuples(st.sampled_from(valid_requests()), st.data()).map(  # valid request, truncated
        lambda t: t[0][: t[1].draw(st.integers(0, len(t[0]) - 1))]
    ),
    st.integers(MAX_FRAME + 1, 2**31 - 1).map(lambda n: struct.pack(">i", n)),  # oversized
    st.integers(-(2**31), 7).map(lambda n: struct.pack(">i", n) + b"\x00" * 8),  # tiny/negative
    st.tuples(st.integers(0, 2**15 - 1), st.integers(-5, 2**15 - 1)).map(  # unknown key/version
        lambda kv: sized(struct.pack(">hhih", kv[0], kv[1], 1, -1))
    ),
)


def test_hostile_frames_never_take_the_agent_down(tmp_path: Path) -> None:
    config = IngestConfig(max_frame_bytes=MAX_FRAME, read_timeout_s=1.0, idle_timeout_s=5.0)
    with RunningAgent(tmp_path, FakeCluster({"events": 1}), ingest=config) as agent:
        assert agent.server is not None
        port = agent.server.port
        with RawClient(agent.bootstrap, timeout=3.0) as well_behaved:

            @settings(
                max_examples=150,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(payload=hostile_payloads)
            def attack(payload: bytes) -> None:
                with socket.create_connection(("127.0.0.1", port), timeout=3.0) as sock:
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(65536):  # the agent answers or closes; never hangs
                        pass
                assert well_behaved.api_versions().error_code == ErrorCode.none

            attack()
            batch = record_batch([b"still-served"])
            assert produce_error(well_behaved.produce("events", 0, batch))[0] == 0
        assert [record.value for record in agent.records()] == [b"still-served"]
        stats = agent.server.stats
        assert stats.connections_total > 150
        assert sum(stats.dropped_connections.values()) > 50  # malformed frames were refused
        assert stats.dropped_connections["internal_error"] == 0, stats
