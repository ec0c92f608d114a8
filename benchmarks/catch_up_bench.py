"""Catch-up after a Kafka outage, at fractions of the forward rate measured in the same run.

Not a test: prints a table. First the forward rate ``F`` is measured (the median of three
runs of the ``Forwarder`` forwarding ``--records`` records from a WAL, as ``forward_bench.py``
does). Then, for
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

    .venv/bin/python benchmarks/catch_up_bench.py --loads 25,50,75 --outage 30
    .venv/bin/python benchmarks/catch_up_bench.py --loads 90 --outage 30
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_brokers import BROKERS, Broker, brokers_for  # noqa: E402
from forward_bench import (  # noqa: E402
    PARTITIONS,
    RECORDS_PER_BATCH,
    WARMUP_TOPIC,
    make_batches,
    run_forwarder,
)

from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import build_batch  # noqa: E402

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
    usage: str

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
    broker: Broker,
    payloads: list[tuple[int, bytes, int]],
    load: float,
    rate: float,
    outage_s: float,
    give_up_s: float,
    directory: Path,
) -> CatchUp:
    topic = f"catch-up-{load:g}"
    broker.create_topic(topic, PARTITIONS)
    wal = WriteAheadLog.open(
        directory / "wal", WalConfig(max_bytes=64 * 1024**3, fsync=FsyncPolicy.INTERVAL)
    )
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": broker.bootstrap},
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
    before = broker.usage()
    try:
        loader.start()
        time.sleep(WARM_S)
        with broker.outage():
            time.sleep(outage_s)
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
            usage=broker.usage().since(before),
        )
    finally:
        stop_loading.set()
        loader.join()
        forwarder.stop()
        wal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=300_000, help="forward-rate measurement")
    parser.add_argument("--loads", default="25,50,75,90", help="percent of the forward rate")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds")
    parser.add_argument("--give-up", type=float, default=240.0, help="seconds after the return")
    parser.add_argument("--broker", choices=BROKERS, default="mock")
    args = parser.parse_args()
    try:
        loads = [float(part) for part in args.loads.split(",")]
    except ValueError:
        raise SystemExit(f"--loads {args.loads}: give percentages, e.g. 25,50,75,90") from None
    batches = make_batches(args.records)
    payloads = [(partition, build_batch(records), len(records)) for partition, records in batches]
    gc.collect()
    gc.freeze()  # as the agent does: the test data must not slow every collection
    results: list[CatchUp] = []
    rate = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for index, broker in brokers_for(args.broker, len(loads) + 1, WARMUP_TOPIC):
            directory = Path(scratch) / str(index)
            if index == 0:
                rates = []
                for attempt in range(FORWARD_RATE_RUNS):
                    topic = f"forward-rate-{attempt}"
                    broker.create_topic(topic, PARTITIONS)
                    elapsed, _ = run_forwarder(
                        broker.bootstrap, topic, batches, directory / str(attempt)
                    )
                    rates.append(args.records / elapsed)
                rate = statistics.median(rates)
                print(
                    f"forward rate F: {rate:.0f} records/s, median of"
                    f" {' '.join(f'{r:.0f}' for r in rates)} ({args.records} records each)",
                    flush=True,
                )
                continue
            load = loads[index - 1]
            results.append(
                measure_catch_up(
                    broker,
                    payloads,
                    load,
                    rate * load / 100,
                    args.outage,
                    args.give_up,
                    directory,
                )
            )
            print(results[-1].row(), flush=True)
    print(
        f"\nbroker: {args.broker}; outage {args.outage:.0f} s; forward rate F {rate:.0f} records/s"
    )
    print(HEADER)
    for result in results:
        print(result.row())


if __name__ == "__main__":
    main()
