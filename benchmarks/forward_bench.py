"""Forward rate of the WAL forwarder vs a plain confluent-kafka ``produce()`` loop and vs
librdkafka's own C producer.

Not a test: prints figures. By default against librdkafka's mock cluster of 3 brokers
(``--broker mock``), which is not the bottleneck: the figures measure the forwarder. With
``--broker kafka`` it runs against one Apache Kafka node (clients connected to it directly:
no fault proxy, whose relay thread would run in this process beside the Python loops), with
``--broker cluster`` against three (RF 3, ``min.insync.replicas=2``, acks=all): JVMs on the
same cores (``--broker-jvm``: Kafka's start-script options by default). Every side's line
prints the broker used and the CPU seconds it took over the side's whole run (start and
warm-up included) and over its timed span alone (sampled every 20 ms, ``CpuTrace``), and its
resident memory (summed over the cluster's three JVMs).

Sides of a round, one after the other, each to its own topic: the Python loop, the loop with
delivery reports, librdkafka's C producer (``rdkafka_producer.c``, compiled as
``ingest_bench.py`` compiles it; the same record count and value size, no key; acks=all,
idempotence, linger.ms=5; its untimed warm-up record goes to the warm-up topic; skipped with
one line without a C compiler or librdkafka's header: ``make bench-tools``), the forwarder of
this checkout, and with ``--baseline-src DIR`` the forwarder of another checkout's ``src``
(a child ``python`` with ``PYTHONPATH=DIR`` running this script with ``--side forwarder``,
which prints one JSON line; the two forwarders swap order every round). The forwarders'
children start first in a round: they build their batches and WAL (untimed) and wait, so that
the round's sides then run back to back (before 2026-12-04's third session each child built
its WAL after the other sides had run, and its forwarder ran some 20 s after them: in a Kafka
broker's slow episodes, which come and go over tens of seconds, more often than they did).
Each round starts one side later in that order than the round before (round 1 the Python
loop, round 2 the loop with reports, ...), so that no side always follows the same one; each
ratio line gives the median of its rounds' ratios beside the ratio of the median rates: many
short rounds (``--rounds 9 --records 300000``) measure it better than a few long ones.

``--records-per-batch 1`` stands for clients with ``linger.ms=0``: one record a stored batch
(the batch forwarder merges consecutive uncompressed batches of a partition); the Python loops
then use linger.ms=0 (the C producer keeps linger.ms=5).

Against Kafka, the bench's records first go once through a Python loop to a topic of their
own, untimed (``--cold-broker`` skips it): the broker's JIT compiles its hot paths over about
the first million records, which otherwise cost the first round's first side most.

Each round produces the same records (200-byte values, keys, explicit partitions and
timestamps) three ways to the same broker, one after the other, with the same client
settings (acks=all, idempotent, linger.ms=5): a plain Python ``produce()`` loop, the same
loop with a delivery callback per record, and the ``Forwarder`` reading them from a WAL
(timed from the first append until ``drain()`` returns: all acknowledged and checkpointed).
Against the mock, the sum of each topic's high watermarks is checked to equal the records
sent (the mock keeps only ~5 MB per partition, so records are counted by offsets, not read).

The records are built before the clock starts and the heap is then frozen (``gc.freeze``,
as the agent does once serving): otherwise every garbage collection of either side scans
the test data (measured: 350k instead of 615k records/s for the forwarder). The batches
built of them for the WAL are frozen too (before 2026-12-03 they were not: with one-record
batches the forwarder's full collections walked that list, about a seventh of its CPU).
Each forwarder runs in a child process of its own with the process tuning its checkout's
agent applies once serving (``process_tuning.prepare_to_serve``: freed heap kept for reuse,
the startup heap frozen), which the Python loops, an application's process, do not get.

Catch-up after an outage: ``benchmarks/catch_up_bench.py``.

    .venv/bin/python benchmarks/forward_bench.py --records 300000 --rounds 3 [--broker kafka]
        [--baseline-src /tmp/fwd-baseline/src] [--records-per-batch 1]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


import durable_producer  # noqa: E402
from durable_producer.buffer_agent.forward.config import ForwarderConfig  # noqa: E402
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import SampleRecord, build_batch  # noqa: E402

if TYPE_CHECKING:
    from bench_brokers import Broker

Timed = tuple[float, float, float, float]
"""A side's run: (seconds, CPU seconds, of which appends, when its timed span ended:
``time.perf_counter``, the system's monotonic clock, read in the parent or the child)."""
Side = tuple[str, str, Callable[[str], Timed]]
"""A side's name, topic prefix, and its run."""

