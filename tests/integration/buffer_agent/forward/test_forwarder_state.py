"""The forwarder's state right after a start: Kafka down when the agent starts shows at once.

Before 2026-11-28 every state read ``delivering`` for ``stall_after_s`` (10 s) after a start
while records waited, whatever the forwarder's Kafka client reported: an agent started while
Kafka was down told its dashboards and the drain estimate that it delivered.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.ports import LOOPBACK, free_port
from support.kafka_clients import produce_values
from support.waiting import wait_for

pytestmark = pytest.mark.integration

STATE = 'durable_agent_forwarder_state{state="%s"}'
GRACE_S = ForwarderConfig().stall_after_s
"""The grace the old code gave every start (the agent runs with the default)."""


def test_kafka_down_at_the_start_reads_kafka_unreachable_within_the_grace(
    tmp_path: Path,
) -> None:
    nothing_there = f"{LOOPBACK}:{free_port()}"
    agent = AgentProcess(
        tmp_path / "volume",
        nothing_there,
        extra_args=["--default-partitions", "1"],
        log_path=tmp_path / "agent.log",
    )
    with agent:
        values = [b"v%03d" % n for n in range(50)]
        delivered = produce_values(agent.bootstrap, "orders", values, {"linger.ms": 5})
        assert len(delivered.delivered) == 50, "accepted while Kafka is down"
        agent.restart()  # records wait in the WAL from the first moment, Kafka still down
        started = time.monotonic()
        wait_for(
            lambda: agent.metric(STATE % "kafka_unreachable") == 1,
            timeout=GRACE_S / 2,
            interval=0.1,
            what="the state to say Kafka cannot be reached",
        )
        seen_after = time.monotonic() - started
        assert agent.metric(STATE % "delivering") == 0
        agent.kill()
    log = (tmp_path / "agent.log").read_text()
    assert "Traceback" not in log
    assert "-> kafka_unreachable" in log and "NETWORK_EXCEPTION" in log, log[-3000:]
    print(f"\nkafka_unreachable {seen_after:.1f} s after the agent was ready")
