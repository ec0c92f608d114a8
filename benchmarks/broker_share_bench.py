"""What one Apache Kafka node spends on the forwarder's batches: its CPU a record, by the
forwarder's merge size and the records' content.

Not a test: prints figures. One Kafka node (clients connected directly), the forwarder in this
process on a preloaded WAL of one-record batches (linger-0 clients, 4 partitions round robin),
timed from its start until ``drain()`` returns; the broker's CPU over that span is sampled
from /proc (``bench_brokers.CpuTrace``), and so is the share of it its kernel spent (writing
the batches to the page cache, reading the sockets, page faults).
Each repetition runs every variant once, in order:

- ``1MB``: the default (``ForwarderConfig.max_merge_bytes``), the bench's records (a 12-byte
  key, 200-byte value, timestamps of 2024, as ``forward_bench.make_batches`` makes them);
- ``256KB``, ``64KB``: the same records, merges stopped there;
- ``1MB-nokey``, ``1MB-now``: no key, or the current time, and
  ``1MB-nokey-now``: both, as librdkafka's C producer in ``forward_bench.py`` sends them;
- ``1MB-1part``: the bench's records all to a topic of one partition, so that a Produce
  request carries one partition's batch (librdkafka's sticky partitioner sends the C
  producer's keyless records to one partition for a while), and ``1MB-runs``: four
  partitions, each taking a run of ``RUN`` consecutive batches in turn (so that what the
  forwarder has read ahead is mostly one partition's).

The broker runs with the JVM options of Kafka's start script, as in ``forward_bench.py``.

The first repetition warms the broker's JIT and costs it most: read the later ones.

    .venv/bin/python benchmarks/broker_share_bench.py [--records 300000] [--reps 3]
        [--variants 1MB,1MB-1part]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_brokers import BROKER_JVMS, Broker, CpuTrace  # noqa: E402
from forward_bench import PARTITIONS, WARMUP_TOPIC, make_batches, run_forwarder  # noqa: E402

from durable_producer.buffer_agent.forward.config import ForwarderConfig  # noqa: E402
from durable_producer.buffer_agent.process_tuning import prepare_to_serve  # noqa: E402
from support.batch_builder import SampleRecord  # noqa: E402

Batches = list[tuple[int, list[SampleRecord]]]
RUN = 5_000
"""Consecutive batches a partition takes in the ``runs`` layout (about a merged batch's)."""
VARIANTS = (
    ("1MB", 1_000_000, True, False, "rr"),
    ("256KB", 256 * 1024, True, False, "rr"),
    ("64KB", 64 * 1024, True, False, "rr"),
    ("1MB-nokey", 1_000_000, False, False, "rr"),
    ("1MB-now", 1_000_000, True, True, "rr"),
    ("1MB-nokey-now", 1_000_000, False, True, "rr"),
    ("1MB-1part", 1_000_000, True, False, "one"),
    ("1MB-runs", 1_000_000, True, False, "runs"),
)
"""(name, merge bytes, records with their key, at the current time, partition layout:
``rr`` round robin over ``PARTITIONS``, ``one`` all to one partition, ``runs`` runs of
``RUN`` batches a partition)."""


def laid_out(batches: Batches, layout: str) -> tuple[int, Batches]:
    """(the topic's partitions, ``batches`` with their partitions as ``layout`` says)."""
    if layout == "rr":
        return PARTITIONS, batches
    if layout == "one":
        return 1, [(0, records) for _, records in batches]
    return PARTITIONS, [
        (index // RUN % PARTITIONS, records) for index, (_, records) in enumerate(batches)
    ]


def one_record_batches(records: int, keyed: bool, now: bool) -> Batches:
    """The bench's one-record batches, their keys dropped unless ``keyed``, their timestamps
    the current time if ``now``."""
    start = int(time.time() * 1000)
    return [
        (
            partition,
            [
                dataclasses.replace(
                    record,
                    key=record.key if keyed else None,
                    timestamp_ms=start + index if now else record.timestamp_ms,
                )
            ],
        )
        for index, (partition, (record,)) in enumerate(make_batches(records, 1))
    ]


def forward(
    broker: Broker, topic: str, batches: Batches, merge: int
) -> tuple[float, float, float, float]:
    """(seconds, the broker's CPU seconds, of which its kernel's, this process's CPU seconds)
    to forward ``batches`` from a preloaded WAL (``forward_bench.run_forwarder``), the
    broker's over the timed span alone."""
    window: list[float] = []
    with (
        CpuTrace(lambda: broker.usage().cpu_s) as trace,
        CpuTrace(lambda: broker.usage().system_s) as kernel_trace,
        tempfile.TemporaryDirectory() as scratch,
    ):
        elapsed, cpu, _ = run_forwarder(
            broker.bootstrap,
            topic,
            batches,
            Path(scratch),
            preloaded=True,
            window=window,
            config=ForwarderConfig(max_merge_bytes=merge),
        )
    return elapsed, trace.between(*window), kernel_trace.between(*window), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--variants", default="", help="comma-separated names to run (default: every one)"
    )
    args = parser.parse_args()
    wanted = {name for name in args.variants.split(",") if name}
    unknown = wanted - {variant[0] for variant in VARIANTS}
    if unknown:
        raise SystemExit(f"--variants: no variant {', '.join(sorted(unknown))}")
    if args.records < 1 or args.reps < 1:
        raise SystemExit("--records and --reps: at least 1")
    chosen = [variant for variant in VARIANTS if not wanted or variant[0] in wanted]
    contents = {
        (keyed, now): one_record_batches(args.records, keyed, now) for _, _, keyed, now, _ in chosen
    }
    prepare_to_serve()  # as the agent once it serves (the bench's batches frozen with the heap)
    gc.collect()
    gc.freeze()
    per_record = 1e6 / args.records
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    with Broker("kafka", BROKER_JVMS["kafka"], proxied=False) as broker:
        print(f"broker: {broker.description}, pid {broker.pid}", flush=True)
        broker.create_topic(WARMUP_TOPIC, 1)
        for rep in range(args.reps):
            for name, merge, keyed, now, layout in chosen:
                topic = f"share-{name}-{rep}"
                partitions, batches = laid_out(contents[keyed, now], layout)
                broker.create_topic(topic, partitions)
                elapsed, broker_cpu, kernel, own_cpu = forward(broker, topic, batches, merge)
                row = (
                    args.records / elapsed,
                    broker_cpu * per_record,
                    kernel * per_record,
                    own_cpu * per_record,
                )
                rows.setdefault(name, []).append(row)
                print(
                    f"rep {rep + 1} {name:14s} {row[0]:9.0f} records/s  broker {row[1]:5.2f}"
                    f" CPU-us a record (kernel {row[2]:5.2f})  forwarder {row[3]:5.2f}",
                    flush=True,
                )
    later = slice(1, None) if args.reps > 1 else slice(None)
    print(f"medians of repetitions {'2 on' if args.reps > 1 else '1'} ({args.records:,} records):")
    for name, measured in rows.items():
        kept = measured[later]
        print(
            f"{name:14s} {statistics.median(r[0] for r in kept):9.0f} records/s  broker"
            f" {statistics.median(r[1] for r in kept):5.2f} CPU-us a record (kernel"
            f" {statistics.median(r[2] for r in kept):5.2f})  forwarder"
            f" {statistics.median(r[3] for r in kept):5.2f}"
        )


if __name__ == "__main__":
    main()
