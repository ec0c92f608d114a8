"""Refused records: retried for the window, dead-lettered after it, visible meanwhile, and
re-sent with one command once the cause is fixed.

A real agent process forwards to a 3-broker mock cluster that refuses every Produce request
with TOPIC_AUTHORIZATION_FAILED for longer than the agent's retry window (an ACL that stays
missing). The records wait (``durable_agent_refused_records``, state ``kafka_refusing``), then
go to the dead-letter area; after the refusal is lifted, ``durable-agent dead-letters
resend`` delivers them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from durable_producer.buffer_agent.forward.dead_letter import DeadLetter, list_dead_letters
from durable_producer.buffer_agent.kafka.record_batch import iter_batches
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.mock_cluster import API_PRODUCE, MockCluster
from durable_producer.local.topics import consume_all
from support.cluster_load import record_key
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "guarded"


def _produce(bootstrap: str, first: int, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for index in range(first, first + count):
        producer.produce(TOPIC, key=record_key("c", index), value=b"v%d" % index, partition=0)
    assert producer.flush(30) == 0, "the agent acknowledges whatever Kafka thinks"


def _records(letter: DeadLetter) -> int:
    assert letter.payload is not None
    return sum(header.record_count for header, _ in iter_batches(letter.payload))


def test_records_refused_past_the_window_are_dead_lettered_then_resent_with_one_command(
    tmp_path: Path,
) -> None:
    with MockCluster(3) as cluster:
        cluster.topic_create(TOPIC, 1, 3)
        agent = AgentProcess(
            tmp_path / "volume",
            cluster.bootstrap,
            extra_args=["--dead-letter-after", "14", "--checkpoint-interval", "1"],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            _produce(agent.bootstrap, 0, 30)
            wait_for(
                lambda: agent.metrics().get("durable_agent_forwarded_records_total", 0) >= 30,
                30,
                what="the first records forwarded",
            )
            cluster.push_request_errors(API_PRODUCE, [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 5000)
            _produce(agent.bootstrap, 30, 20)

            waiting = wait_for(
                lambda: agent.metrics().get("durable_agent_refused_records", 0),
                30,
                what="refused records waiting for a retry",
            )
            wait_for(
                lambda: agent.metrics().get(
                    'durable_agent_forwarder_state{state="kafka_refusing"}', 0
                ),
                30,
                what="state kafka_refusing",
            )
            wait_for(
                lambda: (
                    sum(
                        value
                        for key, value in agent.metrics().items()
                        if key.startswith("durable_agent_dead_letters_total")
                    )
                    == 20
                ),
                60,
                what="20 dead letters once the window is over",
            )
            metrics = agent.metrics()
            cluster.clear_request_errors(API_PRODUCE)
            resend = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "durable_producer.buffer_agent.cli",
                    "dead-letters",
                    "resend",
                    "--data-dir",
                    str(tmp_path / "volume"),
                    "--kafka-bootstrap",
                    cluster.bootstrap,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert agent.stop() == 0
        consumed = consume_all(cluster.bootstrap, TOPIC, timeout=30, idle=1)

    assert waiting > 0
    assert metrics['durable_agent_dead_letters_total{reason="TOPIC_AUTHORIZATION_FAILED"}'] == 20
    refusals = (
        'durable_agent_kafka_errors_total{error="TOPIC_AUTHORIZATION_FAILED",kind="delivery"}'
    )
    assert metrics[refusals] >= 3, "retried through the window, with a backoff"
    assert resend.returncode == 0, resend.stdout + resend.stderr
    letters = list_dead_letters(tmp_path / "volume" / "dead-letter", include_resent=True)
    assert all(letter.resent for letter in letters)
    assert sum(_records(letter) for letter in letters) == 20  # whole client batches
    assert f"re-sent {len(letters)}, failed 0" in resend.stdout
    keys = [record.key for record in consumed]
    assert sorted(keys) == sorted(record_key("c", index) for index in range(50))
    assert len(keys) == len(set(keys)), "each record once"
