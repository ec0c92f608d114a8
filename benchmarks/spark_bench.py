"""Spark job: ``format("durable-kafka")`` via the agent vs Spark's own Kafka sink and a direct
writer, to "every row in Kafka".

The same PySpark job (local mode) writes N generated rows, side by side on this machine, to a
Kafka broker (one KRaft node, Kafka's own start-script JVM options) behind a fault proxy:

- ``noop``: Spark's no-op sink, the cost of the job itself (generation, Arrow transfer);
- ``spark-kafka``: Spark's own Kafka sink, ``format("kafka")`` (spark-sql-kafka-0-10 from
  Maven Central, ``make tools``; its Java producer with its defaults) straight to the broker;
- ``foreach``: what a PySpark user writes by hand: ``foreachPartition`` with a
  confluent-kafka producer (``acks=all``, idempotent) to the broker;
- ``agent``: this project's data source to a real buffer agent process (``durable-agent
  run``) forwarding to the broker;
- ``no-agent``: the same data source with ``bootstrap`` set to the broker, i.e. the same task
  code without the agent: the agent's own cost in isolation.

Each of ``--repeat`` rounds runs the ``--writers`` in turn and times two things: the job
(until Spark returns: through the agent, every row is in its WAL) and the time to **every row
in Kafka** (for the writers to the broker the same moment, ``acks=all``; through the agent,
until its forwarder has had every row acknowledged by the broker, read from its
``durable_agent_forwarded_records`` metric). Medians and their ratios are printed.

Then, with ``--stall-seconds`` > 0, Spark's sink and durable-kafka via the agent again while
the broker path hangs for that long early in the job (a slow/hung broker). Counts every topic
in the broker afterwards. Not a pass/fail test. Example::

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

from bench_brokers import BROKER_JVMS

from durable_producer.contract import BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration import register
from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import AgentProcess
from support.broker import ProxiedBroker, create_topic
from support.fault_proxy import FaultProxy
from support.spark_kafka import (
    SINK_FORMAT,
    SPARK_JARS_CONF,
    SparkKafkaNotInstalled,
    sink_version,
    spark_jars_conf,
)

VALUE_BYTES = 100
STALL_AFTER_SECONDS = 0.5
FORWARDED_METRIC = "durable_agent_forwarded_records_total"
WRITERS = {
    "spark-kafka": "Spark's Kafka sink, direct",
    "foreach": "foreachPartition, direct",
    "no-agent": "durable-kafka, no agent",
    "agent": "durable-kafka via agent",
}
"""``--writers``: label of each, in the order they run within a round."""


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
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
        .config(SPARK_JARS_CONF, spark_jars_conf())
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

        def foreach(name: str) -> Callable[[], None]:
            writer = direct_partition_writer(endpoints.broker, topic(name))
            return lambda: frame.foreachPartition(writer)

        def spark_kafka(name: str) -> Callable[[], None]:
            target = topic(name)

            def write() -> None:
                frame.write.format(SINK_FORMAT).option(
                    "kafka.bootstrap.servers", endpoints.broker
                ).option("topic", target).mode("append").save()

            return write

        def durable(name: str, bootstrap: str | None = None) -> Callable[[], None]:
            target = topic(name)

            def write() -> None:
                writer = frame.write.format(SHORT_NAME).option("topic", target).mode("append")
                if bootstrap is not None:
                    writer = writer.option("bootstrap", bootstrap)
                writer.save()

            return write

        jobs: dict[str, Callable[[str], Callable[[], None]]] = {
            "spark-kafka": spark_kafka,
            "foreach": foreach,
            "no-agent": lambda name: durable(name, endpoints.broker),
            "agent": durable,
        }
        writers = [name for name in WRITERS if name in args.writers]
        if "agent" in writers and not endpoints.via_agent:
            writers.remove("agent")
        frame = generated_rows(spark, 20_000, args.partitions)
        for name in writers:
            jobs[name](f"warmup-{name}")()

        frame = generated_rows(spark, args.rows, args.partitions)
        print(
            f"{args.rows:,} rows of {VALUE_BYTES} B, {args.partitions} partitions, "
            f"local[{args.cores}], pyspark {spark.version}, Spark's Kafka sink {sink_version()};"
            f" durable-kafka via the agent at {endpoints.durable}",
            flush=True,
        )
        timed(
            "noop (job alone)",
            args.rows,
            lambda: frame.write.format("noop").mode("overwrite").save(),
        )
        runs: dict[str, list[Timing]] = {name: [] for name in writers}
        for n in range(1, args.repeat + 1):
            for name in writers:
                forwarding = endpoints if name == "agent" else None
                runs[name].append(time_to_kafka(jobs[name](f"{name}-{n}"), args.rows, forwarding))
            print(
                f"{'round ' + str(n):>24}: "
                + "; ".join(
                    f"{WRITERS[name]} {runs[name][-1].in_kafka_s:6.2f}s"
                    + (f" (job {runs[name][-1].job_s:.2f}s)" if name == "agent" else "")
                    for name in writers
                ),
                flush=True,
            )
        in_kafka = {name: statistics.median(r.in_kafka_s for r in runs[name]) for name in writers}
        for name in writers:
            print(
                f"{'median ' + WRITERS[name]:>40}: every row in Kafka {in_kafka[name]:6.2f}s"
                f" {args.rows / in_kafka[name]:10,.0f} rows/s"
            )
        if "agent" in writers:
            job = statistics.median(r.job_s for r in runs["agent"])
            print(f"{'median durable-kafka via agent, job':>40}: {job:6.2f}s")
            for name in writers:
                if name != "agent":
                    print(
                        f"{'time to every row in Kafka':>40}: via agent / {WRITERS[name]} ="
                        f" {in_kafka['agent'] / in_kafka[name]:.2f}x"
                        f" (job: {job / in_kafka[name]:.2f}x)"
                    )
        if args.stall_seconds > 0 and endpoints.proxy is not None:
            proxy, seconds = endpoints.proxy, args.stall_seconds
            label = f"broker hung {seconds:g}s"
            stalled = {
                name: timed(
                    f"{name}, {label}", args.rows, jobs[name](f"{name}-stall"), proxy, seconds
                )
                for name in ("spark-kafka", "agent")
                if name in writers
            }
            if len(stalled) == 2:
                print(
                    f"{'ratio':>24}: durable-kafka via agent / Spark's Kafka sink = "
                    f"{stalled['agent'] / stalled['spark-kafka']:.2f}x rows/s (broker hung)"
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
        "--writers",
        type=lambda text: text.split(","),
        default=list(WRITERS),
        help=f"comma-separated, of {','.join(WRITERS)} (default: all)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every writer")
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=5.0,
        help="also run Spark's sink and durable-kafka via the agent with the broker hung this"
        " long early in the job (0: skip)",
    )
    parser.add_argument(
        "--broker-jvm",
        choices=list(BROKER_JVMS),
        default="kafka",
        help="kafka: the JVM options of Kafka's own start script (default); test-bed: the"
        " tests' small C1-only JVM",
    )
    args = parser.parse_args()
    unknown = set(args.writers) - set(WRITERS)
    if unknown:
        parser.error(f"--writers: unknown {sorted(unknown)}; choose from {list(WRITERS)}")
    try:
        sink_version()
    except SparkKafkaNotInstalled as error:
        raise SystemExit(f"spark_bench: {error}") from None
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(ProxiedBroker(jvm_options=BROKER_JVMS[args.broker_jvm]))
        agent = None
        if "agent" in args.writers:
            agent = stack.enter_context(AgentProcess(kafka.bootstrap))
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
