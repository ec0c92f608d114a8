"""Requests that declare more than they hold, against a real agent process.

A Metadata v12 request of 17 bytes declaring 2**32 - 2 topics made kio's reader reserve room
for them: 34 GB, a failed allocation, and the agent's process aborted ("memory allocation of
34359738352 bytes failed"), with no exception to catch. Any client could crash the agent at
will. The agent now checks every count and length against the request's bytes first
(``kafka/wire_bounds.py``), answers such a request by closing the connection, as a broker
does, and goes on serving.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from support.kafka_wire import exchange

pytestmark = pytest.mark.integration

HOSTILE = [
    struct.pack(">hhih", 3, 12, 1, 1) + b"c" + b"\x00" + b"\xff\xff\xff\xff\x0f",
    struct.pack(">hhih", 3, 1, 2, 1) + b"c" + struct.pack(">i", 2**31 - 1),
    struct.pack(">hhih", 1, 4, 3, 1) + b"c" + struct.pack(">iiiibi", -1, 0, 0, 0, 0, 2**31 - 1),
]
"""Metadata v12 (compact array), Metadata v1 (legacy array), Fetch v4 (legacy array)."""
API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 9, -1)


def test_a_request_declaring_more_than_it_holds_is_refused_and_the_agent_serves_on(
    tmp_path: Path,
) -> None:
    flags = ["--drain-timeout", "0.5", "--log-level", "WARNING"]
    with AgentProcess(tmp_path / "volume", "127.0.0.1:1", extra_args=flags) as agent:
        assert agent.process is not None
        for frame in HOSTILE:
            assert exchange(agent.port, frame) == b"", "closed, no answer"
            assert agent.process.poll() is None, f"the agent died: {agent.log_tail()}"
        answer = exchange(agent.port, API_VERSIONS_V0)
        assert answer[4:8] == struct.pack(">i", 9), "a well-formed request is still answered"
        assert agent.is_ready()
        log = agent.log_tail()
        assert "memory allocation" not in log
