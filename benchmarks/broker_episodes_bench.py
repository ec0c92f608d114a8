"""Whether one Apache Kafka node on this machine goes through slow episodes with no forwarder
in the way: librdkafka's C producer alone, a short run every few seconds, each to a new topic.

Not a test: prints one line a run (seconds since the start, records/s, the broker's CPU and
its kernel's share, in microseconds a record). On these machines the broker's kernel time
(its writes to the page cache and page faults on its files, ``perf``) rose from about 0.2 to
2-3.7 us a record for tens of seconds at a time, whoever the client was, and the C
producer's rate fell from 1.1-1.5M to 0.2-0.6M records/s in them. A side of
``forward_bench.py`` that runs in such an episode is measured against a slower broker than
the sides before it: read each side's "kernel" figure before comparing rates.

``--loop-first`` first sends the records once through a Python ``produce()`` loop with
linger.ms=0, as ``forward_bench.py``'s first side does (an episode began 37 s after it once).
Needs the C producer (``make bench-tools``).

    .venv/bin/python benchmarks/broker_episodes_bench.py [--duration 180] [--records 300000]
        [--pause 2] [--loop-first]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_brokers import BROKER_JVMS, Broker  # noqa: E402
from forward_bench import (  # noqa: E402
    PARTITIONS,
    WARMUP_TOPIC,
    make_batches,
    run_c_producer,
    run_direct,
)
from ingest_bench import build_rdkafka_producer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of runs")
    parser.add_argument("--records", type=int, default=300_000, help="records a run")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    parser.add_argument("--loop-first", action="store_true")
    args = parser.parse_args()
    if args.records < 1 or args.duration <= 0 or args.pause < 0:
        raise SystemExit("--records: at least 1; --duration: above 0; --pause: not below 0")
    with tempfile.TemporaryDirectory() as scratch:
        producer = build_rdkafka_producer(Path(scratch))
        if producer is None:
            raise SystemExit("needs the C producer: run `make bench-tools`")
        with Broker("kafka", BROKER_JVMS["kafka"], proxied=False) as broker:
            print(f"broker: {broker.description}, pid {broker.pid}", flush=True)
            broker.create_topic(WARMUP_TOPIC, 1)
            if args.loop_first:
                broker.create_topic("loop", PARTITIONS)
                elapsed, _ = run_direct(
                    broker.bootstrap, "loop", make_batches(args.records, 1), linger_ms=0
                )
                print(f"Python loop, linger.ms=0: {args.records / elapsed:,.0f} records/s")
            per_record = 1e6 / args.records
            started = time.monotonic()
            run = 0
            while time.monotonic() - started < args.duration:
                run += 1
                topic = f"episodes-{run}"
                broker.create_topic(topic, PARTITIONS)
                before, at = broker.usage(), time.monotonic() - started
                elapsed, *_ = run_c_producer(producer, broker.bootstrap, topic, args.records)
                after = broker.usage()
                print(
                    f"{at:6.1f} s  {args.records / elapsed:9,.0f} records/s  broker"
                    f" {(after.cpu_s - before.cpu_s) * per_record:5.2f} CPU-us a record"
                    f" (kernel {(after.system_s - before.system_s) * per_record:5.2f})",
                    flush=True,
                )
                time.sleep(args.pause)


if __name__ == "__main__":
    main()
