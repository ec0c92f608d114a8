"""One fault, played twice at once: through a real agent process, and straight to Kafka.

Two 3-broker mock clusters run side by side (``MockCluster``): clients produce through an
agent (``AgentProcess``) to the first, and the same clients produce directly, with the same
idempotent settings, to the second: the *control*. The fault is applied to both clusters at
the same moment, each on its own thread, so injected request errors are not shared between
the two. Afterwards the agent drains, both topics are read back and graded
(``cluster_load.grade``). The control tells what the mock cluster itself does to a plain
producer under the fault: DESIGN.md saw the mock lose records a direct producer had been told
were delivered; where the control loses records, the agent is not graded on loss.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.mock_cluster import MockCluster
from durable_producer.local.topics import consume_all

from .cluster_load import Grade, ProducerLoad, grade
from .raw_fetch import SequenceAnomalies, sequence_anomalies, stored_batches

Fault = Callable[[MockCluster, str], None]
"""Applies a fault to one cluster (and its topic); returns when the fault is over."""

TOPIC = "events"
PARTITIONS = 3
BROKERS = 3


def leader_of(partition: int) -> int:
    """Where each partition's leader is placed at the start: spread over the brokers."""
    return partition % BROKERS + 1


@dataclass
class Side:
    name: str
    cluster: MockCluster
    loads: list[ProducerLoad]
    grade: Grade | None = None
    anomalies: dict[int, SequenceAnomalies] = field(default_factory=dict)
    """By partition: what the mock stored that a real broker would have refused."""
    resumed_after_s: float | None = None
    """First delivery after the fault ended, in seconds (0: it never stopped)."""

    def judge(self, refusals: int = 0) -> Judgement:
        """Loss, damage and order, with what the mock's own misbehaviour explains.
        ``refusals``: records Kafka refused and the agent retried (they may land late)."""
        assert self.grade is not None
        judgement = Judgement()
        grade = self.grade
        if grade.damaged or grade.unexpected:
            judgement.failures.append(
                f"{len(grade.damaged)} damaged, {len(grade.unexpected)} unexpected records"
            )
        lost_by_partition: dict[int, int] = {}
        for key in grade.lost:
            lost_by_partition[int(key.rsplit("-", 1)[1]) % PARTITIONS] = (
                lost_by_partition.get(int(key.rsplit("-", 1)[1]) % PARTITIONS, 0) + 1
            )
        for partition, lost in sorted(lost_by_partition.items()):
            gaps = self.anomalies.get(partition, SequenceAnomalies(0, 0)).gap_records
            if grade.low_watermarks.get(partition, 0) > 0:
                judgement.explained.append(
                    f"partition {partition}: the mock dropped the log below offset"
                    f" {grade.low_watermarks[partition]}"
                )
            elif lost > gaps:
                judgement.unexplained_loss += lost - gaps
                judgement.failures.append(
                    f"partition {partition}: {lost} acknowledged records lost, {gaps} explained"
                    f" by sequence gaps the mock accepted; e.g. {grade.lost[:5]}"
                )
            else:
                judgement.explained.append(
                    f"partition {partition}: {lost} records lost in a sequence gap the mock"
                    " accepted (a real broker answers OUT_OF_ORDER_SEQUENCE_NUMBER)"
                )
        unexplained = []
        for violation in grade.order_violations:
            partition = int(violation.rsplit("/", 1)[1])
            anomalies = self.anomalies.get(partition, SequenceAnomalies(0, 0))
            if anomalies.gap_records or anomalies.reordered_batches:
                judgement.explained.append(
                    f"{violation}: out of order after a sequence gap the mock accepted"
                )
            else:
                unexplained.append(violation)
        if unexplained and grade.displaced <= refusals:
            judgement.explained.append(
                f"{grade.displaced} records out of order in {unexplained}: refused by Kafka"
                f" and retried ({refusals} refusals), they landed after later records"
            )
        elif unexplained:
            judgement.failures.append(f"{unexplained}: records out of produce order")
        return judgement

    @property
    def mock_rewritten(self) -> int:
        return sum(anomaly.rewritten_records for anomaly in self.anomalies.values())

    @property
    def mock_skipped(self) -> int:
        return sum(anomaly.gap_records for anomaly in self.anomalies.values())


