"""A request with tagged fields its version does not know, against a real agent process.

Kafka's readers skip a tagged field they do not know: that is how a client adds one without
a new version. kio refused it (KeyError), and the agent closed the connection of a client
that sent one; it now drops them before kio reads the request (``kafka/wire_bounds.py``) and
answers as it answers the request without them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from support.kafka_wire import exchange

pytestmark = pytest.mark.integration

HEADER = struct.pack(">hhih", 3, 12, 7, 1) + b"c"  # Metadata v12, correlation id 7
UNKNOWN_TAG = b"\x63\x03abc"  # tag 99, 3 bytes
PLAIN = HEADER + b"\x00" + b"\x01\x00\x00\x00"  # no topics named: the brokers only
TAGGED = HEADER + b"\x01" + UNKNOWN_TAG + b"\x01\x00\x00\x01" + UNKNOWN_TAG


def test_a_request_with_unknown_tagged_fields_is_answered_as_without_them(tmp_path: Path) -> None:
    flags = ["--drain-timeout", "0.5", "--log-level", "WARNING"]
    with AgentProcess(tmp_path / "volume", "127.0.0.1:1", extra_args=flags) as agent:
        plain = exchange(agent.port, PLAIN)
        tagged = exchange(agent.port, TAGGED)
        assert plain[4:8] == struct.pack(">i", 7), f"answered: {plain!r}"
        assert tagged == plain, agent.log_tail()
