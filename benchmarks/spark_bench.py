"""Spark job: ``format("durable-kafka")`` via the agent vs a direct writer, to "every row in Kafka".

The same PySpark job (local mode) writes N generated rows, side by side on this machine, to a
Kafka broker (one KRaft node) behind a fault proxy:

- ``noop``: Spark's no-op sink, the cost of the job itself (generation, Arrow transfer);
- ``direct``: what a PySpark user writes without us: ``foreachPartition`` with a
  confluent-kafka producer (``acks=all``, idempotent) to the broker;
- ``durable-kafka``: this project's data source to a real buffer agent process
  (``durable-agent run``) forwarding to the broker (``--no-agent``: straight to the broker);
- ``durable-kafka, no agent``: the same data source with ``bootstrap`` set to the broker,
  i.e. the same task code without the agent: the agent's own cost in isolation.

Each of ``--repeat`` rounds runs the three writers and times two things: the
job (until Spark returns: for durable-kafka, every row is in an agent's WAL) and the time to
**every row in Kafka** (for the direct writer the same moment, ``acks=all``; for durable-kafka,
until the agent's forwarder has had every row acknowledged by the broker, read from its
``durable_agent_forwarded_records`` metric). Medians and their ratios are printed.

Then, with ``--stall-seconds`` > 0, both writers again while the broker path hangs for
that long early in the job (a slow/hung broker). Counts every topic in the broker
afterwards. Not a pass/fail test. Example::

    .venv/bin/python benchmarks/spark_bench.py --rows 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from pyspark import SparkContext
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from durable_producer.contract import BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration import register
from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import AgentProcess
from support.broker import ProxiedBroker, create_topic
from support.fault_proxy import FaultProxy

VALUE_BYTES = 100
STALL_AFTER_SECONDS = 0.5
FORWARDED_METRIC = "durable_agent_forwarded_records_total"


def generated_rows(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """Rows with a numeric string key and a value of ``VALUE_BYTES`` bytes."""
    row_number = F.col("id").cast("string")
    return spark.range(rows, numPartitions=partitions).select(
        row_number.cast("binary").alias("key"),
        F.lpad(row_number, VALUE_BYTES, "v").cast("binary").alias("value"),
    )


def direct_partition_writer(bootstrap: str, topic: str) -> Callable[[Iterator[Row]], None]:
    """A plain foreachPartition writer: produce every row, flush, fail on any delivery error."""

    def write_partition(rows: Iterator[Row]) -> None:
        # Imported here: cloudpickle would otherwise ship the class itself, which fails.
        from confluent_kafka import Producer

        errors: list[str] = []

        def on_delivery(error: object, _message: object) -> None:
            if error is not None:
                errors.append(str(error))

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 500000,
            }
        )
        for row in rows:
            while True:
                try:
                    producer.produce(topic, row.value, row.key, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(300) or errors:
            raise RuntimeError(f"direct writer: delivery failed: {errors[:3]}")

    return write_partition


def records_in_topic(bootstrap: str, topic: str, expected: int, timeout: float = 120.0) -> int:
    """Count the records by reading them all (not a watermark: what a user would check)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, partition, 0) for partition in partitions])
        count = 0
        deadline = time.monotonic() + timeout
        while count < expected and time.monotonic() < deadline:
            count += sum(1 for m in consumer.consume(10_000, timeout=0.5) if m.error() is None)
        return count
    finally:
        consumer.close()


@dataclass(frozen=True)
class Endpoints:
    broker: str  # where the direct writer and the agent's forwarder send (maybe a proxy)
    broker_direct: str  # the broker itself, for counting
    durable: str  # where durable-kafka writes: the agent, or the broker without one
    via_agent: bool
    proxy: FaultProxy | None
    agent: AgentProcess | None = None

    def forwarded(self) -> float:
        """Records the agent's forwarder has had acknowledged by the broker so far."""
        assert self.agent is not None
        return self.agent.metrics().get(FORWARDED_METRIC, 0.0)


@dataclass(frozen=True)
class Timing:
    job_s: float  # until the Spark job returned
    in_kafka_s: float  # until every row was acknowledged by the broker


def time_to_kafka(job: Callable[[], None], rows: int, endpoints: Endpoints | None) -> Timing:
    """Run ``job``; with ``endpoints`` (durable-kafka via an agent) also wait for forwarding."""
    before = endpoints.forwarded() if endpoints is not None else 0.0
    started = time.perf_counter()
    job()
    job_s = time.perf_counter() - started
    if endpoints is None:
        return Timing(job_s, job_s)
    while endpoints.forwarded() - before < rows:
        time.sleep(0.02)
    return Timing(job_s, time.perf_counter() - started)


def timed(
    label: str,
    rows: int,
    job: Callable[[], None],
    stall: FaultProxy | None = None,
    stall_seconds: float = 0.0,
) -> float:
    """Run ``job``; with ``stall``, hang the broker path for ``stall_seconds`` early in the run."""
    timer = None
    if stall is not None:

        def hang_then_restore() -> None:
            stall.hang()
            time.sleep(stall_seconds)
            stall.restore()

        timer = threading.Timer(STALL_AFTER_SECONDS, hang_then_restore)
        timer.start()
    started = time.perf_counter()
    job()
    elapsed = time.perf_counter() - started
    if timer is not None:
        timer.join()
    rate = rows / elapsed
    print(f"{label:>24}: {rows:,} rows in {elapsed:6.2f}s = {rate:10,.0f} rows/s", flush=True)
    return rate


