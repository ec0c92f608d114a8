"""The batch forwarder against three real Apache Kafka brokers (RF 3, ``min.insync.replicas=2``)
while the cluster fails under it: what only real replication shows (issue 25).

Two idempotent clients produce checkable records (``support.cluster_load``) through a real agent
process whose forwarder sends to the 3-node cluster of the run (``kafka_cluster``, healed after
each test). A fault hits the cluster while the agent forwards; then the clients stop, the agent
drains, and a consumer reads the topic. Each test asserts that no record the agent acknowledged
is lost, damaged or out of its client's order, and counts the duplicates: the forwarder is an
idempotent producer, so a leader failover must not make any beyond what the agent counted as
possible (it counted none in these runs). A topic deleted under its backlog is graded on
the other topic and on the dead-letter budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from durable_producer.local.agent_process import AgentProcess
from support.broker import KafkaCluster, consume_all
from support.cluster_load import Grade, ProducerLoad, grade
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for, wait_until_still

pytestmark = pytest.mark.integration

RATE = 600
"""Records a second per client (two clients)."""
BEFORE_S = 3.0
AFTER_S = 3.0


@dataclass
class Run:
    result: Grade
    metrics: dict[str, float]
    """The agent's metrics once it had forwarded everything."""
    loads: list[ProducerLoad]
    unflushed: list[int]

    def counted(self, prefix: str) -> float:
        return sum(value for name, value in self.metrics.items() if name.startswith(prefix))

    def errors(self, name: str) -> float:
        return kafka_errors(self.metrics, name)

    def check(self) -> None:
        """Nothing acknowledged lost, damaged or reordered; duplicates within the counted."""
        result = self.result
        assert self.unflushed == [0] * len(self.loads)
        assert not any(load.fatal or load.errors for load in self.loads), [
            (load.fatal, load.errors[:3]) for load in self.loads
        ]
        assert result.acknowledged > RATE * 4, "the clients must have made real progress"
        assert not result.lost, f"{len(result.lost)} acknowledged records lost: {result.lost[:5]}"
        assert not result.damaged and not result.unexpected
        assert not result.order_violations
        assert result.duplicates <= self.counted("durable_agent_possible_duplicates_total")
        assert self.counted("durable_agent_dead_letters_total") == 0


def forward_through_fault(
    tmp_path: Path,
    cluster: KafkaCluster,
    topic: str,
    partitions: int,
    fault: Callable[[list[ProducerLoad], AgentProcess], None],
    *,
    settings: dict[str, object] | None = None,
    agent_args: Sequence[str] = (),
) -> Run:
    agent = AgentProcess(
        tmp_path / "volume",
        cluster.bootstrap,
        extra_args=["--drain-timeout", "60", "--dead-letter-after", "5", *agent_args],
        log_path=tmp_path / "agent.log",
    )
    with agent:
        loads = [
            ProducerLoad(f"c{n}", agent.bootstrap, topic, partitions, RATE, settings=settings or {})
            for n in range(2)
        ]
        for load in loads:
            load.start()
        try:
            time.sleep(BEFORE_S)
            fault(loads, agent)
            time.sleep(AFTER_S)
        finally:
            unflushed = [load.stop() for load in loads]
        wait_for(
            lambda: agent.metrics().get("durable_agent_backlog_records") == 0,
            timeout=60,
            interval=0.5,
            what=f"the agent to forward its backlog; log:\n{agent.log_tail()}",
        )
        metrics = agent.metrics()
        assert agent.stop(timeout=60) == 0, agent.log_tail()
    consumed = consume_all(cluster.bootstrap, topic, timeout=60, idle=3)
    run = Run(grade(consumed, loads), metrics, loads, unflushed)
    print(f"\n{run.result.summary()}")
    return run


