"""After kill -9 the agent sends nothing twice, on a cluster that cannot describe producers.

Two clients produce through a real agent process to a 3-broker mock cluster; the agent is
SIGKILLed at moments chosen to leave different things behind (acknowledged but not yet
checkpointed frames, and batches in flight to slow brokers), and restarted on the same
volume. The forwarder keeps its producer id, epochs and sequence numbers on the volume
(``forward/identity``), so the restarted agent sends the frames Kafka may hold again with the
numbers they had. librdkafka's mock cluster neither serves DescribeProducers (the forwarder
falls back to sending the frames again with their numbers, the path a real cluster takes
only where DescribeProducers is refused) nor drops a copy whose sequence numbers it holds (a
real broker answers DUPLICATE_SEQUENCE_NUMBER): the copies it stores with the same producer
id, epoch and sequences are the ones a real broker drops (``raw_fetch.sequence_anomalies``).
The agent must have made no other duplicate, and counted none.

Before the forwarder kept its identity (a new producer id per start), these kills left
thousands of duplicates; now the consumer must see none and the agent must count none.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.mock_cluster import MockCluster
from durable_producer.local.topics import consume_all
from support.cluster_load import ProducerLoad, grade
from support.cluster_scenario import BROKERS, PARTITIONS, TOPIC, leader_of
from support.raw_fetch import sequence_anomalies, stored_batches

pytestmark = pytest.mark.integration

RATE = 600


def _counted(agent: AgentProcess) -> tuple[float, float]:
    metrics = agent.metrics()

    def total(name: str) -> float:
        return sum(value for key, value in metrics.items() if key.startswith(name))

    return (
        total("durable_agent_replayed_duplicates_total"),
        total("durable_agent_possible_duplicates_total"),
    )


def test_duplicates_counted_across_kill_9_match_what_a_consumer_sees(tmp_path: Path) -> None:
    with MockCluster(BROKERS) as cluster:
        cluster.topic_create(TOPIC, PARTITIONS, BROKERS)
        for partition in range(PARTITIONS):
            cluster.partition_set_leader(TOPIC, partition, leader_of(partition))
        agent = AgentProcess(
            tmp_path / "volume",
            cluster.bootstrap,
            extra_args=["--checkpoint-interval", "3", "--drain-timeout", "60"],
            log_path=tmp_path / "agent.log",
        )
        certain = possible = 0.0
        with agent:
            loads = [
                ProducerLoad(f"c{n}", agent.bootstrap, TOPIC, PARTITIONS, RATE).start()
                for n in range(2)
            ]
            try:
                for pause, slow_ms in ((2.0, 0), (1.5, 0), (1.5, 400), (2.5, 0)):
                    time.sleep(pause)
                    for broker in cluster.broker_ids:  # slow: records pile up in flight
                        cluster.broker_set_rtt(broker, slow_ms)
                    time.sleep(1.0 if slow_ms else 0.0)
                    counted = _counted(agent)
                    agent.restart()
                    certain, possible = certain + counted[0], possible + counted[1]
                    for broker in cluster.broker_ids:
                        cluster.broker_set_rtt(broker, 0)
                time.sleep(2.0)
            finally:
                unflushed = [load.stop() for load in loads]
            time.sleep(1.0)
            counted = _counted(agent)
            certain, possible = certain + counted[0], possible + counted[1]
            assert agent.stop(timeout=90) == 0, agent.log_tail()
        assert not any(unflushed)
        consumed = consume_all(cluster.bootstrap, TOPIC, timeout=60, idle=1.5)
        lows = {p: cluster.low_watermark(TOPIC, p) for p in range(PARTITIONS)}
        rewritten = sum(
            sequence_anomalies(stored_batches(cluster.bootstrap, TOPIC, p)).rewritten_records
            for p in range(PARTITIONS)
        )
    result = grade(consumed, loads, lows)
    seen = result.duplicates - rewritten
    print(
        f"\nkill -9 x4: {result.summary()}; duplicates made by the agent {seen}"
        f" (mock rewrites {rewritten}); counted {certain:.0f} certain + {possible:.0f} possible"
    )
    assert not result.lost and not result.damaged and not result.unexpected
    assert all(low == 0 for low in lows.values()), f"the mock dropped records: {lows}"
    assert result.acknowledged > 4 * RATE, "the clients must have made real progress"
    assert seen == 0
    assert (certain, possible) == (0, 0)
