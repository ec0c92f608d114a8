"""The main job on the embedded default: a PySpark job (local master) writes a generated data
set through a local buffer agent to a local Apache Kafka broker (KRaft, one node, behind a fault
proxy), with a broker outage in the middle. Afterwards the topic is read back and every row
the job was told is safe is checked byte for byte.

    python -m durable_producer.demo                  # or: make demo
    python -m durable_producer.demo --load producer  # a plain confluent-kafka producer instead
    python -m durable_producer.demo --help           # rate, duration, outage, fsync policy...

The job writes in slices (one Spark write per ``--slice-seconds``) paced at ``--rate`` rows/s,
so the outage falls in the middle of the run. A slice succeeds only when the agent has
acknowledged all of its rows (they are in the agent's write-ahead log). Exit code 0 when every
acknowledged row reached Kafka intact, 1 otherwise, 2 when Kafka is not installed (`make tools`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .local.agent_process import AgentProcess
from .local.broker import ProxiedBroker
from .local.kafka_node import KafkaNotInstalled
from .local.process import poll_until
from .local.topics import ConsumedRecord, consume_all, create_topic

FORWARDED = "durable_agent_forwarded_records_total"
STORED = "durable_agent_ingest_records_total"
WAL_BYTES = "durable_agent_backlog_bytes"
HEADER = ("demo", b"durable-producer")


def record_value(index: int, size: int) -> bytes:
    seed = f"record-{index}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


@dataclass
class LoadStats:
    """What the application side saw; written by the load, read by the watcher."""

    sent: int = 0
    acknowledged: int = 0
    errors: int = 0
    acked: list[range] = field(default_factory=list)
    write_seconds_up: float = 0.0
    rows_up: int = 0
    write_seconds_down: float = 0.0
    rows_down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acknowledge(self, rows: range) -> None:
        with self.lock:
            self.acked.append(rows)
            self.acknowledged += len(rows)


@dataclass
class Timeline:
    outage_active: bool = False
    backlog_peak_records: int = 0
    backlog_peak_bytes: int = 0
    restored_at: float | None = None
    caught_up_at: float | None = None


def start_spark() -> object:
    from pyspark.sql import SparkSession

    from .spark_integration import register

    # Spark's Python workers must run this interpreter (the one with durable_producer installed),
    # not whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print("starting PySpark (local[2]) ...")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("durable-producer-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_load(
    args: argparse.Namespace, bootstrap: str, stats: LoadStats, timeline: Timeline, spark: object
) -> None:
    """Write ``--rate`` rows/s for ``--duration`` s through the agent with PySpark."""
    from pyspark.sql import functions as sql

    slice_rows = max(1, int(args.rate * args.slice_seconds))
    started = time.monotonic()
    start = 0
    while time.monotonic() - started < args.duration:
        rows = range(start, start + slice_rows)
        frame = spark.range(rows.start, rows.stop, numPartitions=2).select(  # type: ignore[attr-defined]
            sql.col("id").cast("string").alias("key"),
            sql.expr(
                f"substring(repeat(concat('record-', id, ':'), {args.record_size}),"
                f" 1, {args.record_size})"
            )
            .cast("binary")
            .alias("value"),
            sql.array(
                sql.struct(sql.lit(HEADER[0]).alias("key"), sql.lit(HEADER[1]).alias("value"))
            ).alias("headers"),
        )
        stats.sent = rows.stop
        down = timeline.outage_active
        began = time.monotonic()
        (
            frame.write.format("durable-kafka")
            .option("topic", args.topic)
            .option("bootstrap", bootstrap)
            .mode("append")
            .save()
        )
        took = time.monotonic() - began
        with stats.lock:
            if down or timeline.outage_active:
                stats.write_seconds_down += took
                stats.rows_down += len(rows)
            else:
                stats.write_seconds_up += took
                stats.rows_up += len(rows)
        stats.acknowledge(rows)
        start = rows.stop
        pause = started + start / args.rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)


def producer_load(
    args: argparse.Namespace, bootstrap: str, stats: LoadStats, timeline: Timeline, spark: object
) -> None:
    """The same data from a plain confluent-kafka producer (no Spark)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": 0,
        }
    )

    def delivered(error: object, message: object) -> None:
        if error is None:
            index = int(message.key())  # type: ignore[attr-defined]
            stats.acknowledge(range(index, index + 1))
        else:
            with stats.lock:
                stats.errors += 1

    started = time.monotonic()
    index = 0
    while time.monotonic() - started < args.duration:
        due = int(args.rate * (time.monotonic() - started))
        while index < due:
            try:
                producer.produce(
                    args.topic,
                    key=str(index).encode(),
                    value=record_value(index, args.record_size),
                    headers=[HEADER],
                    on_delivery=delivered,
                )
            except BufferError:
                producer.poll(0.05)
                continue
            index += 1
        stats.sent = index
        producer.poll(0.01)
    producer.flush(300)


