"""Forward rate of the WAL forwarder vs a plain confluent-kafka loop, on one tansu broker.

Not a test: prints figures. Both sides produce the same records (200-byte values, keys,
explicit partitions and timestamps) with the same client settings (acks=all, idempotent,
linger.ms=5) to the same broker, one after the other, alternating over ``--rounds``.
With ``--outage SECONDS`` it also measures catch-up: records appended to the WAL at half
the measured forward rate, the broker cut off (fault proxy) for that long, then the time
until the backlog is back to zero.

    .venv/bin/python benchmarks/forward_bench.py --records 200000 [--outage 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


from durable_producer.buffer_agent.forward.config import ForwarderConfig  # noqa: E402
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import SampleRecord, build_batch  # noqa: E402
from support.broker import ProxiedBroker, TansuBroker, create_topic  # noqa: E402

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

    A warm-up frame is forwarded first, so the idempotent producer's id (about 0.5 s with
    tansu) is not timed, as in ``run_direct``. Appending overlaps with forwarding, as in
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


def run_catch_up(batches: list, rate: float, outage_s: float, directory: Path) -> None:
    """Append at ``rate`` records/s; cut the broker off for ``outage_s``; time the catch-up."""
    payloads = [(partition, build_batch(records), len(records)) for partition, records in batches]
    frame_interval = RECORDS_PER_BATCH / rate
    with ProxiedBroker() as proxied:
        create_topic(proxied.bootstrap, "catch-up", PARTITIONS)
        wal = WriteAheadLog.open(
            directory / "wal", WalConfig(max_bytes=8 * 1024**3, fsync=FsyncPolicy.INTERVAL)
        )
        forwarder = Forwarder(
            wal,
            {"bootstrap.servers": proxied.bootstrap},
            dead_letters=DeadLetterStore(directory / "dead-letter"),
            state_dir=directory / "state",
        ).start()
        stop_loading = threading.Event()

        def load() -> None:
            next_due = time.monotonic()
            index = 0
            while not stop_loading.is_set():
                partition, payload, count = payloads[index % len(payloads)]
                wal.append("catch-up", partition, payload, count)
                index += 1
                next_due += frame_interval
                stop_loading.wait(max(0.0, next_due - time.monotonic()))

        loader = threading.Thread(target=load, daemon=True)
        try:
            loader.start()
            time.sleep(5)
            proxied.proxy.cut()
            time.sleep(outage_s)
            backlog_peak = wal.next_offset - forwarder.stats().watermark
            proxied.proxy.restore()
            restored = time.monotonic()
            while forwarder.stats().watermark < wal.next_offset - 1:
                time.sleep(0.05)
                if time.monotonic() - restored > 30 * outage_s:
                    raise RuntimeError("no catch-up within 30x the outage")
            catch_up = time.monotonic() - restored
        finally:
            stop_loading.set()
            loader.join()
            forwarder.stop()
            wal.close()
    print(
        f"catch-up after a {outage_s:.0f} s outage at {rate:.0f} records/s: backlog peak"
        f" {backlog_peak * RECORDS_PER_BATCH} records, back to zero (within one frame)"
        f" {catch_up:.1f} s after the broker returned"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--outage", type=float, default=0.0, help="catch-up test outage (s)")
    args = parser.parse_args()
    batches = make_batches(args.records)
    payload_mb = args.records * (VALUE_SIZE + 12) / 1e6
    direct, reported, forwarded = [], [], []
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        create_topic(broker.bootstrap, WARMUP_TOPIC, 1)
        for round_index in range(args.rounds):
            direct_topic, forward_topic = f"direct-{round_index}", f"forward-{round_index}"
            reported_topic = f"reported-{round_index}"
            for topic in (direct_topic, reported_topic, forward_topic):
                create_topic(broker.bootstrap, topic, PARTITIONS)
            direct.append(run_direct(broker.bootstrap, direct_topic, batches))
            reported.append(
                run_direct(broker.bootstrap, reported_topic, batches, with_reports=True)
            )
            forwarded.append(
                run_forwarder(
                    broker.bootstrap, forward_topic, batches, Path(scratch) / str(round_index)
                )
            )
    million = 1e6 / args.records
    print(
        f"records per run             {args.records} x {VALUE_SIZE} B values, {args.rounds} rounds"
    )
    rates = {}
    for name, runs in (
        ("direct produce", direct),
        ("direct + delivery reports", reported),
        ("forwarder (WAL -> Kafka)", forwarded),
    ):
        rate = args.records / statistics.median(elapsed for elapsed, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs) * million
        rates[name] = rate
        print(
            f"{name:27s} {rate:10.0f} records/s {rate * payload_mb / args.records:6.1f} MB/s"
            f"  cpu {cpu:5.2f} s per million records"
        )
    forward = rates["forwarder (WAL -> Kafka)"]
    print(f"forward / direct            {forward / rates['direct produce']:10.2f}x")
    print(f"forward / direct + reports  {forward / rates['direct + delivery reports']:10.2f}x")
    if args.outage > 0:
        with tempfile.TemporaryDirectory() as scratch:
            run_catch_up(batches, forward / 2, args.outage, Path(scratch))


if __name__ == "__main__":
    main()
