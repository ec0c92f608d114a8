"""The 3-node Apache Kafka cluster of the fault tests: replicated as configured, and its faults
(kill -9 and SIGSTOP of a leader, a replica down, a rolling restart) behave as Kafka's do. Each
test leaves the cluster healed (the ``kafka_cluster`` fixture)."""

from __future__ import annotations

import pytest

from support.broker import KafkaCluster, consume_all
from support.kafka_clients import produce_values
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for

pytestmark = pytest.mark.integration

ACKS_ALL = {"acks": "all", "enable.idempotence": True, "linger.ms": 5}
# No retries: the first answer of the broker is the delivery report's error.
ACKS_ALL_NO_RETRIES = {"acks": "all", "enable.idempotence": False, "retries": 0}


def values(start: int, count: int) -> list[bytes]:
    return [b"%d" % index for index in range(start, start + count)]


def test_topics_are_replicated_three_times_with_every_replica_in_sync(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory
) -> None:
    topic = new_topic(3, bootstrap=kafka_cluster.bootstrap)
    partitions = kafka_cluster.partitions(topic)
    assert sorted(partitions) == [0, 1, 2]
    for state in partitions.values():
        assert sorted(state.replicas) == [0, 1, 2] and state.isr_full
    assert {state.leader for state in partitions.values()} == {0, 1, 2}, "leaders spread out"
    assert kafka_cluster.broker_ids() == {0, 1, 2}


def test_a_killed_leader_is_replaced_and_no_acknowledged_record_is_lost(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory
) -> None:
    topic = new_topic(1, bootstrap=kafka_cluster.bootstrap)
    before = produce_values(kafka_cluster.bootstrap, topic, values(0, 2000), ACKS_ALL)
    assert len(before.delivered) == 2000 and not before.errors
    leader = kafka_cluster.leader_of(topic)

    leader.kill()
    state = wait_for(
        lambda: (s := kafka_cluster.partition(topic)).leader not in (-1, leader.node_id) and s,
        timeout=60,
        interval=0.2,
        what="a new leader",
    )
    assert leader.node_id not in state.isr, "the killed broker left the ISR"
    after = produce_values(kafka_cluster.bootstrap, topic, values(2000, 2000), ACKS_ALL)
    assert len(after.delivered) == 2000 and not after.errors, "min.insync.replicas=2 still met"

    consumed = consume_all(kafka_cluster.bootstrap, topic, expected=4000)
    assert sorted(record.value for record in consumed) == sorted(values(0, 4000))


def test_a_suspended_leader_is_fenced_and_comes_back_into_the_isr(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory
) -> None:
    topic = new_topic(1, bootstrap=kafka_cluster.bootstrap)
    leader = kafka_cluster.leader_of(topic)
    leader.suspend()
    try:
        wait_for(
            lambda: kafka_cluster.partition(topic).leader not in (-1, leader.node_id),
            timeout=60,
            interval=0.2,
            what="leadership to move off the SIGSTOPped broker",
        )
        during = produce_values(kafka_cluster.bootstrap, topic, values(0, 500), ACKS_ALL)
        assert len(during.delivered) == 500 and not during.errors
    finally:
        leader.resume()
    kafka_cluster.wait_for_full_isr([topic], timeout=60)
    assert leader.node_id in kafka_cluster.partition(topic).isr


def test_a_replica_down_refuses_acks_all_below_min_insync_replicas(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory
) -> None:
    """RF 3, min ISR 2: one broker down still takes acks=all. RF 2, min ISR 2: the follower down
    gives the real NOT_ENOUGH_REPLICAS. (Two of three nodes down would also lose the KRaft
    quorum, which then cannot even shrink the ISR.)"""
    three = new_topic(1, bootstrap=kafka_cluster.bootstrap)
    two = new_topic(1, replication_factor=2, bootstrap=kafka_cluster.bootstrap)
    state = kafka_cluster.partition(two)
    follower = next(replica for replica in state.replicas if replica != state.leader)

    kafka_cluster.stop(follower)  # controlled shutdown: out of every ISR at once
    wait_for(
        lambda: kafka_cluster.partition(two).isr == (state.leader,),
        timeout=30,
        interval=0.2,
        what="the ISR to shrink to the leader",
    )
    refused = produce_values(kafka_cluster.bootstrap, two, [b"refused"], ACKS_ALL_NO_RETRIES)
    taken = produce_values(kafka_cluster.bootstrap, three, [b"taken"], ACKS_ALL_NO_RETRIES)

    assert refused.errors == {"NOT_ENOUGH_REPLICAS": 1}
    assert taken.delivered == [b"taken"] and not taken.errors


def test_a_rolling_restart_keeps_every_acknowledged_record(
    kafka_cluster: KafkaCluster, new_topic: TopicFactory
) -> None:
    topic = new_topic(3, bootstrap=kafka_cluster.bootstrap)
    before = produce_values(kafka_cluster.bootstrap, topic, values(0, 3000), ACKS_ALL)
    assert len(before.delivered) == 3000
    pids = [node.process.pid for node in kafka_cluster.nodes if node.process is not None]

    kafka_cluster.rolling_restart([topic])

    assert all(node.running for node in kafka_cluster.nodes)
    restarted = [node.process.pid for node in kafka_cluster.nodes if node.process is not None]
    assert not set(pids) & set(restarted), "every node was restarted"
    after = produce_values(kafka_cluster.bootstrap, topic, values(3000, 1000), ACKS_ALL)
    assert len(after.delivered) == 1000
    consumed = consume_all(kafka_cluster.bootstrap, topic, expected=4000)
    assert sorted(record.value for record in consumed) == sorted(values(0, 4000))