def stop_spark(spark: SparkSession) -> None:
    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None:
        java_process = getattr(gateway, "proc", None)
        gateway.shutdown()
        if java_process is not None:
            java_process.kill()
            java_process.wait(timeout=30)


def run(args: argparse.Namespace, endpoints: Endpoints) -> None:
    os.environ[BOOTSTRAP_TWIN_ENV] = endpoints.durable
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("durable-kafka-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        topics: dict[str, str] = {}

        def topic(name: str) -> str:
            topics[name] = f"bench-{name}-{uuid.uuid4().hex[:8]}"
            create_topic(endpoints.broker_direct, topics[name], args.partitions)
            return topics[name]

        def direct(name: str) -> Callable[[], None]:
            writer = direct_partition_writer(endpoints.broker, topic(name))
            return lambda: frame.foreachPartition(writer)

        def durable(name: str, bootstrap: str | None = None) -> Callable[[], None]:
            target = topic(name)

            def write() -> None:
                writer = frame.write.format(SHORT_NAME).option("topic", target).mode("append")
                if bootstrap is not None:
                    writer = writer.option("bootstrap", bootstrap)
                writer.save()

            return write

        frame = generated_rows(spark, 20_000, args.partitions)
        direct("warmup-direct")()
        durable("warmup-durable")()
        durable("warmup-no-agent", endpoints.broker)()

        frame = generated_rows(spark, args.rows, args.partitions)
        target = "buffer agent" if endpoints.via_agent else "broker, no agent"
        print(
            f"{args.rows:,} rows of {VALUE_BYTES} B, {args.partitions} partitions, "
            f"local[{args.cores}]; durable-kafka -> {endpoints.durable} ({target})",
            flush=True,
        )
        timed(
            "noop (job alone)",
            args.rows,
            lambda: frame.write.format("noop").mode("overwrite").save(),
        )
        forwarding = endpoints if endpoints.via_agent else None
        direct_runs: list[Timing] = []
        bare_runs: list[Timing] = []
        durable_runs: list[Timing] = []
        for n in range(1, args.repeat + 1):
            direct_runs.append(time_to_kafka(direct(f"direct-{n}"), args.rows, None))
            bare_runs.append(
                time_to_kafka(durable(f"no-agent-{n}", endpoints.broker), args.rows, None)
            )
            durable_runs.append(time_to_kafka(durable(f"durable-{n}"), args.rows, forwarding))
            print(
                f"{'round ' + str(n):>24}: direct {direct_runs[-1].in_kafka_s:6.2f}s;"
                f" durable-kafka no agent {bare_runs[-1].in_kafka_s:6.2f}s;"
                f" via agent: job {durable_runs[-1].job_s:6.2f}s,"
                f" every row in Kafka {durable_runs[-1].in_kafka_s:6.2f}s",
                flush=True,
            )
        medians = {
            "direct foreachPartition": statistics.median(r.in_kafka_s for r in direct_runs),
            "durable-kafka, no agent": statistics.median(r.in_kafka_s for r in bare_runs),
            "via agent, job": statistics.median(r.job_s for r in durable_runs),
            "via agent, all in Kafka": statistics.median(r.in_kafka_s for r in durable_runs),
        }
        for label, seconds in medians.items():
            print(f"{'median ' + label:>32}: {seconds:6.2f}s {args.rows / seconds:10,.0f} rows/s")
        in_kafka = medians["via agent, all in Kafka"]
        print(
            f"{'time to every row in Kafka':>32}: via agent / direct foreachPartition = "
            f"{in_kafka / medians['direct foreachPartition']:.2f}x; via agent / durable-kafka "
            f"without agent = {in_kafka / medians['durable-kafka, no agent']:.2f}x",
            flush=True,
        )
        if args.stall_seconds > 0 and endpoints.proxy is not None:
            proxy, seconds = endpoints.proxy, args.stall_seconds
            label = f"broker hung {seconds:g}s"
            stalled_direct = timed(
                f"direct, {label}", args.rows, direct("direct-stall"), proxy, seconds
            )
            stalled_durable = timed(
                f"durable-kafka, {label}", args.rows, durable("durable-stall"), proxy, seconds
            )
            print(
                f"{'ratio':>24}: durable-kafka / direct = "
                f"{stalled_durable / stalled_direct:.2f}x (broker hung)"
            )
        counts = {
            name: records_in_topic(endpoints.broker_direct, name_topic, args.rows)
            for name, name_topic in topics.items()
            if not name.startswith("warmup")
        }
        print(f"{'in broker':>24}: " + ", ".join(f"{n} {c:,}" for n, c in counts.items()))
    finally:
        stop_spark(spark)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="local[N]")
    parser.add_argument("--arrow-batch", type=int, default=10_000, help="rows per Arrow batch")
    parser.add_argument(
        "--no-agent", action="store_true", help="durable-kafka straight to the broker"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of direct + durable-kafka")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=5.0,
        help="also run both writers with the broker hung this long early in the job (0: skip)",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(ProxiedBroker())
        agent = None if args.no_agent else stack.enter_context(AgentProcess(kafka.bootstrap))
        run(
            args,
            Endpoints(
                broker=kafka.bootstrap,
                broker_direct=kafka.direct_address,
                durable=agent.bootstrap if agent is not None else kafka.bootstrap,
                via_agent=agent is not None,
                proxy=kafka.proxy,
                agent=agent,
            ),
        )


if __name__ == "__main__":
    main()
