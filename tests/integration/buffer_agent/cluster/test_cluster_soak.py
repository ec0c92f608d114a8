"""Chaos soak (slow, not in CI): random cluster faults and agent kill -9 for half an hour.

Two clients produce through a real agent process to a 3-broker mock cluster while, every few
seconds, one fault from the fault tests hits (a leader move, a broker down, all brokers down,
slow brokers, an error injected on Produce requests) or the agent is SIGKILLed and restarted.
At the end it prints what was acknowledged, delivered, lost (must be 0 apart from what the
mock's accepted sequence gaps explain), the duplicates (seen, and counted by the agent as
certain and possible) and the longest stall (the oldest unsent record's age, at its worst).

``SOAK_MINUTES`` sets the length (default 30); ``SOAK_SEED`` replays a run.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.mock_cluster import API_PRODUCE, MockCluster
from durable_producer.local.topics import consume_all
from support.cluster_load import ProducerLoad, grade
from support.cluster_scenario import Side
from support.raw_fetch import sequence_anomalies, stored_batches

MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(int(MINUTES * 60) + 900),  # the soak, then up to 15 min to drain
]

TOPIC = "soak"
PARTITIONS = 24  # the mock keeps ~5 MiB per partition: 30 min of this load is ~3 MiB each
RATE = 75
ERRORS = (
    "NOT_ENOUGH_REPLICAS",
    "REQUEST_TIMED_OUT",
    "UNKNOWN_PRODUCER_ID",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "INVALID_PRODUCER_EPOCH",
    "MSG_SIZE_TOO_LARGE",
    "TOPIC_AUTHORIZATION_FAILED",
)
COUNTED = (
    "durable_agent_replayed_duplicates_total",
    "durable_agent_possible_duplicates_total",
    "durable_agent_dead_letters_total",
    "durable_agent_producer_resets_total",
)


class Watch:
    """Samples the agent every second: the worst stall, and the counters of each run (an
    agent's counters start at 0 again after a restart)."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.longest_unsent_age = 0.0
        self.longest_without_delivery = 0.0
        self.totals: Counter[str] = Counter()
        self.refusals = 0.0
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def sample(self) -> None:
        try:
            metrics = self.agent.metrics()
        except OSError:
            return
        with self._lock:
            self._last = metrics
            self.longest_unsent_age = max(
                self.longest_unsent_age, metrics.get("durable_agent_oldest_unsent_age_seconds", 0)
            )
            if metrics.get("durable_agent_in_flight_records", 0):
                self.longest_without_delivery = max(
                    self.longest_without_delivery,
                    metrics.get("durable_agent_seconds_since_last_delivery", 0),
                )

    def end_of_run(self) -> None:
        """Add the run's counters, just before it is killed or stopped."""
        self.sample()
        with self._lock:
            for name in COUNTED:
                self.totals[name] += sum(
                    value for key, value in self._last.items() if key.startswith(name)
                )
            self.refusals += sum(
                value
                for key, value in self._last.items()
                if key.startswith("durable_agent_kafka_errors_total{") and 'kind="delivery"' in key
            )
            self._last = {}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()


def _faults(
    cluster: MockCluster, agent: AgentProcess, watch: Watch, rng: random.Random
) -> dict[str, Callable[[], None]]:
    def leader_move() -> None:
        for partition in rng.sample(range(PARTITIONS), 6):
            cluster.partition_set_leader(TOPIC, partition, rng.choice(cluster.broker_ids))

    def broker_down() -> None:
        broker = rng.choice(cluster.broker_ids)
        others = [b for b in cluster.broker_ids if b != broker]
        with cluster.brokers_down([broker]):
            time.sleep(1.0)
            for partition in range(PARTITIONS):  # the controller elects new leaders
                cluster.partition_set_leader(TOPIC, partition, others[partition % 2])
            time.sleep(rng.uniform(3, 9))

    def all_down() -> None:
        with cluster.brokers_down(cluster.broker_ids):
            time.sleep(rng.uniform(5, 15))

    def slow() -> None:
        with cluster.slow(1500):
            time.sleep(rng.uniform(5, 10))

    def request_errors() -> None:
        error = getattr(KafkaError, rng.choice(ERRORS))
        cluster.push_request_errors(API_PRODUCE, [error] * rng.randint(1, 10))

    def kill_agent() -> None:
        watch.end_of_run()
        agent.restart()

    return {
        "leader move": leader_move,
        "broker down": broker_down,
        "all brokers down": all_down,
        "slow brokers": slow,
        "request errors": request_errors,
        "agent kill -9": kill_agent,
    }


def test_chaos_soak(tmp_path: Path) -> None:
    minutes = MINUTES
    seed = int(os.environ.get("SOAK_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    applied: Counter[str] = Counter()
    with MockCluster(3) as cluster:
        cluster.topic_create(TOPIC, PARTITIONS, 3)
        agent = AgentProcess(
            tmp_path / "volume",
            cluster.bootstrap,
            extra_args=["--checkpoint-interval", "2", "--drain-timeout", "120"],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            watch = Watch(agent).start()
            loads = [
                ProducerLoad(f"s{n}", agent.bootstrap, TOPIC, PARTITIONS, RATE, value_size=150)
                for n in range(2)
            ]
            for load in loads:
                load.start()
            faults = _faults(cluster, agent, watch, rng)
            deadline = time.monotonic() + minutes * 60
            try:
                while time.monotonic() < deadline:
                    time.sleep(rng.uniform(3, 12))
                    name = rng.choice(list(faults))
                    faults[name]()
                    applied[name] += 1
                for broker in cluster.broker_ids:
                    cluster.broker_set_rtt(broker, 0)
                cluster.clear_request_errors(API_PRODUCE)
                time.sleep(5)
            finally:
                unflushed = [load.stop(flush_timeout=300) for load in loads]
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                metrics = agent.metrics()
                if not metrics.get("durable_agent_in_flight_records", 1) and not metrics.get(
                    "durable_agent_oldest_unsent_age_seconds", 1
                ):
                    break
                time.sleep(1)
            watch.end_of_run()
            watch.stop()
            assert agent.stop(timeout=180) == 0, agent.log_tail()
        consumed = consume_all(cluster.bootstrap, TOPIC, timeout=300, idle=3)
        side = Side("agent", cluster, loads)
        side.grade = grade(
            consumed, loads, {p: cluster.low_watermark(TOPIC, p) for p in range(PARTITIONS)}
        )
        for partition in range(PARTITIONS):
            batches = stored_batches(cluster.bootstrap, TOPIC, partition)
            side.anomalies[partition] = sequence_anomalies(batches)
    result = side.grade
    certain = int(watch.totals["durable_agent_replayed_duplicates_total"])
    possible = int(watch.totals["durable_agent_possible_duplicates_total"])
    made = result.duplicates - side.mock_rewritten
    judgement = side.judge(refusals=int(watch.refusals))
    print(
        f"\nchaos soak {minutes:.0f} min (seed {seed}): faults {dict(applied)}\n"
        f"  acknowledged {result.acknowledged}, delivered {result.delivered},"
        f" lost {len(result.lost)} (unexplained {judgement.unexplained_loss}),"
        f" duplicates {result.duplicates} (by the agent {made}, mock rewrites"
        f" {side.mock_rewritten}; counted {certain} certain + {possible} possible),"
        f" out of order {result.displaced}, dead letters"
        f" {int(watch.totals['durable_agent_dead_letters_total'])}, producer resets"
        f" {int(watch.totals['durable_agent_producer_resets_total'])}\n"
        f"  longest stall: oldest unsent record {watch.longest_unsent_age:.1f} s, no delivery"
        f" with records in flight for {watch.longest_without_delivery:.1f} s\n"
        + "\n".join(f"  explained: {note}" for note in judgement.explained)
    )
    assert not any(unflushed), "the agent never acknowledged some records"
    assert judgement.unexplained_loss == 0
    assert not judgement.failures, "\n".join(judgement.failures)
    assert certain <= made <= certain + possible
