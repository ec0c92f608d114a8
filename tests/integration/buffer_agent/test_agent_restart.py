"""The agent process across a crash: producer-sequence state survives checkpoints that delete
the WAL segments it was built from, so duplicate detection stays exact after a restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import KafkaBroker, consume_all, create_topic
from support.waiting import wait_for

pytestmark = pytest.mark.integration

LENIENT = "sequence checks are lenient"


def produce(bootstrap: str, start: int, count: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.size": 4096,
            "log_level": 2,
        }
    )
    for index in range(start, start + count):
        producer.produce("restart", key=str(index).encode(), value=b"v" * 100)
        producer.poll(0)
    assert producer.flush(60) == 0


def wait_until_forwarded(agent: AgentProcess, count: int) -> None:
    wait_for(
        lambda: agent.metrics().get("durable_agent_forwarded_records_total", 0) >= count,
        timeout=30, interval=0.2, what=f"the agent to forward {count} records",
    )  # fmt: skip


def test_sequence_state_survives_checkpoint_and_sigkill(tmp_path: Path) -> None:
    with KafkaBroker() as broker:
        create_topic(broker.bootstrap, "restart", 2)
        agent = AgentProcess(
            tmp_path / "volume",
            broker.bootstrap,
            extra_args=[
                "--segment-bytes",
                "65536",
                "--max-batch-bytes",
                "16384",
                "--checkpoint-interval",
                "0.3",
            ],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            produce(agent.bootstrap, 0, 1000)
            assert agent.stop() == 0  # a clean stop writes a producer-state snapshot
            agent.start()
            produce(agent.bootstrap, 1000, 3000)
            wait_until_forwarded(agent, 3000)  # counters restart with the process
            time.sleep(1.0)  # checkpoints delete the segments the old snapshot relied on
            agent.kill()
            agent.start()
            produce(agent.bootstrap, 4000, 1000)
            assert agent.stop() == 0
        log = agent.log_path.read_text()
        assert "producer state restored" in log
        assert LENIENT not in log, "the checkpoint outran the producer-state snapshot"
        records = consume_all(broker.bootstrap, "restart", timeout=60, idle=2)
    assert {int(r.key) for r in records} == set(range(5000))
