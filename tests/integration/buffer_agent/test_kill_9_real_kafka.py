"""kill -9 of the agent twenty times under load, against Apache Kafka: nothing acknowledged is
lost, and nothing arrives twice.

Two idempotent clients produce through a real agent process to a real broker; the agent is
SIGKILLed at random moments (``KILL_SEED`` replays a run) and restarted on the same volume
and port. Each restart finds frames the previous run acknowledged to its clients but had not
yet forwarded, or had sent without hearing back. The forwarder keeps its producer id, epochs
and sequence numbers on the volume (``forward/identity``) and sends such frames again with
the numbers they had; the partition leaders say what they already hold (DescribeProducers),
so nothing is written twice. The clients' own retries of batches the agent stored just
before a kill are recognised by the ingest (its producer state). The per-record forwarder
this replaced took a new producer id at every start: about one checkpoint interval of
records arrived twice per kill.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from support.agent_kills import counted_possible_duplicates, kill_under_load
from support.broker import KafkaBroker, consume_all
from support.cluster_load import grade
from support.kafka_fixtures import TopicFactory

pytestmark = pytest.mark.integration

KILLS = 20
PARTITIONS = 3
RATE = 1500
"""Records a second per client (two clients)."""


def test_kill_9_twenty_times_under_load_loses_nothing_and_duplicates_nothing(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time_ns()))
    rng = random.Random(seed)
    topic = new_topic(PARTITIONS)
    agent = AgentProcess(
        tmp_path / "volume",
        kafka_broker.bootstrap,
        extra_args=["--checkpoint-interval", "1", "--drain-timeout", "60"],
        log_path=tmp_path / "agent.log",
    )
    with agent:
        run = kill_under_load(
            agent, topic, PARTITIONS, RATE, [rng.uniform(0.3, 2.0) for _ in range(KILLS)]
        )
        assert agent.stop(timeout=90) == 0, agent.log_tail()
    loads, unflushed = run.loads, run.unflushed
    counted = counted_possible_duplicates(agent)
    consumed = consume_all(kafka_broker.bootstrap, topic, timeout=120, idle=3)
    result = grade(consumed, loads)
    print(
        f"\nkill -9 x{KILLS} (seed {seed}): {result.summary()};"
        f" duplicates per kill {result.duplicates / KILLS:.1f}; counted possible {counted:.0f}"
    )
    assert unflushed == [0, 0]
    assert not any(load.fatal or load.errors for load in loads), [
        (load.fatal, load.errors[:3]) for load in loads
    ]
    assert result.acknowledged > RATE * 10, "the clients must have made real progress"
    assert not result.lost, f"{len(result.lost)} acknowledged records lost: {result.lost[:5]}"
    assert not result.damaged and not result.unexpected
    assert not result.order_violations
    assert result.duplicates == 0
    assert counted == 0
