"""The broker a forwarding benchmark runs against, and what that broker cost.

``mock`` (the default): librdkafka's mock cluster of 3 brokers in a child process
(``local.mock_cluster``): C, fast, and bounded in memory (it keeps about 5 MB per partition
and silently drops older batches, so a benchmark checks the *high* watermark, which counts
every record ever appended, never the records still held). It is not the bottleneck of a
forwarder written in Python, so figures against it measure the forwarder.

``kafka``: one Apache Kafka node (KRaft, ``local.broker.KafkaBroker``); records go to its
disk, so one broker serves every measurement. A JVM on the same two cores: figures against it
include what the broker itself costs. Clients connect to it directly, unless the benchmark
needs ``outage()`` (``brokers_for(..., proxied=True)``): then through the fault proxy, an
asyncio thread of the benchmark's own process that relays every byte (its CPU and its hold
on the GIL then fall on the sides that run in that process, the Python loops).

``cluster``: three Apache Kafka nodes (``local.kafka_cluster.KafkaCluster``, KRaft), every topic
with replication factor 3 and ``min.insync.replicas=2``, clients at acks=all: each record is
written by its leader and fetched by two followers, three JVMs on the same two cores. Clients
connect straight to the nodes (no fault proxy, so no ``outage()``).

``Broker.usage()`` reads the broker process's CPU seconds and resident memory from /proc (for
the cluster: summed over the three JVMs). ``CpuTrace`` samples its CPU seconds every 20 ms
while a side runs, to count them over the side's timed span alone (its start, warm-up and
exit left out).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from durable_producer.local.broker import KafkaBroker, ProxiedBroker
from durable_producer.local.kafka_cluster import KafkaCluster
from durable_producer.local.kafka_node import JVM_OPTIONS, KAFKA_START_SCRIPT_JVM_OPTIONS
from durable_producer.local.mock_cluster import MockCluster
from durable_producer.local.topics import create_topic

BROKERS = ("mock", "kafka", "cluster")
CLUSTER_REPLICATION = 3
CLUSTER_MIN_INSYNC = "2"
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
    system_s: float = 0.0
    """Of ``cpu_s``, the kernel's on the process's behalf (its writes to the page cache,
    socket reads, page faults): most of a Kafka broker's CPU for large batches."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.cpu_s + other.cpu_s,
            self.rss_mb + other.rss_mb,
            self.peak_rss_mb + other.peak_rss_mb,
            self.system_s + other.system_s,
        )

    def since(self, before: Usage) -> str:
        return (
            f"broker cpu {self.cpu_s - before.cpu_s:5.2f} s"
            f" (kernel {self.system_s - before.system_s:5.2f}), rss {self.rss_mb:6.0f} MB"
            f" (peak {self.peak_rss_mb:.0f} MB)"
        )


class CpuTrace:
    """CPU seconds of ``read`` (a broker's, ``Broker.usage``) sampled every ``interval_s``
    from a thread of its own while in its ``with`` block: ``between`` counts them over a
    span of ``time.perf_counter`` (the system's monotonic clock, which a child process reads
    too), interpolated between the samples around each end."""

    def __init__(self, read: Callable[[], float], interval_s: float = 0.02) -> None:
        self._read = read
        self._interval_s = interval_s
        self._times: list[float] = []
        self._cpu: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-trace", daemon=True)

    def __enter__(self) -> CpuTrace:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        self._times.append(time.perf_counter())
        self._cpu.append(self._read())

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._take()

    def _at(self, moment: float) -> float:
        index = bisect.bisect_left(self._times, moment)
        if index == 0:
            return self._cpu[0]
        if index == len(self._times):
            return self._cpu[-1]
        early, late = self._times[index - 1], self._times[index]
        share = (moment - early) / (late - early) if late > early else 1.0
        return self._cpu[index - 1] + share * (self._cpu[index] - self._cpu[index - 1])

    def between(self, start: float, end: float) -> float:
        return self._at(end) - self._at(start)


