"""Forward rate of the WAL forwarder vs a plain confluent-kafka ``produce()`` loop.

Not a test: prints figures. By default against librdkafka's mock cluster of 3 brokers
(``--broker mock``), which is not the bottleneck: the figures measure the forwarder. With
``--broker kafka`` it runs against one Apache Kafka node (a JVM on the same cores). Every run
prints the
broker used and the CPU seconds and resident memory it took.

Each round produces the same records (200-byte values, keys, explicit partitions and
timestamps) three ways to the same broker, one after the other, with the same client
settings (acks=all, idempotent, linger.ms=5): a plain Python ``produce()`` loop, the same
loop with a delivery callback per record, and the ``Forwarder`` reading them from a WAL
(timed from the first append until ``drain()`` returns: all acknowledged and checkpointed).
Against the mock, the sum of each topic's high watermarks is checked to equal the records
sent (the mock keeps only ~5 MB per partition, so records are counted by offsets, not read).

The records are built before the clock starts and the heap is then frozen (``gc.freeze``,
as the agent does once serving): otherwise every garbage collection of either side scans
the test data (measured: 350k instead of 615k records/s for the forwarder).

Catch-up after an outage: ``benchmarks/catch_up_bench.py``.

    .venv/bin/python benchmarks/forward_bench.py --records 300000 --rounds 3 [--broker kafka]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


from bench_brokers import BROKERS, Broker, brokers_for  # noqa: E402

from durable_producer.buffer_agent.forward.config import ForwarderConfig  # noqa: E402
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import SampleRecord, build_batch  # noqa: E402

PARTITIONS = 4
RECORDS_PER_BATCH = 500
VALUE_SIZE = 200
BASE_TIMESTAMP = 1_732_240_000_000
WARMUP_TOPIC = "warm-up"


def make_batches(records: int) -> list[tuple[int, list[SampleRecord]]]:
    batches = []
    for start in range(0, records, RECORDS_PER_BATCH):
        count = min(RECORDS_PER_BATCH, records - start)
        batch = [
            SampleRecord(
                key=b"key-%08d" % (start + i),
                value=(b"%08d" % (start + i)) * (VALUE_SIZE // 8),
                timestamp_ms=BASE_TIMESTAMP + start + i,
            )
            for i in range(count)
        ]
        batches.append(((start // RECORDS_PER_BATCH) % PARTITIONS, batch))
    return batches


def run_direct(
    bootstrap: str, topic: str, batches: list, *, with_reports: bool = False
) -> tuple[float, float]:
    """A plain produce loop; ``with_reports`` adds a per-record delivery callback, which any
    producer that must know its records arrived (like the forwarder) needs."""
    delivered = [0]

    def on_delivery(error: object, _message: object) -> None:
        if error is None:
            delivered[0] += 1

    callback = {"on_delivery": on_delivery} if with_reports else {}
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 0,
            "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 64 * 1024,
        }
    )
    producer.produce(WARMUP_TOPIC, b"warm-up")  # connection and producer id, untimed
    assert producer.flush(30) == 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for partition, records in batches:
        for record in records:
            while True:
                try:
                    producer.produce(
                        topic,
                        record.value,
                        record.key,
                        partition=partition,
                        timestamp=record.timestamp_ms,
                        **callback,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    assert remaining == 0, f"{remaining} records not delivered"
    assert not with_reports or delivered[0] == sum(len(records) for _, records in batches)
    return time.perf_counter() - started, time.process_time() - cpu_started


def run_forwarder(
    bootstrap: str, topic: str, batches: list, directory: Path
) -> tuple[float, float]:
    """Time from the first append of the batches to the WAL until Kafka acknowledged all.

    A warm-up frame is forwarded first, so the idempotent producer's id (it takes a moment on
    any broker) is not timed, as in ``run_direct``. Appending overlaps with forwarding, as in
    the agent; the appends take a small share of the time.
    """
    wal = WriteAheadLog.open(
        directory / "wal", WalConfig(max_bytes=4 * 1024**3, fsync=FsyncPolicy.NEVER)
    )
    try:
        wal.append(WARMUP_TOPIC, 0, build_batch([SampleRecord(None, b"warm-up", 1)]), 1)
        forwarder = Forwarder(
            wal,
            {"bootstrap.servers": bootstrap},
            dead_letters=DeadLetterStore(directory / "dead-letter"),
            state_dir=directory / "state",
            config=ForwarderConfig(),
        ).start()
        deadline = time.monotonic() + 30
        while forwarder.stats().watermark < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        payloads = [
            (partition, build_batch(records), len(records)) for partition, records in batches
        ]
        started, cpu_started = time.perf_counter(), time.process_time()
        for partition, payload, count in payloads:
            wal.append(topic, partition, payload, count)
        summary = forwarder.drain(timeout_s=300)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        assert summary.complete, summary
        return elapsed, cpu
    finally:
        wal.close()


def run_round(
    broker: Broker, round_index: int, batches: list, scratch: Path, records: int
) -> dict[str, tuple[float, float, str]]:
    """One round: the three sides, each with the broker CPU and memory it took."""
    results: dict[str, tuple[float, float, str]] = {}
    sides = (
        ("direct produce", "direct", lambda topic: run_direct(broker.bootstrap, topic, batches)),
        (
            "direct + delivery reports",
            "reported",
            lambda topic: run_direct(broker.bootstrap, topic, batches, with_reports=True),
        ),
        (
            "forwarder (WAL -> Kafka)",
            "forward",
            lambda topic: run_forwarder(
                broker.bootstrap, topic, batches, scratch / str(round_index)
            ),
        ),
    )
    for name, prefix, run in sides:
        topic = f"{prefix}-{round_index}"
        broker.create_topic(topic, PARTITIONS)
        before = broker.usage()
        elapsed, cpu = run(topic)
        usage = broker.usage().since(before)
        appended = broker.appended(topic, PARTITIONS)
        if appended not in (-1, records):
            raise RuntimeError(f"{name}: the broker has {appended} of {records} records")
        results[name] = (elapsed, cpu, usage)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--broker", choices=BROKERS, default="mock")
    args = parser.parse_args()
    batches = make_batches(args.records)
    # The agent freezes its startup heap (process_tuning); here the million test records
    # would otherwise make every garbage collection of either side scan them all.
    gc.collect()
    gc.freeze()
    payload_mb = args.records * (VALUE_SIZE + 12) / 1e6
    runs: dict[str, list[tuple[float, float, str]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index, broker in brokers_for(args.broker, args.rounds, WARMUP_TOPIC):
            results = run_round(broker, round_index, batches, Path(scratch), args.records)
            for name, result in results.items():
                runs.setdefault(name, []).append(result)
                elapsed, _, usage = result
                print(
                    f"  round {round_index + 1} {name:27s} {args.records / elapsed:10.0f}"
                    f" records/s  {usage}",
                    flush=True,
                )
    million = 1e6 / args.records
    print(f"broker                      {args.broker}")
    print(
        f"records per run             {args.records} x {VALUE_SIZE} B values, {args.rounds} rounds"
    )
    rates = {}
    for name, measured in runs.items():
        rate = args.records / statistics.median(elapsed for elapsed, _, _ in measured)
        cpu = statistics.median(cpu for _, cpu, _ in measured) * million
        rates[name] = rate
        print(
            f"{name:27s} {rate:10.0f} records/s {rate * payload_mb / args.records:6.1f} MB/s"
            f"  cpu {cpu:5.2f} s per million records"
        )
    forward = rates["forwarder (WAL -> Kafka)"]
    per_round = [
        f"{direct[0] / forwarded[0]:.2f}"
        for direct, forwarded in zip(
            runs["direct produce"], runs["forwarder (WAL -> Kafka)"], strict=True
        )
    ]
    print(
        f"forward / direct            {forward / rates['direct produce']:10.2f}x"
        f"  (per round: {' '.join(per_round)})"
    )
    print(f"forward / direct + reports  {forward / rates['direct + delivery reports']:10.2f}x")


if __name__ == "__main__":
    main()