def watch(
    agent: AgentProcess,
    broker: ProxiedBroker,
    stats: LoadStats,
    timeline: Timeline,
    args: argparse.Namespace,
    started: float,
    done: threading.Event,
) -> None:
    """Cut the broker off on schedule, print progress, and track backlog and catch-up."""
    outage_started = outage_ended = False
    last_print = -5.0
    while not done.is_set():
        now = time.monotonic() - started
        if not outage_started and now >= args.outage_at:
            broker.proxy.cut()
            outage_started = timeline.outage_active = True
            print(f"[{now:5.1f}s] BROKER OUTAGE: the agent is cut off from Kafka")
        if outage_started and not outage_ended and now >= args.outage_at + args.outage:
            broker.proxy.restore()
            outage_ended, timeline.outage_active = True, False
            timeline.restored_at = time.monotonic()
            print(f"[{now:5.1f}s] broker reachable again")
        finished = stats.acknowledged  # read before the agent: stored >= finished
        metrics = agent.metrics()
        forwarded = int(metrics.get(FORWARDED, 0))
        stored = int(metrics.get(STORED, 0))
        backlog = max(0, stored - forwarded)
        timeline.backlog_peak_records = max(timeline.backlog_peak_records, backlog)
        timeline.backlog_peak_bytes = max(
            timeline.backlog_peak_bytes, int(metrics.get(WAL_BYTES, 0))
        )
        if outage_ended and timeline.caught_up_at is None and backlog <= args.rate // 2:
            timeline.caught_up_at = time.monotonic()
            assert timeline.restored_at is not None
            print(
                f"[{now:5.1f}s] backlog caught up "
                f"{timeline.caught_up_at - timeline.restored_at:.1f} s after the outage"
            )
        if now - last_print >= 5:
            last_print = now
            state = "DOWN" if timeline.outage_active else "up"
            print(
                f"[{now:5.1f}s] stored by the agent {stored:>9}  forwarded to Kafka"
                f" {forwarded:>9}  backlog {backlog:>8}  in finished Spark writes"
                f" {finished:>9}  broker {state}"
            )
        done.wait(0.5)


def run_demo(args: argparse.Namespace, work: Path) -> int:
    print("starting the local Apache Kafka broker (KRaft, one node) behind a fault proxy ...")
    with ProxiedBroker() as broker:
        create_topic(broker.bootstrap, args.topic, args.partitions)
        agent = AgentProcess(
            work / "volume",
            broker.bootstrap,
            extra_args=[
                "--fsync",
                args.fsync,
                "--checkpoint-interval",
                "2",
                "--drain-timeout",
                "60",
            ],
            log_path=work / "agent.log",
        )
        print(f"starting the buffer agent on {agent.bootstrap} (fsync {args.fsync}) ...")
        with agent:
            stats, timeline, done = LoadStats(), Timeline(), threading.Event()
            load = spark_load if args.load == "spark" else producer_load
            spark = start_spark() if args.load == "spark" else None
            print(
                f"writing {args.rate} rows/s of {args.record_size} B for {args.duration:.0f} s"
                f" ({args.load}); broker outage at {args.outage_at:.0f} s for"
                f" {args.outage:.0f} s"
            )
            started = time.monotonic()
            watcher = threading.Thread(
                target=watch,
                args=(agent, broker, stats, timeline, args, started, done),
                daemon=True,
            )
            watcher.start()
            try:
                load(args, agent.bootstrap, stats, timeline, spark)
            finally:
                if spark is not None:
                    spark.stop()  # type: ignore[attr-defined]
                print("load finished; waiting for the backlog to reach Kafka ...")
                poll_until(
                    lambda: agent.metrics().get(FORWARDED, 0) >= stats.acknowledged,
                    timeout=300,
                    interval=0.5,
                )
                done.set()
                watcher.join()
            if timeline.caught_up_at is None:
                timeline.caught_up_at = time.monotonic()
            code = agent.stop()
            print(f"agent stopped after draining (exit code {code})")
        print("reading the topic back from the broker ...")
        consumed = consume_all(broker.direct_address, args.topic, timeout=300, idle=3)
    return verify_and_report(args, stats, consumed, timeline)


