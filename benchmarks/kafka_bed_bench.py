"""What the Kafka test bed costs: start times and memory of the local Apache Kafka processes.

Not a test: prints figures.

    .venv/bin/python benchmarks/kafka_bed_bench.py [--rounds 3] [--records 100000]

For each round:

- **single node** (``KafkaBroker``, what the demo and most tests use): from nothing to ready
  (storage format + JVM start + the admin client sees the broker), then the restart after a
  kill -9 (the new incarnation waits for the old one's session to expire) and after a graceful
  stop;
- **3-node cluster** (``KafkaCluster``, RF 3, ``min.insync.replicas=2``): from nothing to ready
  (every node formatted and started, the admin client sees all three brokers), the resident
  memory of each JVM right after the start and again after ``--records`` records of 200 B
  were produced with ``acks=all`` to a 6-partition topic, and the time until a killed
  partition leader's partition has a new leader.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

from durable_producer.local.broker import KafkaBroker
from durable_producer.local.kafka_cluster import KafkaCluster
from durable_producer.local.kafka_node import (
    JVM_OPTIONS,
    KAFKA_VERSION,
    KafkaNode,
    KafkaNotInstalled,
)
from durable_producer.local.process import poll_until
from durable_producer.local.topics import create_topic

RECORD = b"r" * 200


def rss_mb(node: KafkaNode) -> float:
    assert node.process is not None
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
    )
    for index in range(records):
        while True:
            try:
                producer.produce(topic, RECORD, key=b"%d" % index)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("records not delivered within 120 s")


def single_node_round() -> dict[str, float]:
    began = time.monotonic()
    with KafkaBroker() as broker:
        figures = {"start": time.monotonic() - began}
        figures["rss"] = rss_mb(broker)
        broker.kill()
        began = time.monotonic()
        broker.start()
        figures["restart after kill -9"] = time.monotonic() - began
        broker.stop()
        began = time.monotonic()
        broker.start()
        figures["restart after stop"] = time.monotonic() - began
    return figures


def cluster_round(records: int) -> dict[str, float]:
    began = time.monotonic()
    with KafkaCluster() as cluster:
        figures = {"start": time.monotonic() - began}
        for node in cluster.nodes:
            figures[f"rss node {node.node_id} at start"] = rss_mb(node)
        topic = f"bench-{time.monotonic_ns()}"
        create_topic(cluster.bootstrap, topic, 6)
        began = time.monotonic()
        produce(cluster.bootstrap, topic, records)
        figures["produce records/s"] = records / (time.monotonic() - began)
        for node in cluster.nodes:
            figures[f"rss node {node.node_id} after load"] = rss_mb(node)
        leader = cluster.leader_of(topic, 0)
        began = time.monotonic()
        leader.kill()

        def moved() -> bool:
            try:
                return cluster.partition(topic, 0).leader not in (-1, leader.node_id)
            except Exception:
                return False

        poll_until(moved, timeout=60, interval=0.1)
        figures["new leader after kill -9"] = time.monotonic() - began
    return figures


def report(title: str, rounds: list[dict[str, float]]) -> None:
    print(f"\n{title} ({len(rounds)} rounds: median, min-max)")
    for key in rounds[0]:
        values = [figures[key] for figures in rounds]
        unit = "MB" if key.startswith("rss") else "" if "records/s" in key else "s"
        print(
            f"  {key:28s} {statistics.median(values):9.1f} {unit:2s}"
            f" ({min(values):.1f}-{max(values):.1f})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    print(f"Apache Kafka {KAFKA_VERSION}, JVM options: {' '.join(JVM_OPTIONS)}", flush=True)
    try:
        singles = [single_node_round() for _ in range(args.rounds)]
        report("single node (KafkaBroker)", singles)
        clusters = [cluster_round(args.records) for _ in range(args.rounds)]
        report("3-node cluster (KafkaCluster)", clusters)
    except KafkaNotInstalled as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
