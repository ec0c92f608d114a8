"""The listener's limits: connections, the shared request-memory budget, announced sizes."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.config import IngestConfig
from support.ingest_harness import FakeCluster, RawClient, RunningAgent, produce_error, record_batch
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "limits"


def test_connections_beyond_the_limit_are_closed_on_arrival(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = IngestConfig(max_connections=3)
    with RunningAgent(tmp_path, FakeCluster({TOPIC: 1}), ingest=config) as agent:
        assert agent.server is not None
        server = agent.server
        clients = [RawClient(agent.bootstrap) for _ in range(3)]
        for client in clients:
            assert client.api_versions().error_code == ErrorCode.none
        with (
            caplog.at_level(logging.WARNING),
            RawClient(agent.bootstrap) as refused,
            contextlib.suppress(ConnectionResetError),  # closed, or reset, by the agent
        ):
            assert refused.sock.recv(10) == b""
        assert server.stats.refused_connections == 1
        assert "3 connections are open, the limit (--max-connections)" in caplog.text
        clients.pop().close()
        wait_for(lambda: server.stats.connections_open == 2, timeout=5, what="a slot freed")
        with RawClient(agent.bootstrap) as client:
            assert produce_error(client.produce(TOPIC, 0, record_batch([b"in"])))[0] == 0
        for client in clients:
            client.close()
        assert [record.value for record in agent.records()] == [b"in"]


def test_a_budget_smaller_than_the_requests_in_flight_delays_them_and_loses_nothing(
    tmp_path: Path,
) -> None:
    config = IngestConfig(max_request_memory_bytes=2 << 20)
    values = [os.urandom(100) + b"%d" % i for i in range(8)]
    with RunningAgent(tmp_path, FakeCluster({TOPIC: 1}), ingest=config) as agent:
        assert agent.server is not None

        batches = [
            record_batch([value] + [os.urandom(700) for _ in range(1000)]) for value in values
        ]
        # All eight start sending at once, so their bytes overlap even on a loaded machine.
        start = threading.Barrier(len(batches))

        def produce(index: int) -> int:
            with RawClient(agent.bootstrap, timeout=30) as client:
                start.wait(timeout=30)
                return produce_error(client.produce(TOPIC, 0, batches[index]))[0]

        with ThreadPoolExecutor(max_workers=8) as pool:
            assert list(pool.map(produce, range(8))) == [0] * 8
        memory = agent.server.request_memory
        assert memory.peak <= memory.limit
        assert agent.server.stats.request_memory_waits > 0
        wait_for(lambda: memory.used == 0, timeout=5, what="every request's bytes given back")
        stored = {record.value for record in agent.records()}
    assert set(values) <= stored and len(stored) == 8 * 1001


def test_size_prefixes_alone_take_no_request_memory(tmp_path: Path) -> None:
    with RunningAgent(tmp_path, FakeCluster({TOPIC: 1})) as agent:
        assert agent.server is not None
        server = agent.server
        host, port = agent.bootstrap.rsplit(":", 1)
        stalled = [socket.create_connection((host, int(port))) for _ in range(200)]
        try:
            for sock in stalled:
                sock.sendall(struct.pack(">i", 4 << 20) + os.urandom(1024))
            wait_for(lambda: server.stats.connections_open == 200, timeout=10, what="connected")
            with RawClient(agent.bootstrap) as client:
                assert produce_error(client.produce(TOPIC, 0, record_batch([b"ok"])))[0] == 0
            assert server.request_memory.peak < 1 << 20  # staging buffers are not taken
            wait_for(lambda: server.request_memory.used == 0, timeout=5, what="given back")
        finally:
            for sock in stalled:
                sock.close()


def test_a_request_larger_than_the_budget_closes_the_connection(tmp_path: Path) -> None:
    config = IngestConfig(max_request_memory_bytes=1 << 20)
    with RunningAgent(tmp_path, FakeCluster({TOPIC: 1}), ingest=config) as agent:
        assert agent.server is not None
        with RawClient(agent.bootstrap) as client:
            client.sock.sendall(struct.pack(">i", 2 << 20) + b"x" * 100)
            assert client.sock.recv(10) == b""
        assert agent.server.stats.dropped_connections["MalformedFrame"] == 1