def test_a_partition_leader_killed_while_forwarding(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(3, bootstrap=kafka_cluster.bootstrap)

    def kill_leader(_loads: list[ProducerLoad], _agent: AgentProcess) -> None:
        leader = kafka_cluster.leader_of(topic, 0)
        leader.kill()  # kill -9: its partitions fail over, their ISRs shrink
        wait_for(
            lambda: kafka_cluster.partition(topic, 0).leader not in (-1, leader.node_id),
            timeout=30,
            interval=0.2,
            what="a new leader",
        )
        time.sleep(2.0)
        kafka_cluster.start_node(leader.node_id)

    kill_leader_run = forward_through_fault(tmp_path, kafka_cluster, topic, 3, kill_leader)
    kill_leader_run.check()


def test_a_partition_leader_suspended_while_forwarding(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(3, bootstrap=kafka_cluster.bootstrap)

    def suspend_leader(_loads: list[ProducerLoad], _agent: AgentProcess) -> None:
        leader = kafka_cluster.leader_of(topic, 0)
        leader.suspend()  # SIGSTOP: requests to it hang until it is fenced
        try:
            wait_for(
                lambda: kafka_cluster.partition(topic, 0).leader not in (-1, leader.node_id),
                timeout=40,
                interval=0.5,
                what="leadership to move off the SIGSTOPped broker",
            )
            time.sleep(2.0)
        finally:
            leader.resume()

    suspended_run = forward_through_fault(tmp_path, kafka_cluster, topic, 3, suspend_leader)
    suspended_run.check()


def test_one_broker_down_below_min_insync_replicas_is_ridden_out(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """RF 2 with ``min.insync.replicas=2``: with the follower down the leader commits nothing
    acks=all. A Produce it had appended when the ISR shrank is held until its timeout (Kafka 4's
    high watermark does not move while the ISR is below the minimum), and the connection's later
    requests wait behind it; once it times out, every batch is refused NOT_ENOUGH_REPLICAS.
    The agent keeps acknowledging its clients (the records wait in the WAL), retries, and
    forwards all of it, once, when the follower is back. ``--request-timeout 3`` makes the
    refusal come within the window (the default 30 s holds the connection that long)."""
    topic = new_topic(1, replication_factor=2, bootstrap=kafka_cluster.bootstrap)
    state = kafka_cluster.partition(topic)
    follower = next(replica for replica in state.replicas if replica != state.leader)
    held: list[float] = []

    def follower_down(loads: list[ProducerLoad], agent: AgentProcess) -> None:
        kafka_cluster.stop(follower)
        wait_for(
            lambda: kafka_cluster.partition(topic).isr == (state.leader,),
            timeout=30,
            interval=0.2,
            what="the ISR to shrink to the leader",
        )
        # Answers to requests committed before the shrink may still arrive: the count from
        # which nothing more may be forwarded is taken once it has stood still for 2 s
        # (longer than the forwarder's longest retry backoff, 1 s).
        forwarded = wait_until_still(
            lambda: forwarded_records(agent),
            2.0,
            timeout=30,
            interval=0.2,
            what="the forwarded count while the ISR is below the minimum",
        )
        wait_for(
            lambda: refusals(agent) > 0,
            timeout=20,
            interval=0.5,
            what=f"NOT_ENOUGH_REPLICAS from the leader; log:\n{agent.log_tail()}",
        )
        acked = sum(len(load.acked) for load in loads)
        time.sleep(2.0)
        assert sum(len(load.acked) for load in loads) > acked, "ingest went on"
        held.append(forwarded_records(agent) - forwarded)
        kafka_cluster.start_node(follower)
        kafka_cluster.wait_for_full_isr([topic], timeout=60)

    run = forward_through_fault(
        tmp_path,
        kafka_cluster,
        topic,
        1,
        follower_down,
        agent_args=["--request-timeout", "3"],
    )
    run.check()
    assert held == [0], "Kafka committed nothing acks=all while the ISR was below the minimum"


def forwarded_records(agent: AgentProcess) -> float:
    return agent.metrics().get("durable_agent_forwarded_records_total", 0.0)


def refusals(agent: AgentProcess) -> float:
    return kafka_errors(agent.metrics(), "NOT_ENOUGH_REPLICAS")


def kafka_errors(metrics: dict[str, float], name: str) -> float:
    """The forwarder's Kafka errors called ``name``, of every kind."""
    return sum(
        value
        for key, value in metrics.items()
        if key.startswith("durable_agent_kafka_errors_total") and f'error="{name}"' in key
    )


def test_a_topic_with_a_small_max_message_bytes(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """linger-0 clients send one record a batch; the forwarder merges them, within the topic's
    20 kB ``max.message.bytes`` (learnt with DescribeConfigs), on a replicated topic."""
    topic = new_topic(3, config={"max.message.bytes": "20000"}, bootstrap=kafka_cluster.bootstrap)
    run = forward_through_fault(
        tmp_path,
        kafka_cluster,
        topic,
        3,
        lambda _loads, _agent: None,
        settings={"linger.ms": 0, "batch.size": 16384},
    )
    run.check()
    assert run.errors("MESSAGE_TOO_LARGE") == 0


@pytest.mark.slow
def test_a_rolling_restart_of_every_broker_while_forwarding(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """An upgrade's rolling restart: each broker in turn shuts down in a controlled way (its
    leaderships move), starts, and rejoins every ISR before the next goes, all while the agent
    forwards. Slow: three broker restarts with their ISR catch-up take about a minute."""
    topic = new_topic(3, bootstrap=kafka_cluster.bootstrap)

    def roll(loads: list[ProducerLoad], _agent: AgentProcess) -> None:
        acked = sum(len(load.acked) for load in loads)
        kafka_cluster.rolling_restart([topic])
        assert sum(len(load.acked) for load in loads) > acked, "ingest went on throughout"

    run = forward_through_fault(tmp_path, kafka_cluster, topic, 3, roll)
    run.check()


def test_a_topic_deleted_while_its_backlog_forwards(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """A backlog for two topics is stored while Kafka is out of reach; one topic is deleted;
    then the agent forwards. The other topic's records all arrive (and new ones keep flowing)
    while the deleted topic's batches wait ``--unknown-topic-wait`` (15 s here) and then go to the
    dead-letter area, which stays within ``--dead-letter-max-bytes``: the batches that do not
    fit wait in the WAL."""
    keep = new_topic(3, bootstrap=kafka_cluster.bootstrap)
    doomed = new_topic(3, bootstrap=kafka_cluster.bootstrap)
    budget = 1 << 20
    agent = AgentProcess(
        tmp_path / "volume",
        "127.0.0.1:1",  # unreachable: everything stays in the WAL
        extra_args=[
            "--default-partitions",
            "3",
            "--drain-timeout",
            "1",
            "--dead-letter-max-bytes",
            str(budget),
            "--unknown-topic-wait",
            "15",
        ],
        log_path=tmp_path / "agent.log",
    )
    with agent:
        stored = [
            ProducerLoad("k1", agent.bootstrap, keep, 3, RATE).start(),
            # Batches well below the budget: a client that finds the agent slow (a loaded
            # machine) grows its batches towards batch.size (1 MB), and a letter larger than
            # the whole budget can never be written (a fresh clone's CI: ~800 kB batches).
            ProducerLoad(
                "d1", agent.bootstrap, doomed, 3, 3 * RATE, settings={"batch.size": 65536}
            ).start(),
        ]
        time.sleep(4.0)
        assert [load.stop() for load in stored] == [0, 0]
        agent.kill()
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.delete_topics([doomed])[doomed].result(timeout=30)
        wait_for(lambda: doomed not in kafka_cluster.topics(), timeout=30, what="the deletion")

        agent.kafka_bootstrap = kafka_cluster.bootstrap
        agent.start()
        fresh = ProducerLoad("k2", agent.bootstrap, keep, 3, RATE).start()
        time.sleep(4.0)
        assert fresh.stop() == 0
        keep_loads = [stored[0], fresh]
        acked = sum(len(load.acked) for load in keep_loads)
        consumed = consume_all(kafka_cluster.bootstrap, keep, expected=acked, timeout=60)
        result = grade(consumed, keep_loads)
        print(f"\nkept topic: {result.summary()}")
        assert not result.lost and not result.damaged and not result.order_violations
        assert result.duplicates == 0

        letters = tmp_path / "volume" / "dead-letter"
        wait_for(
            lambda: (
                agent.metrics().get(
                    'durable_agent_dead_letters_total{reason="UNKNOWN_TOPIC_OR_PARTITION"}', 0
                )
                > 0
            ),
            timeout=120,
            interval=1.0,
            what=f"dead letters for the deleted topic; log:\n{agent.log_tail()}",
        )
        time.sleep(3.0)
        size = sum(path.stat().st_size for path in letters.rglob("*") if path.is_file())
        doomed_records = len(stored[1].acked)
        lettered = agent.metrics()[
            'durable_agent_dead_letters_total{reason="UNKNOWN_TOPIC_OR_PARTITION"}'
        ]
        print(f"dead letters: {lettered:.0f} of {doomed_records} records, {size} bytes")
        assert size <= budget
        assert 0 < lettered < doomed_records, "the budget stopped the letters, not the backlog"
        assert agent.is_ready(), "the agent still serves"