@dataclass
class Judgement:
    failures: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)
    unexplained_loss: int = 0


@dataclass
class Outcome:
    agent: Side
    direct: Side
    fault_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    """The agent's metrics once it had forwarded everything, before it stopped."""
    agent_exit: int | None = None
    agent_log: str = ""

    def metric(self, name: str, **labels: str) -> float:
        """A sample of ``metrics``; without labels, the sum over all of the family's labels."""
        if labels:
            inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
            return self.metrics.get(f"{name}{{{inner}}}", 0.0)
        return sum(
            value
            for key, value in self.metrics.items()
            if key == name or key.startswith(name + "{")
        )

    @property
    def counted_duplicates(self) -> tuple[int, int]:
        """(certain, possible) duplicates the agent counted."""
        return (
            int(self.metric("durable_agent_replayed_duplicates_total")),
            int(self.metric("durable_agent_possible_duplicates_total")),
        )

    @property
    def refusals(self) -> int:
        """Record refusals the agent's Kafka client reported (delivery errors)."""
        return int(
            sum(
                value
                for key, value in self.metrics.items()
                if key.startswith("durable_agent_kafka_errors_total{") and 'kind="delivery"' in key
            )
        )

    @property
    def agent_duplicates(self) -> int:
        """Copies a consumer sees that the agent's re-sending made (the mock's own rewrites
        of a retried request, which a real broker refuses, taken out)."""
        assert self.agent.grade is not None
        # mock_rewritten counts rewritten sequence numbers, an upper bound of the copies they
        # made (a rewrite whose first copy was never stored makes none): never below zero.
        return max(0, self.agent.grade.duplicates - self.agent.mock_rewritten)

    def judge(self) -> Judgement:
        """The agent's verdict. Loss is graded only where the control lost nothing that the
        mock's known misbehaviour does not explain."""
        judgement = self.agent.judge(refusals=self.refusals)
        control = self.direct.judge()
        if control.unexplained_loss:
            judgement.explained.append(
                f"not graded on loss: the direct control lost {control.unexplained_loss}"
                " records the mock's sequence gaps do not explain"
            )
            judgement.failures = [f for f in judgement.failures if "lost" not in f]
        certain, possible = self.counted_duplicates
        seen = self.agent_duplicates
        if not certain <= seen <= certain + possible:
            judgement.failures.append(
                f"a consumer sees {seen} duplicates made by the agent; it counted {certain}"
                f" certain and {possible} possible"
            )
        return judgement

    def report(self, title: str) -> str:
        certain, possible = self.counted_duplicates
        lines = [f"{title}: fault {self.fault_s:.1f} s"]
        for side in (self.agent, self.direct):
            assert side.grade is not None
            fatal = [f"{load.name}: {load.fatal}" for load in side.loads if load.fatal]
            lines.append(
                f"  {side.name:<6}: {side.grade.summary()}; resumed after"
                f" {side.resumed_after_s} s; mock accepted {side.mock_skipped} skipped"
                f" and {side.mock_rewritten} rewritten sequence numbers"
                + (f"; clients failed fatally: {fatal}" if fatal else "")
            )
        lines.append(
            f"  agent counted duplicates: {certain} certain, {possible} possible"
            f" (made by the agent: {self.agent_duplicates});"
            f" producer resets {int(self.metric('durable_agent_producer_resets_total'))};"
            f" dead letters {int(self.metric('durable_agent_dead_letters_total'))};"
            f" refusals {self.refusals}"
        )
        judgement = self.judge()
        lines += [f"  explained: {note}" for note in judgement.explained]
        lines += [f"  FAILED: {failure}" for failure in judgement.failures]
        return "\n".join(lines)


def _prepare(cluster: MockCluster) -> None:
    cluster.topic_create(TOPIC, PARTITIONS, BROKERS)
    for partition in range(PARTITIONS):
        cluster.partition_set_leader(TOPIC, partition, leader_of(partition))


