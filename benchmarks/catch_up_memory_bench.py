"""The agent's memory while its forwarder catches up a backlog of ~1 MiB client batches (issue 28).

Not a test: prints figures. A real agent process (``durable-agent run``, fsync ``interval``)
sits in front of one Apache Kafka node (KRaft) behind the fault proxy. The topic allows
2 MiB batches (``max.message.bytes``; Kafka's default of 1,048,588 leaves no room beside a
full 1 MiB batch), the agent keeps its default ingest limit (``--max-batch-bytes``
1,048,588), and the client is confluent-kafka with ``batch.size`` 1 MiB, ``linger.ms`` 50,
``acks=all`` and idempotence, producing 1,000-byte values in runs of a batch's worth per
partition, so that each stored frame is a full ~1 MiB batch.

**Catch-up.** The client asks the agent for the topic's metadata (the agent learns the
partition count and size limit from Kafka and caches them on its volume), then the proxy is
cut and ``--frames`` MiB of records go through the agent into its WAL. Then Kafka becomes
reachable again and the forwarder sends the whole backlog. Caught up: the topic's end offsets
(read from the broker directly, not through the proxy) add up to the records sent.

**Restore at start** (unless ``--skip-restore``): the same ingest into a fresh volume and
topic, then the agent is killed (SIGKILL) with the backlog on disk, Kafka becomes reachable,
and the agent is started again: it recovers the WAL and forwards everything.

The agent's VmRSS (``/proc/PID/status``) is sampled every 0.1 s throughout; at each phase
boundary the kernel's peak (VmHWM) is reset (``/proc/PID/clear_refs``) so that the printed
kernel peak belongs to that phase and catches spikes between samples.

    .venv/bin/python benchmarks/catch_up_memory_bench.py              # ~600 MiB, about a minute
    .venv/bin/python benchmarks/catch_up_memory_bench.py --frames 100 --skip-restore
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from durable_producer.buffer_agent.wal import FsyncPolicy
from durable_producer.buffer_agent.wal.recovery.inspect import inspect_wal
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import ProxiedBroker
from durable_producer.local.topics import create_topic

MIB = 1024 * 1024
SAMPLE_S = 0.1
VALUE_BYTES = 1000
RECORDS_PER_BATCH = 1036
"""Records of 1,000 B (plus ~10 B of record framing each) that fill librdkafka's 1 MiB batch."""
TOPIC_MAX_MESSAGE_BYTES = 2 * MIB
FSYNC_INTERVAL_MS = 100
GOAL_MIB = 128
RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def status_kib(pid: int, *keys: str) -> tuple[int, ...] | None:
    """The named fields of /proc/PID/status, in KiB (None once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        return tuple(int(fields[key].split()[0]) for key in keys)
    except KeyError:
        return None


def reset_peak(pid: int) -> bool:
    """Reset the kernel's VmHWM of ``pid`` to its current RSS (Linux >= 4.0)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class RssSampler:
    """Samples VmRSS of whatever process ``pid()`` names every 0.1 s, tagged with the phase."""

    def __init__(self, pid: Callable[[], int | None]) -> None:
        self._pid = pid
        self.phase = "start"
        # (monotonic, phase, VmRSS, RssAnon, RssFile + RssShmem) in KiB
        self.samples: list[tuple[float, str, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pid = self._pid()
            fields = None if pid is None else status_kib(pid, *RSS_FIELDS)
            if fields is not None:
                rss, anon, file, shmem = fields
                self.samples.append((time.monotonic(), self.phase, rss, anon, file + shmem))
            self._stop.wait(SAMPLE_S)

    def enter(self, phase: str) -> None:
        pid = self._pid()
        if pid is not None:
            reset_peak(pid)
        self.phase = phase

    def _of(self, phase: str) -> list[tuple[int, int, int]]:
        return [(rss, anon, file) for _, name, rss, anon, file in self.samples if name == phase]

    def peak_mb(self, phase: str) -> float:
        values = self._of(phase)
        return max(values)[0] / 1024 if values else float("nan")

    def peak_detail(self, phase: str) -> str:
        """The phase's peak sample: anonymous memory (heap, buffers) and file pages mapped."""
        values = self._of(phase)
        if not values:
            return "no samples"
        _, anon, file = max(values)
        return f"anon {anon / 1024:.1f} + file {file / 1024:.1f}"

    def last_mb(self, phase: str) -> float:
        values = self._of(phase)
        return values[-1][0] / 1024 if values else float("nan")

    def count(self, phase: str) -> int:
        return len(self._of(phase))


def kernel_peak_mb(agent: AgentProcess) -> float:
    assert agent.process is not None
    fields = status_kib(agent.process.pid, "VmHWM")
    return float("nan") if fields is None else fields[0] / 1024


def agent_pid(agent: AgentProcess) -> Callable[[], int | None]:
    def pid() -> int | None:
        process = agent.process
        return None if process is None or process.poll() is not None else process.pid

    return pid


@dataclass
class Ingest:
    records: int
    seconds: float
    errors: int
    frames: int
    wal_bytes: int


def ingest(agent: AgentProcess, topic: str, partitions: int, frames: int) -> Ingest:
    """``frames`` batches' worth of 1,000 B records through the agent, flushed (all acknowledged
    by the agent, i.e. in its WAL)."""
    producer = Producer(
        {
            "bootstrap.servers": agent.bootstrap,
            "batch.size": MIB,
            "message.max.bytes": TOPIC_MAX_MESSAGE_BYTES,
            "linger.ms": 50,
            "acks": "all",
            "enable.idempotence": True,
            "log_level": 3,
        }
    )
    value = os.urandom(VALUE_BYTES)
    delivered = errors = 0

    def report(error: KafkaError | None, _message: Message) -> None:
        nonlocal delivered, errors
        if error is None:
            delivered += 1
        else:
            errors += 1

    total = frames * RECORDS_PER_BATCH
    started = time.monotonic()
    for index in range(total):
        partition = (index // RECORDS_PER_BATCH) % partitions
        while True:
            try:
                producer.produce(topic, value, partition=partition, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        if index % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    seconds = time.monotonic() - started
    report_ = inspect_wal(agent.data_dir / "wal", FsyncPolicy.INTERVAL)
    return Ingest(
        records=delivered,
        seconds=seconds,
        errors=errors + left,
        frames=sum(s.frames for s in report_.segments),
        wal_bytes=sum(s.size_bytes for s in report_.segments),
    )


def learn_topic(agent: AgentProcess, topic: str) -> None:
    """A client's metadata request through the agent while Kafka is reachable: the agent
    caches the topic's partition count and size limit on its volume."""
    producer = Producer({"bootstrap.servers": agent.bootstrap})
    metadata = producer.list_topics(topic, timeout=30)
    found = metadata.topics[topic]
    if found.error is not None or not found.partitions:
        raise RuntimeError(f"agent did not learn {topic}: {found.error}")
    producer.flush(1)


@contextlib.contextmanager
def end_offsets(bootstrap: str, topic: str, partitions: int) -> Iterator[Callable[[], int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "catch-up-memory"})
    try:
        yield lambda: sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def wait_caught_up(
    count: Callable[[], int], expected: int, started: float, give_up_s: float
) -> tuple[float | None, int]:
    """Seconds from ``started`` until the topic holds ``expected`` records (None: gave up)."""
    total = 0
    while time.monotonic() - started < give_up_s:
        total = count()
        if total >= expected:
            return time.monotonic() - started, total
        time.sleep(0.2)
    return None, total


def wait_backlog_empty(agent: AgentProcess, timeout: float = 30.0) -> float | None:
    """Wait until the agent's own backlog gauge (records) reads 0."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            backlog = agent.metrics().get("durable_agent_backlog_records")
            if backlog == 0:
                return backlog
        time.sleep(0.2)
    return None


def agent_args() -> list[str]:
    return ["--fsync", "interval", "--fsync-interval-ms", str(FSYNC_INTERVAL_MS)]


def print_ingest(done: Ingest) -> None:
    mb = done.records * VALUE_BYTES / 1e6
    print(
        f"  ingest: {done.records:,} records ({mb:.0f} MB of values) in {done.seconds:.1f} s,"
        f" {done.errors} errors; WAL {done.frames} frames, {done.wal_bytes / MIB:.1f} MiB"
        f" ({done.wal_bytes / max(1, done.frames) / MIB:.3f} MiB a frame)",
        flush=True,
    )


def print_catch_up(
    name: str, seconds: float | None, wal_bytes: int, total: int, expected: int
) -> None:
    if seconds is None:
        print(f"  {name}: NOT caught up: {total:,} of {expected:,} records in Kafka", flush=True)
        return
    print(
        f"  {name}: {seconds:.1f} s, {wal_bytes / MIB / seconds:.1f} MiB/s"
        f" ({expected / seconds:,.0f} records/s)",
        flush=True,
    )


def print_check(total: int, expected: int) -> bool:
    verdict = "OK" if total == expected else ("DUPLICATES" if total > expected else "LOST")
    print(f"  check: topic end offsets sum {total:,}, records sent {expected:,}: {verdict}")
    return total == expected


def run_catch_up(
    broker: ProxiedBroker, scratch: Path, frames: int, partitions: int, give_up_s: float
) -> dict[str, float]:
    topic = "catch-up-memory"
    create_topic(
        broker.bootstrap,
        topic,
        partitions,
        config={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)},
    )
    agent = AgentProcess(scratch / "catch-up" / "data", broker.bootstrap, extra_args=agent_args())
    print("catch-up:", flush=True)
    with agent, RssSampler(agent_pid(agent)) as rss:  # entering starts the agent
        assert agent.process is not None
        learn_topic(agent, topic)
        rss.enter("baseline")
        time.sleep(3)
        baseline = rss.last_mb("baseline")
        broker.proxy.cut()
        rss.enter("ingest")
        done = ingest(agent, topic, partitions, frames)
        ingest_hwm = kernel_peak_mb(agent)
        print_ingest(done)
        rss.enter("idle")
        time.sleep(3)
        idle = rss.last_mb("idle")
        rss.enter("catch-up")
        started = time.monotonic()
        broker.proxy.restore()
        with end_offsets(broker.direct_address, topic, partitions) as count:
            seconds, total = wait_caught_up(count, done.records, started, give_up_s)
            wait_backlog_empty(agent)
            catch_up_hwm = kernel_peak_mb(agent)
            rss.enter("after")
            time.sleep(2)
            total = count()
        after = rss.last_mb("after")
        print(
            f"  agent RSS (MiB, sampled every {SAMPLE_S} s; kernel peak VmHWM of the phase):\n"
            f"    baseline {baseline:.1f}\n"
            f"    ingest peak {rss.peak_mb('ingest'):.1f} ({rss.peak_detail('ingest')};"
            f" VmHWM {ingest_hwm:.1f})\n"
            f"    idle with backlog {idle:.1f}\n"
            f"    catch-up peak {rss.peak_mb('catch-up'):.1f} ({rss.peak_detail('catch-up')};"
            f" VmHWM {catch_up_hwm:.1f},"
            f" {rss.count('catch-up')} samples)\n"
            f"    after catch-up {after:.1f}",
            flush=True,
        )
        print_catch_up("catch-up", seconds, done.wal_bytes, total, done.records)
        ok = print_check(total, done.records)
        agent.stop()
    return {
        "baseline": baseline,
        "ingest": max(rss.peak_mb("ingest"), ingest_hwm),
        "catch-up": max(rss.peak_mb("catch-up"), catch_up_hwm),
        "ok": float(ok),
    }


def run_restore(
    broker: ProxiedBroker, scratch: Path, frames: int, partitions: int, give_up_s: float
) -> dict[str, float]:
    topic = "restore-memory"
    create_topic(
        broker.bootstrap,
        topic,
        partitions,
        config={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)},
    )
    agent = AgentProcess(scratch / "restore" / "data", broker.bootstrap, extra_args=agent_args())
    print("restore at start:", flush=True)
    with agent, RssSampler(agent_pid(agent)) as rss:  # entering starts the agent
        learn_topic(agent, topic)
        broker.proxy.cut()
        rss.enter("ingest")
        done = ingest(agent, topic, partitions, frames)
        print_ingest(done)
        agent.kill()
        rss.phase = "restore"
        broker.proxy.restore()
        started = time.monotonic()
        agent.start(timeout=120)
        ready_s = time.monotonic() - started
        with end_offsets(broker.direct_address, topic, partitions) as count:
            seconds, total = wait_caught_up(count, done.records, started, give_up_s)
            wait_backlog_empty(agent)
            restore_hwm = kernel_peak_mb(agent)  # the new process's peak since its start
            rss.enter("after")
            time.sleep(2)
            total = count()
        print(
            f"  killed (SIGKILL) with {done.frames} frames on disk; restarted with Kafka"
            f" reachable: ready after {ready_s:.1f} s\n"
            f"  agent RSS (MiB): ingest peak {rss.peak_mb('ingest'):.1f};"
            f" restore + forward peak {rss.peak_mb('restore'):.1f}"
            f" ({rss.peak_detail('restore')}; VmHWM {restore_hwm:.1f},"
            f" {rss.count('restore')} samples);"
            f" after {rss.last_mb('after'):.1f}",
            flush=True,
        )
        print_catch_up(
            "restore + catch-up (from the start)", seconds, done.wal_bytes, total, done.records
        )
        ok = print_check(total, done.records)
        agent.stop()
    return {"restore": max(rss.peak_mb("restore"), restore_hwm), "ok": float(ok)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=600, help="client batches of ~1 MiB")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--give-up", type=float, default=600.0, help="seconds to catch up")
    parser.add_argument("--skip-restore", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="scratch (volumes), default /tmp")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as scratch,
        ProxiedBroker() as broker,
    ):
        print(
            f"Kafka: one KRaft node behind the fault proxy, {broker.bootstrap}; {args.frames}"
            f" frames x {RECORDS_PER_BATCH} records x {VALUE_BYTES} B, {args.partitions}"
            f" partitions; agent fsync interval {FSYNC_INTERVAL_MS} ms",
            flush=True,
        )
        result = run_catch_up(broker, Path(scratch), args.frames, args.partitions, args.give_up)
        restore = (
            None
            if args.skip_restore
            else run_restore(broker, Path(scratch), args.frames, args.partitions, args.give_up)
        )
    peaks = [result["ingest"], result["catch-up"]] + ([restore["restore"]] if restore else [])
    print(
        f"\nsummary (MiB): baseline {result['baseline']:.1f}; peak ingest {result['ingest']:.1f},"
        f" catch-up {result['catch-up']:.1f}"
        + (f", restore at start {restore['restore']:.1f}" if restore else "")
        + f"; goal < {GOAL_MIB} MiB: {'met' if max(peaks) < GOAL_MIB else 'NOT met'};"
        + f" records checked: {'all' if result['ok'] and (not restore or restore['ok']) else 'NO'}"
    )


if __name__ == "__main__":
    main()
