"""Catch-up after a Kafka outage, at fractions of the forward rate measured in the same run.

Not a test: prints a table. First the forward rate ``F`` is measured (the median of three
runs of the ``Forwarder`` forwarding ``--records`` records from a WAL, as ``forward_bench.py``
does; 3,000,000 by default: runs of 300,000, the default before 2026-12-03, are dominated by
the forwarder's start and final checkpoint and gave half the rate, so "90 %" was not near
the limit). Then, for
each load in ``--loads`` (percent of ``F``): records are appended to a fresh WAL (fsync
``interval``) at that rate by a loader thread, the forwarder forwards them, after 5 s every
broker becomes unreachable for ``--outage`` seconds (the mock cluster's brokers set down, or
the fault proxy in front of Kafka cut), and the load goes on throughout.

**Catch-up**, as a user sees it: the time from the broker's return until no record in the
WAL waits to be handed to the Kafka client, i.e. the backlog *outside the forwarder's
in-flight window* is zero. Under continuous load the backlog as a whole never reaches zero
(frames are always in flight, up to ``queue.buffering.max.messages`` records); what is in the
window is acknowledged within a round trip. The table also gives the time to the first
delivery after the return (the client's reconnect backoff is part of catch-up), the drain
rate while ingest continues (net: the forward rate from the first delivery until caught up,
less the load) and that forward rate (gross). A load that does not catch up within
``--give-up`` seconds is shown as ``>`` that time.

By default against librdkafka's mock cluster (3 brokers, bounded memory, not the
bottleneck); ``--broker kafka`` runs against one Apache Kafka node behind the fault proxy.

``--common-rate`` gives both the same records/s: each load a percentage of the lower of
the two F (for a before/after of one design, whose F differ by noise, not by design).

``--baseline-src DIR`` measures a second forwarder in the same run: another checkout's ``src``
(the per-record forwarder, say), in a child ``python`` with ``PYTHONPATH=DIR`` running this
script with ``--side catch-up``: the child loads its WAL and forwards, says ``outage`` after
the warm-up, the parent takes the brokers down, brings them back and says ``returned``, and the
child prints its row as one JSON line. Its F is measured the same way (``forward_bench.py
--side forwarder``) and each load is measured for both forwarders, alternating which goes
first; each forwarder's load is a percentage of its own F.

    .venv/bin/python benchmarks/catch_up_bench.py --loads 25,50,75 --outage 30
    .venv/bin/python benchmarks/catch_up_bench.py --loads 90 --outage 30
    .venv/bin/python benchmarks/catch_up_bench.py --loads 50,90 --baseline-src /tmp/fwd-baseline/src
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from forward_bench import (  # noqa: E402
    PARTITIONS,
    RECORDS_PER_BATCH,
    WARMUP_TOPIC,
    env_for_source,
    load_average,
    make_batches,
    run_forwarder,
    run_forwarder_child,
)

import durable_producer  # noqa: E402
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.process_tuning import prepare_to_serve  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import build_batch  # noqa: E402

if TYPE_CHECKING:
    from bench_brokers import Broker

WARM_S = 5.0
SAMPLE_S = 0.02
FORWARD_RATE_RUNS = 3


@dataclass
class CatchUp:
    load: float
    offered: float
    backlog: int
    first_delivery_s: float
    catch_up_s: float | None
    forwarded_during: int
    waited_s: float
    left: int
    usage: str = ""

    def row(self) -> str:
        delivering_s = max(1e-9, self.waited_s - self.first_delivery_s)
        gross = self.forwarded_during / delivering_s
        net = gross - self.offered
        caught = (
            f"{self.catch_up_s:8.1f} s"
            if self.catch_up_s is not None
            else f" >{self.waited_s:6.0f} s"
        )
        return (
            f"{self.load:4.0f} % {self.offered:10.0f} {self.backlog:11d}"
            f" {self.first_delivery_s:8.1f} s"
            f" {caught} {net:11.0f} {gross:11.0f}   {self.usage}"
        )


HEADER = (
    "load    records/s     backlog  1st del.   caught up   drain/s net  forward/s\n"
    "(backlog: records unacknowledged at the return; 1st del.: first delivery after it;"
    " forward/s: from then until caught up; drain/s net: forward/s minus the load)"
)


def measure_catch_up(
    bootstrap: str,
    topic: str,
    payloads: list[tuple[int, bytes, int]],
    load: float,
    rate: float,
    outage: Callable[[], None],
    give_up_s: float,
    directory: Path,
) -> CatchUp:
    """One load: ``outage()`` is called after the warm-up and returns once the brokers are
    back (the broker's usage is the caller's to add)."""
    wal = WriteAheadLog.open(
        directory / "wal", WalConfig(max_bytes=64 * 1024**3, fsync=FsyncPolicy.INTERVAL)
    )
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(directory / "dead-letter"),
        state_dir=directory / "state",
    ).start()
    stop_loading = threading.Event()
    frame_interval = RECORDS_PER_BATCH / rate

    def load_wal() -> None:
        next_due = time.monotonic()
        index = 0
        while not stop_loading.is_set():
            partition, payload, count = payloads[index % len(payloads)]
            wal.append(topic, partition, payload, count)
            index += 1
            next_due += frame_interval
            stop_loading.wait(max(0.0, next_due - time.monotonic()))

    loader = threading.Thread(target=load_wal, daemon=True)
    try:
        loader.start()
        time.sleep(WARM_S)
        outage()
        stats = forwarder.stats()
        returned = time.monotonic()
        backlog = (wal.next_offset - stats.watermark) * RECORDS_PER_BATCH
        forwarded_at_return = stats.forwarded_records
        first_delivery = catch_up = None
        while (waited := time.monotonic() - returned) < give_up_s:
            forwarded = forwarder.stats().forwarded_records
            if first_delivery is None and forwarded > forwarded_at_return:
                first_delivery = waited
            if first_delivery is not None and forwarder.health.unread == 0:
                catch_up = waited
                break
            time.sleep(SAMPLE_S)
        end = forwarder.stats()
        left = (wal.next_offset - end.watermark) * RECORDS_PER_BATCH if catch_up is None else 0
        return CatchUp(
            load=load,
            offered=rate,
            backlog=backlog,
            first_delivery_s=first_delivery if first_delivery is not None else waited,
            catch_up_s=catch_up,
            forwarded_during=end.forwarded_records - forwarded_at_return,
            waited_s=waited,
            left=left,
        )
    finally:
        stop_loading.set()
        loader.join()
        forwarder.stop()
        wal.close()


def catch_up_side(args: argparse.Namespace) -> None:
    """``--side catch-up`` (the child of ``--baseline-src``): one load, as one JSON line; the
    parent makes the outage between our ``outage`` line and its ``returned`` line."""
    batches = make_batches(args.records)
    payloads = [(partition, build_batch(records), len(records)) for partition, records in batches]
    prepare_to_serve()  # as the agent does once it serves (the test data frozen with the heap)

    def outage() -> None:
        print("outage", flush=True)
        if sys.stdin.readline().strip() != "returned":
            raise SystemExit("the parent went away")

    with tempfile.TemporaryDirectory() as scratch:
        result = measure_catch_up(
            args.bootstrap,
            args.topic,
            payloads,
            args.load,
            args.rate,
            outage,
            args.give_up,
            Path(scratch),
        )
    print(json.dumps(dataclasses.asdict(result)), flush=True)


def baseline_catch_up(
    source: Path,
    broker: Broker,
    topic: str,
    args: argparse.Namespace,
    load: float,
    rate: float,
    log: Path,
) -> CatchUp:
    """One load for the forwarder of ``source``, in a child (``catch_up_side``)."""
    env = env_for_source(source)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--side",
        "catch-up",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--records",
        str(args.records),
        "--load",
        str(load),
        "--rate",
        str(rate),
        "--give-up",
        str(args.give_up),
    ]
    with log.open("ab") as errors:
        child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert child.stdin is not None and child.stdout is not None
    try:
        for line in child.stdout:
            if line.strip() == "outage":
                break
        else:
            raise RuntimeError(f"the baseline child ended before its outage (see {log})")
        with broker.outage():
            time.sleep(args.outage)
        child.stdin.write("returned\n")
        child.stdin.flush()
        output = child.stdout.read()
        if child.wait(timeout=60) != 0:
            raise RuntimeError(f"the baseline child failed (see {log})")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return CatchUp(**json.loads(output.strip().splitlines()[-1]))


def forward_rate(rates: list[float]) -> str:
    return (
        f"{statistics.median(rates):.0f} records/s, median of {' '.join(f'{r:.0f}' for r in rates)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--records",
        type=int,
        default=3_000_000,
        help="records of each forward-rate run (shorter runs are dominated by the start and"
        " the final checkpoint: 300,000 gave half the rate 3,000,000 did)",
    )
    parser.add_argument("--loads", default="25,50,75,90", help="percent of the forward rate")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds")
    parser.add_argument("--give-up", type=float, default=240.0, help="seconds after the return")
    parser.add_argument("--broker", choices=("mock", "kafka"), default="mock")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout's src (e.g. the per-record forwarder's): its forwarder too",
    )
    parser.add_argument(
        "--common-rate",
        action="store_true",
        help="with --baseline-src: each load a percentage of the lower F of the two, the same"
        " records/s for both (a before/after of one design; without it each has its own F)",
    )
    parser.add_argument("--side", choices=("all", "catch-up"), default="all", help="internal")
    parser.add_argument("--bootstrap", help="with --side catch-up")
    parser.add_argument("--topic", help="with --side catch-up")
    parser.add_argument("--load", type=float, help="with --side catch-up: percent of F")
    parser.add_argument("--rate", type=float, help="with --side catch-up: records/s")
    args = parser.parse_args()
    if args.side == "catch-up":
        if not args.bootstrap or not args.topic or args.load is None or args.rate is None:
            raise SystemExit("--side catch-up needs --bootstrap, --topic, --load and --rate")
        catch_up_side(args)
        return
    # Not at the top: the --side catch-up child may run an older src without it.
    from bench_brokers import brokers_for

    try:
        loads = [float(part) for part in args.loads.split(",")]
    except ValueError:
        raise SystemExit(f"--loads {args.loads}: give percentages, e.g. 25,50,75,90") from None
    baseline = args.baseline_src.resolve() if args.baseline_src is not None else None
    if baseline is not None and not (baseline / "durable_producer").is_dir():
        raise SystemExit(f"--baseline-src {baseline}: no durable_producer in it")
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load average"
        f" {load_average()}, forwarder from {Path(durable_producer.__file__).resolve().parent}",
        flush=True,
    )
    batches = make_batches(args.records)
    payloads = [(partition, build_batch(records), len(records)) for partition, records in batches]
    prepare_to_serve()  # as the agent does: the test data must not slow every collection
    forwarders = ["this"] + (["baseline"] if baseline is not None else [])
    results: dict[str, list[CatchUp]] = {name: [] for name in forwarders}
    rates: dict[str, list[float]] = {name: [] for name in forwarders}
    with tempfile.TemporaryDirectory() as scratch:
        child_log = Path(scratch) / "baseline.log"
        for index, broker in brokers_for(args.broker, len(loads) + 1, WARMUP_TOPIC):
            directory = Path(scratch) / str(index)
            if index == 0:
                for attempt in range(FORWARD_RATE_RUNS):
                    for name in forwarders:
                        topic = f"forward-rate-{name}-{attempt}"
                        broker.create_topic(topic, PARTITIONS)
                        if name == "this":
                            elapsed, _, _ = run_forwarder(
                                broker.bootstrap, topic, batches, directory / str(attempt)
                            )
                        else:
                            assert baseline is not None
                            elapsed, *_ = run_forwarder_child(
                                baseline,
                                broker.bootstrap,
                                topic,
                                args.records,
                                RECORDS_PER_BATCH,
                                preloaded=False,
                            )
                        rates[name].append(args.records / elapsed)
                for name in forwarders:
                    print(
                        f"forward rate F ({name}): {forward_rate(rates[name])}"
                        f" ({args.records} records each)",
                        flush=True,
                    )
                continue
            load = loads[index - 1]
            order = forwarders if index % 2 else forwarders[::-1]
            lowest = min(statistics.median(rates[name]) for name in forwarders)
            for name in order:
                own = statistics.median(rates[name])
                rate = (lowest if args.common_rate else own) * load / 100
                topic = f"catch-up-{name}-{load:g}"
                broker.create_topic(topic, PARTITIONS)
                before = broker.usage()
                if name == "this":

                    def outage(broker: Broker = broker) -> None:
                        with broker.outage():
                            time.sleep(args.outage)

                    result = measure_catch_up(
                        broker.bootstrap,
                        topic,
                        payloads,
                        load,
                        rate,
                        outage,
                        args.give_up,
                        directory / name,
                    )
                else:
                    assert baseline is not None
                    result = baseline_catch_up(baseline, broker, topic, args, load, rate, child_log)
                result.usage = broker.usage().since(before)
                results[name].append(result)
                print(f"{name:8s} {result.row()}", flush=True)
    print(f"\nbroker: {args.broker}; outage {args.outage:.0f} s")
    for name in forwarders:
        source = baseline if name == "baseline" else Path(durable_producer.__file__).parent
        print(f"\n{name} forwarder ({source}): F {forward_rate(rates[name])}")
        print(HEADER)
        for result in results[name]:
            print(result.row())
    print(f"\nload average {load_average()} (1, 5, 15 min) at the end")


if __name__ == "__main__":
    main()
