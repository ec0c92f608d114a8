"""The broker a forwarding benchmark runs against, and what that broker cost.

``mock`` (the default): librdkafka's mock cluster of 3 brokers in a child process
(``local.mock_cluster``): C, fast, and bounded in memory (it keeps about 5 MB per partition
and silently drops older batches, so a benchmark checks the *high* watermark, which counts
every record ever appended, never the records still held). It is not the bottleneck of a
forwarder written in Python, so figures against it measure the forwarder.

``kafka``: one Apache Kafka node (KRaft, ``local.broker.KafkaBroker``) behind the fault proxy;
records go to its disk, so one broker serves every measurement. A JVM on the same two cores:
figures against it include what the broker itself costs.

``Broker.usage()`` reads the broker process's CPU seconds and resident memory from /proc.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from durable_producer.local.broker import ProxiedBroker
from durable_producer.local.kafka_node import JVM_OPTIONS, KAFKA_START_SCRIPT_JVM_OPTIONS
from durable_producer.local.mock_cluster import MockCluster
from durable_producer.local.topics import create_topic

BROKERS = ("mock", "kafka")
BROKER_JVMS = {"kafka": KAFKA_START_SCRIPT_JVM_OPTIONS, "test-bed": JVM_OPTIONS}
"""``--broker-jvm`` of the benchmarks that compare with a Kafka broker: the JVM options of
Kafka's own start script (C2, G1, 1 GB heap; their default, a fair opponent), or the small
C1-only JVM the tests start (fast to start, slower under load)."""
MOCK_BROKERS = 3
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    rss_mb: float
    peak_rss_mb: float

    def since(self, before: Usage) -> str:
        return (
            f"broker cpu {self.cpu_s - before.cpu_s:5.2f} s, rss {self.rss_mb:6.0f} MB"
            f" (peak {self.peak_rss_mb:.0f} MB)"
        )


def process_usage(pid: int) -> Usage:
    """CPU (user + system) and resident memory of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )

    def megabytes(key: str) -> float:
        return int(status.get(key, "0 kB").split()[0]) / 1024

    return Usage(cpu, megabytes("VmRSS"), megabytes("VmHWM"))


class Broker:
    """One running broker of either kind; ``outage()`` makes every broker unreachable."""

    def __init__(self, kind: str) -> None:
        if kind not in BROKERS:
            raise SystemExit(f"--broker {kind}: choose one of {', '.join(BROKERS)}")
        self.kind = kind
        self._mock: MockCluster | None = None
        self._kafka: ProxiedBroker | None = None

    @property
    def fresh_per_measurement(self) -> bool:
        """A broker that keeps every record in memory would need a new one per measurement;
        both kinds here keep theirs bounded (the mock) or on disk (Kafka)."""
        return False

    @property
    def description(self) -> str:
        if self.kind == "mock":
            return f"librdkafka mock cluster, {MOCK_BROKERS} brokers (bounded memory)"
        return "Apache Kafka, one KRaft node, behind the fault proxy"

    def __enter__(self) -> Broker:
        if self.kind == "mock":
            self._mock = MockCluster(MOCK_BROKERS).start()
        else:
            self._kafka = ProxiedBroker().start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._mock is not None:
            self._mock.stop()
        if self._kafka is not None:
            self._kafka.stop()

    @property
    def bootstrap(self) -> str:
        if self._mock is not None:
            return self._mock.bootstrap
        assert self._kafka is not None
        return self._kafka.bootstrap

    @property
    def pid(self) -> int:
        if self._mock is not None:
            pid = self._mock.pid
        else:
            assert self._kafka is not None and self._kafka.broker is not None
            process = self._kafka.broker.process
            pid = None if process is None else process.pid
        assert pid is not None
        return pid

    def usage(self) -> Usage:
        return process_usage(self.pid)

    def create_topic(self, topic: str, partitions: int) -> None:
        if self._mock is not None:
            self._mock.topic_create(topic, partitions, MOCK_BROKERS)
        else:
            create_topic(self.bootstrap, topic, partitions)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Every broker unreachable for the block: the mock's brokers down (connections
        closed, new ones refused), or Kafka's proxy cut."""
        if self._mock is not None:
            with self._mock.brokers_down(self._mock.broker_ids):
                yield
        else:
            assert self._kafka is not None
            self._kafka.proxy.cut()
            try:
                yield
            finally:
                self._kafka.proxy.restore()

    def appended(self, topic: str, partitions: int) -> int:
        """Records ever appended to ``topic``: the sum of its high watermarks (the mock drops
        old batches but never lowers them)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench"})
        try:
            return sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)
            )
        finally:
            consumer.close()


def brokers_for(kind: str, measurements: int, *topics: str) -> Iterator[tuple[int, Broker]]:
    """A broker for each of ``measurements`` (the same one for all, unless the kind needs a
    fresh one per measurement); ``topics`` (1 partition) are created on each (a warm-up topic)."""
    shared = not Broker(kind).fresh_per_measurement
    with contextlib.ExitStack() as stack:
        broker: Broker | None = None
        for index in range(measurements):
            if broker is None or not shared:
                stack.close()
                broker = stack.enter_context(Broker(kind))
                for topic in topics:
                    broker.create_topic(topic, 1)
                print(f"broker: {broker.description}, pid {broker.pid}", flush=True)
            yield index, broker
