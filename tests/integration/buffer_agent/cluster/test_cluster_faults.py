"""The forwarder against a 3-broker cluster with faults, one test per fault class.

Each test plays one fault (``support.cluster_scenario``): two clients produce through a real
agent process to librdkafka's mock cluster while the same two clients produce directly to a
second mock cluster as the control, and the fault hits both clusters at once. Then:

- every record the agent acknowledged arrives with identical content (key, value, headers,
  timestamp, partition), and nothing nobody sent;
- each client's records keep their order in every partition;
- the duplicates the agent made are within what it counted: at least its certain count, at
  most certain + possible;
- forwarding resumes within ``RESUME_WITHIN_S`` after the fault ends.

The mock accepts an idempotent producer's batch after a gap in its sequence numbers (a real
broker answers OUT_OF_ORDER_SEQUENCE_NUMBER) and librdkafka then takes the gap's records as
delivered: losses and reordering the stored batches show to come from that are reported,
not failed (``Side.judge``); where the direct control loses records nothing explains, the
agent is not graded on loss. docs/failure-semantics.md has the per-fault results.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from durable_producer.local.mock_cluster import API_PRODUCE, MockCluster
from support.cluster_scenario import (
    BROKERS,
    PARTITIONS,
    Fault,
    Outcome,
    leader_of,
    run_scenario,
)

pytestmark = pytest.mark.integration

RESUME_WITHIN_S = {
    "leader move": 5.0,
    "one broker down": 5.0,
    "request errors": 10.0,
    "slow brokers": 5.0,
    "all brokers down": 15.0,
}
"""How soon after the fault ends the agent forwards again (librdkafka reconnects with a
backoff of up to ``reconnect.backoff.max.ms``, 10 s by default)."""
INJECTED = 5
"""Produce requests answered with the error under test."""


def _check(outcome: Outcome, title: str, fault_class: str) -> None:
    print("\n" + outcome.report(title))
    assert outcome.agent_exit == 0, outcome.agent_log[-3000:]
    judgement = outcome.judge()
    assert not judgement.failures, "\n".join(judgement.failures)
    resumed = outcome.agent.resumed_after_s
    assert resumed is not None and resumed <= RESUME_WITHIN_S[fault_class], (
        f"forwarding resumed after {resumed} s"
    )


# --------------------------------------------------------------------- the faults
def move_leaders(cluster: MockCluster, topic: str) -> None:
    """Every partition's leader moves to the next broker, half a second apart (a rolling
    restart's leader elections)."""
    for partition in range(PARTITIONS):
        cluster.partition_set_leader(topic, partition, leader_of(partition) % BROKERS + 1)
        time.sleep(0.5)


def one_broker_down(cluster: MockCluster, topic: str) -> None:
    """Broker 1 goes down for 10 s; a second later its partitions get a new leader (as the
    controller would elect); when it is back, the preferred leader is restored."""
    cluster.broker_set_down(1)
    time.sleep(1.0)
    moved = [p for p in range(PARTITIONS) if leader_of(p) == 1]
    for partition in moved:
        cluster.partition_set_leader(topic, partition, 2)
    time.sleep(9.0)
    cluster.broker_set_up(1)
    for partition in moved:
        cluster.partition_set_leader(topic, partition, 1)


def all_brokers_down(cluster: MockCluster, topic: str) -> None:
    with cluster.brokers_down(cluster.broker_ids):
        time.sleep(15.0)


def slow_brokers(cluster: MockCluster, topic: str) -> None:
    with cluster.slow(1500):
        time.sleep(10.0)


def request_errors(code: int) -> Fault:
    def inject(cluster: MockCluster, topic: str) -> None:
        cluster.push_request_errors(API_PRODUCE, [code] * INJECTED)
        time.sleep(1.0)

    return inject


# --------------------------------------------------------------------- the tests
def test_leader_move_under_load(tmp_path: Path) -> None:
    outcome = run_scenario(tmp_path, move_leaders)
    _check(outcome, "leader move under load", "leader move")
    assert outcome.counted_duplicates == (0, 0)


def test_one_broker_down_for_10_seconds(tmp_path: Path) -> None:
    outcome = run_scenario(tmp_path, one_broker_down)
    _check(outcome, "one broker down 10 s", "one broker down")


def test_all_brokers_down_for_15_seconds(tmp_path: Path) -> None:
    outcome = run_scenario(tmp_path, all_brokers_down)
    _check(outcome, "all brokers down 15 s", "all brokers down")
    assert outcome.metric(
        "durable_agent_kafka_errors_total", kind="transport", error="NETWORK_EXCEPTION"
    )
    log_lines = outcome.agent_log.splitlines()
    client_lines = [line for line in log_lines if "Kafka client" in line or "|FAIL|" in line]
    assert len(client_lines) <= 6, "one line per state change, not one per failure"
    assert "forwarder state delivering -> kafka_unreachable" in outcome.agent_log
    assert "CONFWARN" not in outcome.agent_log


def test_slow_brokers_rtt_1_5_s_for_10_seconds(tmp_path: Path) -> None:
    outcome = run_scenario(tmp_path, slow_brokers)
    _check(outcome, "RTT 1.5 s for 10 s", "slow brokers")


@pytest.mark.parametrize(
    "error",
    [
        "NOT_ENOUGH_REPLICAS",
        "REQUEST_TIMED_OUT",
        "UNKNOWN_PRODUCER_ID",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "INVALID_PRODUCER_EPOCH",
        "MSG_SIZE_TOO_LARGE",
        "TOPIC_AUTHORIZATION_FAILED",
    ],
)
def test_request_errors_on_produce(tmp_path: Path, error: str) -> None:
    outcome = run_scenario(tmp_path, request_errors(getattr(KafkaError, error)))
    _check(outcome, f"{error} x{INJECTED} on Produce", "request errors")
    # Refusals that clear within the retry window (ACLs propagating, a topic's size limit
    # raised again) are retried, not dead-lettered, and keep their place: only records in
    # flight behind a refused request (one record each, at most 5 requests per connection
    # once the forwarder isolates records) can overtake a retried one.
    assert outcome.metric("durable_agent_dead_letters_total") == 0
    assert outcome.agent.grade is not None
    assert outcome.agent.grade.displaced <= 5 * INJECTED