def verify_and_report(
    args: argparse.Namespace, stats: LoadStats, consumed: list[ConsumedRecord], timeline: Timeline
) -> int:
    seen: dict[int, int] = {}
    damaged = 0
    for record in consumed:
        index = int(record.key or b"-1")
        seen[index] = seen.get(index, 0) + 1
        if record.value != record_value(index, args.record_size) or record.headers != (HEADER,):
            damaged += 1
    acked = {index for rows in stats.acked for index in rows}
    missing = acked - seen.keys()
    unexpected = seen.keys() - set(range(stats.sent))
    duplicates = sum(count - 1 for count in seen.values())
    catch_up = (
        f"{timeline.caught_up_at - timeline.restored_at:.1f} s"
        if timeline.caught_up_at and timeline.restored_at
        else "n/a"
    )
    print("\nsummary")
    print(f"  rows written by the application     {stats.sent:>10}")
    print(f"  acknowledged by the agent           {stats.acknowledged:>10}")
    print(f"  delivered to Kafka (distinct)       {len(seen):>10}")
    print(f"  acknowledged but missing in Kafka   {len(missing):>10}")
    print(f"  damaged rows                        {damaged:>10}")
    print(f"  duplicates in Kafka                 {duplicates:>10}")
    print(f"  errors seen by the application      {stats.errors:>10}")
    print(
        f"  backlog peak                        {timeline.backlog_peak_records:>10} rows,"
        f" {timeline.backlog_peak_bytes / 1e6:.1f} MB on disk"
    )
    print(f"  catch-up after the outage           {catch_up:>10}")
    if stats.write_seconds_up and stats.write_seconds_down:
        up = stats.rows_up / stats.write_seconds_up
        down = stats.rows_down / stats.write_seconds_down
        print(f"  Spark write throughput, broker up   {up:>10.0f} rows/s")
        print(f"  Spark write throughput, broker down {down:>10.0f} rows/s ({down / up:.2f}x)")
    ok = not missing and not damaged and not unexpected and stats.errors == 0
    print(
        "\nRESULT: "
        + (
            "OK - every acknowledged row reached Kafka intact"
            if ok
            else "FAILED - see the counts above"
        )
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_producer.demo",
        description="PySpark job -> buffer agent -> local broker, with a broker outage; "
        "verifies that every acknowledged row arrived.",
    )
    parser.add_argument(
        "--load",
        choices=("spark", "producer"),
        default="spark",
        help="PySpark data source durable-kafka (default) or a plain producer",
    )
    parser.add_argument("--rate", type=int, default=20_000, help="rows/s (default 20000)")
    parser.add_argument("--record-size", type=int, default=200, help="value bytes (default 200)")
    parser.add_argument("--duration", type=float, default=60, help="seconds of load (default 60)")
    parser.add_argument("--outage-at", type=float, default=15, help="outage start, s (default 15)")
    parser.add_argument("--outage", type=float, default=30, help="outage length, s (default 30)")
    parser.add_argument(
        "--slice-seconds",
        type=float,
        default=2.0,
        help="seconds of data per Spark write (default 2)",
    )
    parser.add_argument("--partitions", type=int, default=6, help="topic partitions (default 6)")
    parser.add_argument("--topic", default="demo-events")
    parser.add_argument("--fsync", default="interval", choices=("always", "interval", "never"))
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work directory (the agent's volume, WAL in volume/wal, and logs)",
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="durable-producer-demo-"))
    print(f"work directory: {work}")
    try:
        return run_demo(args, work)
    except KafkaNotInstalled as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    finally:
        wal = work / "volume" / "wal"
        if args.keep:
            print(f"kept {work}; the agent's WAL: durable-agent wal inspect {wal}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
