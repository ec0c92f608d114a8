"""A full buffer: the broker is down, the WAL reaches its limit, the agent answers with a
retriable error (backpressure), nothing acknowledged is lost, and once the broker is back the
backlog drains and the same producer succeeds again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import ProxiedBroker, consume_all, create_topic
from support.waiting import wait_until_still

pytestmark = pytest.mark.integration

MAX_BUFFER = 1024 * 1024
TOPIC = "full-buffer"


def test_full_buffer_backpressure_then_drain(tmp_path: Path) -> None:
    with ProxiedBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, 2)
        broker.proxy.cut()
        agent = AgentProcess(
            tmp_path / "volume",
            broker.bootstrap,
            extra_args=[
                "--max-buffer-bytes",
                str(MAX_BUFFER),
                "--segment-bytes",
                "262144",
                "--max-batch-bytes",
                "65536",
                "--checkpoint-interval",
                "0.5",
                "--default-partitions",
                "2",
            ],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            acked: set[int] = set()
            errors: list[str] = []
            producer = Producer(
                {
                    "bootstrap.servers": agent.bootstrap,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "batch.size": 16384,
                    "message.timeout.ms": 0,
                    "retry.backoff.ms": 100,
                    "log_level": 2,
                }
            )

            def delivered(error: object, message: object) -> None:
                if error is None:
                    acked.add(int(message.key()))  # type: ignore[attr-defined]
                else:
                    errors.append(str(error))

            total = 12_000  # 12k x 200 B = 2.4 MB: more than twice the buffer
            for index in range(total):
                producer.produce(
                    TOPIC,
                    key=str(index).encode(),
                    value=bytes([index % 251]) * 200,
                    on_delivery=delivered,
                )
                producer.poll(0)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                producer.poll(0.2)
                if (
                    len(acked) > total // 5
                    and agent.metrics()["durable_agent_buffer_free_bytes"] < 70_000
                ):
                    break
            else:
                raise AssertionError(f"the buffer never filled: {agent.metrics()}")

            def acked_count() -> int:
                producer.poll(0.05)
                return len(acked)

            # Answers to batches taken just before the buffer filled may still come: the
            # plateau is the count once it has stood still for 2 s.
            plateau = wait_until_still(acked_count, 2.0, what="the acknowledged count")
            metrics = agent.metrics()
            assert metrics["durable_agent_backlog_bytes"] <= MAX_BUFFER
            assert 0 < plateau < total, "the agent must accept until full, then push back"
            time.sleep(2)
            assert acked_count() == plateau, "nothing is accepted while the buffer is full"
            assert "full" in agent.log_tail(20_000).lower()

            broker.proxy.restore()
            assert producer.flush(120) == 0
            assert not errors, errors[:5]
            assert len(acked) == total, "once the backlog drains the producer succeeds again"
            assert agent.stop() == 0
        consumed = consume_all(broker.direct_address, TOPIC, timeout=60, idle=2)
    keys = {int(record.key) for record in consumed}
    assert keys == set(range(total)), f"missing: {sorted(set(range(total)) - keys)[:10]}"
    for record in consumed:
        assert record.value == bytes([int(record.key) % 251]) * 200