def process_usage(pid: int) -> Usage:
    """CPU (user + system, and system alone) and resident memory of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    system = int(fields[12]) / _TICKS
    cpu = int(fields[11]) / _TICKS + system
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )

    def megabytes(key: str) -> float:
        return int(status.get(key, "0 kB").split()[0]) / 1024

    return Usage(cpu, megabytes("VmRSS"), megabytes("VmHWM"), system)


class Broker:
    """One running broker of either kind; ``outage()`` makes every broker unreachable."""

    def __init__(
        self, kind: str, jvm_options: tuple[str, ...] | None = None, *, proxied: bool = True
    ) -> None:
        """``jvm_options``: the Kafka JVMs' (``BROKER_JVMS``); default the test bed's.
        ``proxied``: the ``kafka`` kind behind the fault proxy (``outage()`` needs it)."""
        if kind not in BROKERS:
            raise SystemExit(f"--broker {kind}: choose one of {', '.join(BROKERS)}")
        self.kind = kind
        self._jvm_options = JVM_OPTIONS if jvm_options is None else jvm_options
        self._mock: MockCluster | None = None
        self._kafka: ProxiedBroker | None = None
        self._direct: KafkaBroker | None = None
        self._proxied = proxied
        self._cluster: KafkaCluster | None = None

    @property
    def fresh_per_measurement(self) -> bool:
        """A broker that keeps every record in memory would need a new one per measurement;
        both kinds here keep theirs bounded (the mock) or on disk (Kafka)."""
        return False

    @property
    def description(self) -> str:
        if self.kind == "mock":
            return f"librdkafka mock cluster, {MOCK_BROKERS} brokers (bounded memory)"
        jvm = f"JVM: {' '.join(self._jvm_options)}"
        if self.kind == "cluster":
            return (
                f"Apache Kafka, 3 KRaft nodes, RF {CLUSTER_REPLICATION},"
                f" min.insync.replicas {CLUSTER_MIN_INSYNC}; {jvm}"
            )
        path = "behind the fault proxy" if self._proxied else "clients connected directly"
        return f"Apache Kafka, one KRaft node, {path}; {jvm}"

    def __enter__(self) -> Broker:
        if self.kind == "mock":
            self._mock = MockCluster(MOCK_BROKERS).start()
        elif self.kind == "cluster":
            self._cluster = KafkaCluster(jvm_options=self._jvm_options).start()
        elif self._proxied:
            self._kafka = ProxiedBroker(jvm_options=self._jvm_options).start()
        else:
            self._direct = KafkaBroker(jvm_options=self._jvm_options).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._mock is not None:
            self._mock.stop()
        if self._kafka is not None:
            self._kafka.stop()
        if self._direct is not None:
            self._direct.close()
        if self._cluster is not None:
            self._cluster.close()

    @property
    def bootstrap(self) -> str:
        if self._mock is not None:
            return self._mock.bootstrap
        if self._cluster is not None:
            return self._cluster.bootstrap
        if self._direct is not None:
            return self._direct.bootstrap
        assert self._kafka is not None
        return self._kafka.bootstrap

    @property
    def pids(self) -> tuple[int, ...]:
        """The broker processes (three for the cluster)."""
        if self._mock is not None:
            pid = self._mock.pid
            assert pid is not None
            return (pid,)
        if self._cluster is not None:
            nodes = [node.process for node in self._cluster.nodes]
        elif self._direct is not None:
            nodes = [self._direct.process]
        else:
            assert self._kafka is not None and self._kafka.broker is not None
            nodes = [self._kafka.broker.process]
        assert all(process is not None for process in nodes)
        return tuple(process.pid for process in nodes if process is not None)

    @property
    def pid(self) -> int:
        return self.pids[0]

    def usage(self) -> Usage:
        total = Usage(0.0, 0.0, 0.0)
        for pid in self.pids:
            total = total + process_usage(pid)
        return total

    def create_topic(self, topic: str, partitions: int) -> None:
        if self._mock is not None:
            self._mock.topic_create(topic, partitions, MOCK_BROKERS)
        elif self._cluster is not None:
            create_topic(
                self.bootstrap,
                topic,
                partitions,
                replication_factor=CLUSTER_REPLICATION,
                config={"min.insync.replicas": CLUSTER_MIN_INSYNC},
            )
            # every node agrees on the leaders before a client is timed against them
            self._cluster.partitions(topic)
        else:
            create_topic(self.bootstrap, topic, partitions)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Every broker unreachable for the block: the mock's brokers down (connections
        closed, new ones refused), or Kafka's proxy cut (the cluster has none)."""
        if self._cluster is not None:
            raise SystemExit("--broker cluster: no outage (no fault proxy in front of it)")
        if self._mock is not None:
            with self._mock.brokers_down(self._mock.broker_ids):
                yield
        else:
            if self._kafka is None:
                raise SystemExit("outage() needs the broker behind the fault proxy (proxied)")
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


def brokers_for(
    kind: str,
    measurements: int,
    *topics: str,
    jvm_options: tuple[str, ...] | None = None,
    proxied: bool = True,
) -> Iterator[tuple[int, Broker]]:
    """A broker for each of ``measurements`` (the same one for all, unless the kind needs a
    fresh one per measurement); ``topics`` (1 partition) are created on each (a warm-up topic).
    ``proxied``: as ``Broker``'s (False where no ``outage()`` is needed)."""
    shared = not Broker(kind).fresh_per_measurement
    with contextlib.ExitStack() as stack:
        broker: Broker | None = None
        for index in range(measurements):
            if broker is None or not shared:
                stack.close()
                broker = stack.enter_context(Broker(kind, jvm_options, proxied=proxied))
                for topic in topics:
                    broker.create_topic(topic, 1)
                print(f"broker: {broker.description}, pid {broker.pid}", flush=True)
            yield index, broker