PARTITIONS = 4
RECORDS_PER_BATCH = 500
VALUE_SIZE = 200
BASE_TIMESTAMP = 1_732_240_000_000
WARMUP_TOPIC = "warm-up"


def make_batches(
    records: int, per_batch: int = RECORDS_PER_BATCH, partitions: int = PARTITIONS
) -> list[tuple[int, list[SampleRecord]]]:
    """``per_batch`` records a stored batch, the batches round robin over ``partitions``."""
    batches = []
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        batch = [
            SampleRecord(
                key=b"key-%08d" % (start + i),
                value=(b"%08d" % (start + i)) * (VALUE_SIZE // 8),
                timestamp_ms=BASE_TIMESTAMP + start + i,
            )
            for i in range(count)
        ]
        batches.append(((start // per_batch) % partitions, batch))
    return batches


def run_direct(
    bootstrap: str,
    topic: str,
    batches: list,
    *,
    with_reports: bool = False,
    linger_ms: int = 5,
    security: dict[str, str] | None = None,
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
            "linger.ms": linger_ms,
            "message.timeout.ms": 0,
            "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 64 * 1024,
            **(security or {}),
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
    bootstrap: str,
    topic: str,
    batches: list,
    directory: Path,
    *,
    preloaded: bool = False,
    security: dict[str, str] | None = None,
    window: list[float] | None = None,
    config: ForwarderConfig | None = None,
    ready: Callable[[], None] | None = None,
) -> tuple[float, float, float]:
    """Time from the first append of the batches to the WAL until Kafka acknowledged all:
    (seconds, process CPU seconds, CPU seconds of the appending thread).

    A warm-up frame is forwarded first, so the idempotent producer's id (it takes a moment on
    any broker) is not timed, as in ``run_direct``. Appending overlaps with forwarding, as in
    the agent; with 500-record batches the appends take a small share of the time, with
    one-record batches about half the CPU (hence the third figure).

    ``preloaded``: every batch is in the WAL before the forwarder starts (a backlog, as after
    an outage); timed from the forwarder's start (its producer id included) to the end, the
    appends untimed. ``security``: the connection's security settings (``client_config``'s
    names), for a secured broker (``secured_forward_bench.py``). ``window``: given, the timed
    span's start and end are appended to it (``time.perf_counter``, the system's monotonic
    clock, which the parent reads too: it counts the broker's CPU over that span alone).
    ``config``: the forwarder's settings (default ``ForwarderConfig()``). ``ready``: called
    (and waited for) once everything untimed is done, just before the forwarder starts.
    """
    wal = WriteAheadLog.open(
        directory / "wal", WalConfig(max_bytes=4 * 1024**3, fsync=FsyncPolicy.NEVER)
    )

    def new_forwarder() -> Forwarder:
        return Forwarder(
            wal,
            {"bootstrap.servers": bootstrap, **(security or {})},
            dead_letters=DeadLetterStore(directory / "dead-letter"),
            state_dir=directory / "state",
            config=config or ForwarderConfig(),
        ).start()

    try:
        wal.append(WARMUP_TOPIC, 0, build_batch([SampleRecord(None, b"warm-up", 1)]), 1)
        payloads = [
            (partition, build_batch(records), len(records)) for partition, records in batches
        ]
        # The built batches are the bench's, not the agent's: frozen like the records
        # (unfrozen, the forwarder's full collections walked this million-item list: 0.35 us
        # of its 2.5 us a one-record batch, against Apache Kafka).
        gc.collect()
        gc.freeze()
        if preloaded:
            for partition, payload, count in payloads:
                wal.append(topic, partition, payload, count)
            gc.collect()
            if ready is not None:
                ready()
            started, cpu_started = time.perf_counter(), time.process_time()
            forwarder = new_forwarder()
            summary = forwarder.drain(timeout_s=900)
            ended, cpu = time.perf_counter(), time.process_time() - cpu_started
            assert summary.complete, summary
            if window is not None:
                window += [started, ended]
            return ended - started, cpu, 0.0
        if ready is not None:
            ready()
        forwarder = new_forwarder()
        deadline = time.monotonic() + 30
        while forwarder.stats().watermark < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        started, cpu_started = time.perf_counter(), time.process_time()
        thread_started = time.thread_time()
        for partition, payload, count in payloads:
            wal.append(topic, partition, payload, count)
        appends = time.thread_time() - thread_started
        summary = forwarder.drain(timeout_s=900)
        ended, cpu = time.perf_counter(), time.process_time() - cpu_started
        assert summary.complete, summary
        if window is not None:
            window += [started, ended]
        return ended - started, cpu, appends
    finally:
        wal.close()


C_PRODUCER_LINGER_MS = 5
C_PRODUCER_SETTINGS = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": str(C_PRODUCER_LINGER_MS),
    "message.timeout.ms": "0",
    "queue.buffering.max.messages": "100000",
    "queue.buffering.max.kbytes": str(64 * 1024),
}
"""The Python loop's settings (the C producer sends no key, so 12 B less a record)."""

FORWARD = "forwarder (WAL -> Kafka)"
BASELINE = "baseline forwarder"
DIRECT = "direct produce"
REPORTED = "direct + delivery reports"
C_PRODUCER = "C producer (librdkafka)"


def run_c_producer(binary: Path, bootstrap: str, topic: str, records: int) -> Timed:
    """``rdkafka_producer`` with ``-W``: its warm-up is untimed, it prints the timed part (its
    span taken as ending when it exits: after its ``rd_kafka_destroy``, a few ms)."""
    command = [str(binary), bootstrap, topic, str(records), str(VALUE_SIZE), "-W", WARMUP_TOPIC]
    for key, value in C_PRODUCER_SETTINGS.items():
        command += ["-X", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"rdkafka_producer failed: {done.stderr.strip()[-500:]}")
    elapsed, cpu = (float(field) for field in done.stdout.split())
    return elapsed, cpu, 0.0, time.perf_counter()


def env_for_source(source: Path) -> dict[str, str]:
    """This process's environment with ``source`` (a checkout's ``src``) first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(source), env.get("PYTHONPATH", "")) if part
    )
    return env


class ForwarderChild:
    """The forwarder of a checkout's ``src`` (this one's, or ``--baseline-src``): this script
    in a child ``python`` with ``--side forwarder``, as an agent's process of its own. It
    builds its own batches and (``preloaded``) its WAL, untimed, says ``ready``, and waits:
    ``run`` lets it go and reads its one JSON line. A round starts its forwarders first and
    runs its other sides once they are ready, so that every side runs within seconds of the
    others (the broker's slow episodes come and go over tens of seconds: docs/benchmarks.md)."""

    def __init__(
        self,
        source: Path,
        bootstrap: str,
        topic: str,
        records: int,
        per_batch: int,
        preloaded: bool,
    ) -> None:
        self.source = source
        env = env_for_source(source)
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--side",
            "forwarder",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--records",
            str(records),
            "--records-per-batch",
            str(per_batch),
        ] + (["--preloaded"] if preloaded else [])
        # Its stderr, read only on failure (a pipe left unread could fill); closed by close().
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        assert self._process.stdout is not None
        said = self._process.stdout.readline().strip()
        if said != CHILD_READY:
            self._fail(f"said {said!r} instead of {CHILD_READY!r}")

    def run(self) -> Timed:
        process = self._process
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        try:
            out, _ = process.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            self._fail("did not finish within 900 s")
        if process.returncode != 0:
            self._fail(f"exited with {process.returncode}")
        result = json.loads(out.strip().splitlines()[-1])
        if not Path(result["source"]).resolve().is_relative_to(self.source.resolve()):
            raise RuntimeError(
                f"the child ran {result['source']}, not the code under {self.source}"
            )
        return result["elapsed"], result["cpu"], result["appends"], result["ended"]

    def _fail(self, what: str) -> NoReturn:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._errors.seek(0)
        errors = self._errors.read().strip()[-1500:]
        self.close()
        raise RuntimeError(f"the forwarder of {self.source} {what}: {errors}")

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._errors.close()


CHILD_READY = "ready"


def run_forwarder_child(
    source: Path, bootstrap: str, topic: str, records: int, per_batch: int, preloaded: bool
) -> Timed:
    """A ``ForwarderChild`` let go as soon as it is ready."""
    child = ForwarderChild(source, bootstrap, topic, records, per_batch, preloaded)
    try:
        return child.run()
    finally:
        child.close()


def wait_for_go() -> None:
    """The child's side of ``ForwarderChild``: ready, then wait for the parent's word."""
    print(CHILD_READY, flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("forward_bench --side forwarder: the parent went away")


def forwarder_side(args: argparse.Namespace) -> None:
    """``--side forwarder``: one forwarder measurement, as one JSON line (the parent's
    ``--baseline-src`` runs this with another checkout's ``src`` first on the path)."""
    from durable_producer.buffer_agent.process_tuning import prepare_to_serve

    batches = make_batches(args.records, args.records_per_batch)
    prepare_to_serve()  # as the agent does once it serves (the heap frozen with the batches)
    window: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        elapsed, cpu, appends = run_forwarder(
            args.bootstrap,
            args.topic,
            batches,
            Path(scratch),
            preloaded=args.preloaded,
            window=window,
            ready=wait_for_go,
        )
    source = str(Path(durable_producer.__file__).resolve().parent)
    result = {
        "elapsed": elapsed,
        "cpu": cpu,
        "appends": appends,
        "source": source,
        "ended": window[1],
    }
    print(json.dumps(result), flush=True)


def round_topic(prefix: str, round_index: int) -> str:
    """The topic a side writes in a round: a new one each time (its high watermarks are the
    side's records alone)."""
    return f"{prefix}-{round_index}"


def run_round(
    broker: Broker,
    round_index: int,
    batches: list,
    args: argparse.Namespace,
    c_producer: Path | None,
) -> dict[str, tuple[float, float, float, str]]:
    """One round: every side, each with the broker CPU and memory it took (its CPU over the
    side's whole run, then over the timed span alone)."""
    from bench_brokers import CpuTrace

    records = args.records
    linger_ms = 0 if args.records_per_batch == 1 else 5
    results: dict[str, tuple[float, float, float, str]] = {}
    sides: list[Side] = [
        (
            DIRECT,
            "direct",
            lambda topic: (
                *run_direct(broker.bootstrap, topic, batches, linger_ms=linger_ms),
                0.0,
                time.perf_counter(),
            ),
        ),
        (
            REPORTED,
            "reported",
            lambda topic: (
                *run_direct(
                    broker.bootstrap, topic, batches, with_reports=True, linger_ms=linger_ms
                ),
                0.0,
                time.perf_counter(),
            ),
        ),
    ]
    if c_producer is not None:
        sides.append(
            (
                C_PRODUCER,
                "c-producer",
                lambda topic: run_c_producer(c_producer, broker.bootstrap, topic, records),
            )
        )
    sources = [(FORWARD, "forward", ROOT / "src")]
    if args.baseline_src is not None:
        sources.append((BASELINE, "baseline", args.baseline_src))
        if round_index % 2:
            sources.reverse()  # the two forwarders alternate which goes first
    with contextlib.ExitStack() as children:
        forwarders: list[Side] = []
        for name, prefix, source in sources:
            # Started (batches built, WAL preloaded) before the other sides run: every side
            # of the round then runs within seconds of the others.
            child = ForwarderChild(
                source,
                broker.bootstrap,
                round_topic(prefix, round_index),
                records,
                args.records_per_batch,
                args.preloaded,
            )
            children.callback(child.close)
            forwarders.append((name, prefix, lambda _topic, child=child: child.run()))
        order = sides + forwarders
        first = round_index % len(order)  # each side goes first in turn
        for name, prefix, run in order[first:] + order[:first]:
            topic = round_topic(prefix, round_index)
            broker.create_topic(topic, PARTITIONS)
            before = broker.usage()
            with CpuTrace(lambda: broker.usage().cpu_s) as trace:
                elapsed, cpu, appends, ended = run(topic)
            timed = trace.between(ended - elapsed, ended)
            usage = f"{broker.usage().since(before)}, {timed:5.2f} s of its cpu in the timed span"
            appended = broker.appended(topic, PARTITIONS)
            if appended not in (-1, records):
                raise RuntimeError(f"{name}: the broker has {appended} of {records} records")
            results[name] = (elapsed, cpu, appends, usage)
    return results


BROKER_WARM_UP_TOPIC = "broker-warm-up"


def warm_up_broker(broker: Broker, batches: list) -> None:
    """The bench's records once through a Python loop (linger.ms=5) to a topic of their own,
    untimed, before the first round: a Kafka broker's JIT compiles its hot paths over the
    first million records or so, which otherwise cost the first round's first side most."""
    broker.create_topic(BROKER_WARM_UP_TOPIC, PARTITIONS)
    records = sum(len(records) for _, records in batches)
    elapsed, _ = run_direct(broker.bootstrap, BROKER_WARM_UP_TOPIC, batches)
    print(f"broker warm-up: {records} records in {elapsed:.1f} s (untimed)", flush=True)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def summarize(
    args: argparse.Namespace, runs: dict[str, list[tuple[float, float, float, str]]]
) -> None:
    million = 1e6 / args.records
    payload_mb = args.records * (VALUE_SIZE + 12) / 1e6
    linger_ms = 0 if args.records_per_batch == 1 else 5
    print(f"broker                      {args.broker}")
    print(
        f"records per run             {args.records} x {VALUE_SIZE} B values,"
        f" {args.records_per_batch} records a stored batch, {args.rounds} rounds,"
        f" forwarders {'from a preloaded WAL' if args.preloaded else 'while appending'};"
        f" Python loops linger.ms={linger_ms}, C producer linger.ms={C_PRODUCER_LINGER_MS}"
    )
    if args.baseline_src is not None:
        print(f"baseline forwarder          {args.baseline_src}")
    rates: dict[str, float] = {}
    cpus: dict[str, float] = {}
    for name, measured in runs.items():
        rate = args.records / statistics.median(elapsed for elapsed, _, _, _ in measured)
        cpu = statistics.median(cpu for _, cpu, _, _ in measured) * million
        appends = statistics.median(appends for _, _, appends, _ in measured) * million
        rates[name], cpus[name] = rate, cpu
        print(
            f"{name:27s} {rate:10.0f} records/s {rate * payload_mb / args.records:6.1f} MB/s"
            f"  cpu {cpu:5.2f} s per million records"
            f"  (rounds: {' '.join(f'{args.records / e:.0f}' for e, _, _, _ in measured)})"
        )
        if appends:
            print(
                f"{'':27s} {'':10s}   of which the WAL appends (benchmark's thread) {appends:5.2f}"
            )

    def ratio(top: str, bottom: str) -> None:
        if top not in runs or bottom not in runs:
            return
        paired = [low[0] / high[0] for high, low in zip(runs[top], runs[bottom], strict=True)]
        per_round = " ".join(f"{value:.2f}" for value in paired)
        label = f"{top.split(' (')[0]} / {bottom.split(' (')[0]}"
        print(
            f"{label:46s} {rates[top] / rates[bottom]:6.2f}x  (per round: {per_round};"
            f" their median {statistics.median(paired):.2f});"
            f" cpu per record {cpus[top] / cpus[bottom]:.2f}x"
        )

    for forwarder in (FORWARD, BASELINE):
        for other in (DIRECT, REPORTED, C_PRODUCER):
            ratio(forwarder, other)
    ratio(FORWARD, BASELINE)
    print(f"load average                {load_average()} (1, 5, 15 min) at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--broker", choices=("mock", "kafka", "cluster"), default="mock")
    parser.add_argument(
        "--broker-jvm",
        choices=("kafka", "test-bed"),
        default="kafka",
        help="JVM options of the Kafka brokers: Kafka's start script's (default) or the tests'",
    )
    parser.add_argument(
        "--records-per-batch",
        type=int,
        default=RECORDS_PER_BATCH,
        help="records a stored client batch; 1 stands for linger.ms=0 clients",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout's src (e.g. the per-record forwarder's): its forwarder too",
    )
    parser.add_argument(
        "--preloaded",
        action="store_true",
        help="the forwarders start on a WAL holding every batch (a backlog); appends untimed",
    )
    parser.add_argument(
        "--cold-broker",
        action="store_true",
        help="no untimed warm-up of a Kafka broker's JIT before the first round",
    )
    parser.add_argument("--side", choices=("all", "forwarder"), default="all", help="internal")
    parser.add_argument("--bootstrap", help="with --side forwarder")
    parser.add_argument("--topic", help="with --side forwarder")
    args = parser.parse_args()
    if args.records_per_batch < 1:
        raise SystemExit("--records-per-batch: at least 1")
    if args.side == "forwarder":
        if not args.bootstrap or not args.topic:
            raise SystemExit("--side forwarder needs --bootstrap and --topic")
        forwarder_side(args)
        return
    # Not at the top: the --side forwarder child may run an older src without them.
    from bench_brokers import BROKER_JVMS, brokers_for
    from ingest_bench import build_rdkafka_producer

    if args.baseline_src is not None:
        args.baseline_src = args.baseline_src.resolve()
        if not (args.baseline_src / "durable_producer").is_dir():
            raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
    started = datetime.datetime.now(datetime.UTC)
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, load average {load_average()}, forwarder from"
        f" {Path(durable_producer.__file__).resolve().parent}",
        flush=True,
    )
    batches = make_batches(args.records, args.records_per_batch)
    # The agent freezes its startup heap (process_tuning); here the million test records
    # would otherwise make every garbage collection of either side scan them all.
    gc.collect()
    gc.freeze()
    runs: dict[str, list[tuple[float, float, float, str]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        c_producer = build_rdkafka_producer(Path(scratch))
        if c_producer is None:
            print(
                "C producer: skipped (no C compiler or librdkafka header: run `make bench-tools`)",
                flush=True,
            )
        jvm = BROKER_JVMS[args.broker_jvm]
        for round_index, broker in brokers_for(
            args.broker, args.rounds, WARMUP_TOPIC, jvm_options=jvm, proxied=False
        ):
            if round_index == 0 and args.broker != "mock" and not args.cold_broker:
                warm_up_broker(broker, batches)
            results = run_round(broker, round_index, batches, args, c_producer)
            for name, result in results.items():
                runs.setdefault(name, []).append(result)
                elapsed, cpu, _, usage = result
                print(
                    f"  round {round_index + 1} {name:27s} {args.records / elapsed:10.0f}"
                    f" records/s  cpu {cpu * 1e6 / args.records:5.2f} s/M  {usage}",
                    flush=True,
                )
    summarize(args, runs)


if __name__ == "__main__":
    main()