def _both(fault: Fault, clusters: list[MockCluster]) -> None:
    failures: list[BaseException] = []

    def apply(cluster: MockCluster) -> None:
        try:
            fault(cluster, TOPIC)
        except BaseException as error:  # reported on the test's thread
            failures.append(error)

    threads = [threading.Thread(target=apply, args=(cluster,)) for cluster in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def _forwarded(agent: AgentProcess) -> float:
    return agent.metrics().get("durable_agent_forwarded_records_total", 0.0)


def _agent_resumed(
    agent: AgentProcess, since: float, before: float, timeout: float
) -> float | None:
    deadline = since + timeout
    while time.monotonic() < deadline:
        if _forwarded(agent) > before:
            return round(max(0.0, time.monotonic() - since), 2)
        time.sleep(0.1)
    return None


def _agent_settled(agent: AgentProcess, timeout: float) -> dict[str, float]:
    """Metrics once nothing is in flight or waiting, twice in a row half a second apart."""
    deadline = time.monotonic() + timeout
    quiet = 0
    metrics: dict[str, float] = {}
    while time.monotonic() < deadline:
        metrics = agent.metrics()
        idle = (
            metrics.get("durable_agent_in_flight_records", 1) == 0
            and metrics.get("durable_agent_oldest_unsent_age_seconds", 1) == 0
        )
        quiet = quiet + 1 if idle else 0
        if quiet >= 2:
            return metrics
        time.sleep(0.5)
    raise AssertionError(f"the agent did not forward everything within {timeout}s: {metrics}")


def run_scenario(
    tmp_path: Path,
    fault: Fault,
    *,
    rate: int = 400,
    clients: int = 2,
    warmup_s: float = 1.5,
    after_s: float = 1.0,
    agent_args: list[str] | None = None,
    resume_timeout_s: float = 60.0,
) -> Outcome:
    """Play ``fault`` against an agent and against the control; see the module docstring.

    Data stays well under the mock's 5 MiB per partition: ``clients * rate`` records of
    about 250 bytes a second, over three partitions, for the scenario's few seconds.
    """
    with MockCluster(BROKERS) as agent_cluster, MockCluster(BROKERS) as direct_cluster:
        for cluster in (agent_cluster, direct_cluster):
            _prepare(cluster)
        agent = AgentProcess(
            tmp_path / "volume",
            agent_cluster.bootstrap,
            extra_args=[
                "--checkpoint-interval",
                "1",
                "--drain-timeout",
                "60",
                *(agent_args or []),
            ],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            agent_side = Side(
                "agent",
                agent_cluster,
                [
                    ProducerLoad(f"a{n}", agent.bootstrap, TOPIC, PARTITIONS, rate)
                    for n in range(clients)
                ],
            )
            direct_side = Side(
                "direct",
                direct_cluster,
                [
                    ProducerLoad(f"d{n}", direct_cluster.bootstrap, TOPIC, PARTITIONS, rate)
                    for n in range(clients)
                ],
            )
            loads = agent_side.loads + direct_side.loads
            for load in loads:
                load.start()
            try:
                time.sleep(warmup_s)
                started = time.monotonic()
                _both(fault, [agent_cluster, direct_cluster])
                ended = time.monotonic()
                forwarded = _forwarded(agent)
                agent_side.resumed_after_s = _agent_resumed(
                    agent, ended, forwarded, resume_timeout_s
                )
                time.sleep(after_s)
            finally:
                unflushed = {load.name: load.stop() for load in loads}
            firsts = [load.acked_since(ended) for load in direct_side.loads]
            if all(first is not None for first in firsts):
                direct_side.resumed_after_s = round(max(0.0, min(firsts) - ended), 2)  # type: ignore[type-var]
            outcome = Outcome(agent_side, direct_side, fault_s=ended - started)
            outcome.metrics = _agent_settled(agent, timeout=90)
            outcome.agent_exit = agent.stop(timeout=90)
        outcome.agent_log = agent.log_path.read_text(errors="replace")
        through_agent = {load.name: unflushed[load.name] for load in agent_side.loads}
        assert not any(through_agent.values()), f"the agent never acknowledged: {through_agent}"
        for side in (agent_side, direct_side):
            lows = {p: side.cluster.low_watermark(TOPIC, p) for p in range(PARTITIONS)}
            consumed = consume_all(side.cluster.bootstrap, TOPIC, timeout=60, idle=1.0)
            side.grade = grade(consumed, side.loads, lows)
            for partition in range(PARTITIONS):
                batches = stored_batches(side.cluster.bootstrap, TOPIC, partition)
                side.anomalies[partition] = sequence_anomalies(batches)
    return outcome
