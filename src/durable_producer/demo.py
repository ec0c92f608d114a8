"""The main job on the embedded default: a local Kafka-compatible broker (tansu) behind a fault
proxy, one buffer agent, and a load generator producing through the agent, with a broker
outage in the middle. It then reads the topic back and checks every acknowledged record.

    python -m durable_producer.demo            # or: make demo
    python -m durable_producer.demo --help     # rate, duration, outage, fsync policy...

Exit code 0 when every record the agent acknowledged reached Kafka intact, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from .local.agent_process import AgentProcess
from .local.broker import ProxiedBroker, consume_all, create_topic

FORWARDED = "durable_agent_forwarded_records_total"
WAL_BYTES = "durable_agent_backlog_bytes"


def record_value(index: int, size: int) -> bytes:
    seed = f"record-{index}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


@dataclass
class LoadStats:
    sent: int = 0
    acknowledged: int = 0
    errors: int = 0
    acked_ids: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def generate_load(
    bootstrap: str,
    topic: str,
    rate: int,
    duration_s: float,
    size: int,
    stats: LoadStats,
    stop: threading.Event,
) -> None:
    """Produce ``rate`` records/s through the agent for ``duration_s`` seconds."""
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
        with stats.lock:
            if error is None:
                stats.acknowledged += 1
                stats.acked_ids.add(int(message.key()))  # type: ignore[attr-defined]
            else:
                stats.errors += 1

    started = time.monotonic()
    tick = 0.01
    index = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= duration_s:
            break
        due = int(rate * elapsed)
        while index < due:
            try:
                producer.produce(
                    topic,
                    key=str(index).encode(),
                    value=record_value(index, size),
                    headers=[("demo", b"durable-producer")],
                    on_delivery=delivered,
                )
            except BufferError:
                producer.poll(0.05)
                continue
            index += 1
        stats.sent = index
        producer.poll(tick)
    producer.flush(120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_producer.demo",
        description="Local broker + buffer agent + load with a broker outage; verifies delivery.",
    )
    parser.add_argument("--rate", type=int, default=20_000, help="records/s (default 20000)")
    parser.add_argument("--record-size", type=int, default=200, help="value bytes (default 200)")
    parser.add_argument("--duration", type=float, default=60, help="seconds of load (default 60)")
    parser.add_argument("--outage-at", type=float, default=15, help="outage start, s (default 15)")
    parser.add_argument("--outage", type=float, default=30, help="outage length, s (default 30)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--topic", default="demo-events")
    parser.add_argument("--fsync", default="interval", choices=("always", "interval", "never"))
    parser.add_argument("--keep", action="store_true", help="keep the agent's data directory")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="durable-producer-demo-"))
    print(f"work directory: {work}")
    try:
        return run_demo(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run_demo(args: argparse.Namespace, work: Path) -> int:
    print("starting the local Kafka-compatible broker (tansu) behind a fault proxy ...")
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
            agent.start()
            stats = LoadStats()
            stop = threading.Event()
            load = threading.Thread(
                target=generate_load,
                args=(
                    agent.bootstrap,
                    args.topic,
                    args.rate,
                    args.duration,
                    args.record_size,
                    stats,
                    stop,
                ),
            )
            print(
                f"producing {args.rate} records/s of {args.record_size} B for "
                f"{args.duration:.0f} s; broker outage at {args.outage_at:.0f} s for "
                f"{args.outage:.0f} s"
            )
            started = time.monotonic()
            load.start()
            timeline = watch(agent, broker, stats, load, started, args)
            load.join()
            print("load finished; waiting for the backlog to reach Kafka ...")
            catch_up_deadline = time.monotonic() + 300
            while time.monotonic() < catch_up_deadline:
                forwarded = agent.metrics().get(FORWARDED, 0)
                if forwarded >= stats.acknowledged:
                    break
                time.sleep(0.5)
            if timeline.caught_up_at is None:
                timeline.caught_up_at = time.monotonic()
            exit_code = agent.stop()
            print(f"agent stopped (exit code {exit_code})")
        print("reading the topic back from the broker ...")
        consumed = consume_all(
            broker.direct_address, args.topic, expected=None, timeout=300, idle=3
        )
    return verify_and_report(args, stats, consumed, timeline)


@dataclass
class Timeline:
    backlog_peak_records: int = 0
    backlog_peak_bytes: int = 0
    restored_at: float | None = None
    caught_up_at: float | None = None


def watch(
    agent: AgentProcess,
    broker: ProxiedBroker,
    stats: LoadStats,
    load: threading.Thread,
    started: float,
    args: argparse.Namespace,
) -> Timeline:
    timeline = Timeline()
    outage_started = outage_ended = False
    last_print = 0.0
    while load.is_alive():
        now = time.monotonic() - started
        if not outage_started and now >= args.outage_at:
            broker.proxy.cut()
            outage_started = True
            print(f"[{now:5.1f}s] BROKER OUTAGE: the agent is cut off from Kafka")
        if outage_started and not outage_ended and now >= args.outage_at + args.outage:
            broker.proxy.restore()
            outage_ended = True
            timeline.restored_at = time.monotonic()
            print(f"[{now:5.1f}s] broker reachable again")
        metrics = agent.metrics()
        forwarded = int(metrics.get(FORWARDED, 0))
        backlog = max(0, stats.acknowledged - forwarded)
        timeline.backlog_peak_records = max(timeline.backlog_peak_records, backlog)
        timeline.backlog_peak_bytes = max(
            timeline.backlog_peak_bytes, int(metrics.get(WAL_BYTES, 0))
        )
        if outage_ended and timeline.caught_up_at is None and backlog <= max(args.rate // 2, 1):
            timeline.caught_up_at = time.monotonic()
            print(
                f"[{now:5.1f}s] backlog caught up "
                f"{timeline.caught_up_at - (timeline.restored_at or 0):.1f} s after the outage"
            )
        if now - last_print >= 5:
            last_print = now
            state = "DOWN" if outage_started and not outage_ended else "up"
            print(
                f"[{now:5.1f}s] sent {stats.sent:>9}  acked {stats.acknowledged:>9}  "
                f"forwarded {forwarded:>9}  backlog {backlog:>8} records  broker {state}"
            )
        time.sleep(0.5)
    return timeline


def verify_and_report(
    args: argparse.Namespace, stats: LoadStats, consumed: list, timeline: Timeline
) -> int:
    seen: dict[int, int] = {}
    damaged = 0
    for record in consumed:
        index = int(record.key)
        seen[index] = seen.get(index, 0) + 1
        if record.value != record_value(index, args.record_size):
            damaged += 1
    missing = stats.acked_ids - seen.keys()
    unexpected = seen.keys() - set(range(stats.sent))
    duplicates = sum(count - 1 for count in seen.values())
    catch_up = (
        f"{timeline.caught_up_at - timeline.restored_at:.1f} s"
        if timeline.caught_up_at and timeline.restored_at
        else "n/a"
    )
    print()
    print("summary")
    print(f"  records sent by the application     {stats.sent:>10}")
    print(f"  acknowledged by the agent           {stats.acknowledged:>10}")
    print(f"  delivered to Kafka (distinct)       {len(seen):>10}")
    print(f"  acknowledged but missing in Kafka   {len(missing):>10}")
    print(f"  damaged records                     {damaged:>10}")
    print(f"  duplicates in Kafka                 {duplicates:>10}")
    print(f"  producer errors                     {stats.errors:>10}")
    print(
        f"  backlog peak                        {timeline.backlog_peak_records:>10} records,"
        f" {timeline.backlog_peak_bytes / 1e6:.1f} MB on disk"
    )
    print(f"  catch-up after the outage           {catch_up:>10}")
    ok = not missing and not damaged and not unexpected and stats.errors == 0
    print(
        "\nRESULT: "
        + (
            "OK - every acknowledged record reached Kafka intact"
            if ok
            else "FAILED - see the counts above"
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
