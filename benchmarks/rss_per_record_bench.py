"""Does the agent's memory grow with records stored? RSS after phases of records, at rest.

Not a test: prints figures. A real agent process in front of one real Kafka node (KRaft);
``--phases`` phases of ``--records`` 200 B records each from confluent-kafka (idempotent,
``linger.ms`` 5, 4 partitions), the producer idle between phases. After each phase: wait for
the forwarder to catch up (``durable_agent_forwarded_records_total`` >=
``durable_agent_ingest_records_total``), wait ``--settle`` seconds (the checkpoint, segment
deletion and periodic producer-state snapshot run), then read the agent's ``/proc/PID/status``
(VmRSS, RssAnon, RssFile), ask the agent for ``malloc_trim(0)`` and read it again.

The agent is started through this file's ``--launch-agent`` mode: the agent's own CLI ``main``,
with a SIGUSR1 handler added (only here, not in the product) that calls glibc's
``malloc_trim(0)`` and writes a report to ``--dump``: live objects by type (``gc``), and with
``--tracemalloc`` the top allocation sites and their growth since the previous report; then
glibc's ``mallinfo2`` (heap bytes in use and free, all arenas) and the largest mappings.

``--producers reuse``: one producer (one producer id) for every phase; ``new``: a new
producer per phase (a new producer id each time, as Spark makes one per task).

    .venv/bin/python benchmarks/rss_per_record_bench.py                 # 10 x 200,000 records
    .venv/bin/python benchmarks/rss_per_record_bench.py --producers new
    .venv/bin/python benchmarks/rss_per_record_bench.py --phases 4 --tracemalloc
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPIC = "rss"
PARTITIONS = 4
VALUE_BYTES = 200
STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile")


def launch_agent(argv: list[str]) -> int:
    """The agent's CLI ``main`` with a SIGUSR1 handler: trim the heap, write a report."""
    dump = Path(argv.pop(0))
    tracing = argv and argv[0] == "--tracemalloc"
    if tracing:
        argv.pop(0)
        import tracemalloc

        tracemalloc.start(8)
    previous: list[Any] = []

    def report(signum: int, frame: object) -> None:
        lines = [f"--- report at {time.strftime('%H:%M:%S')}"]
        counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
        lines += [f"{n:>10} {name}" for name, n in counts.most_common(25)]
        if tracing:
            import tracemalloc

            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            lines.append(f"traced: {sum(s.size for s in snapshot.statistics('filename'))} B")
            stats = (
                snapshot.compare_to(previous[0], "traceback")
                if previous
                else snapshot.statistics("traceback")
            )
            for stat in stats[:12]:
                lines.append(str(stat))
                lines += [f"      {line}" for line in stat.traceback.format()[-8:]]
            previous[:] = [snapshot]
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
        lines.append(mallinfo_line(libc))
        lines += mappings_lines()
        with dump.open("a") as file:
            file.write("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, report)
    from durable_producer.buffer_agent.cli import main

    return main(argv)


_MALLINFO2_FIELDS = (
    *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
    *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def mallinfo_line(libc: ctypes.CDLL) -> str:
    """glibc's accounting (all arenas): heap bytes in use, free in the heap, mmapped blocks."""
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return (
        f"mallinfo: heap {info.arena >> 10} KiB, in use {info.uordblks >> 10} KiB,"
        f" free {info.fordblks >> 10} KiB in {info.ordblks} chunks, mmapped {info.hblkhd >> 10} KiB"
    )


def mappings_lines(top: int = 8) -> list[str]:
    """The process's largest mappings by resident size (after the trim)."""
    mappings: list[tuple[int, str]] = []
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = f"{(end - start) >> 10:>9} KiB {fields[5] if len(fields) > 5 else '[anon]'}"
        elif fields[0] == "Rss:":
            mappings.append((int(fields[1]), name))
    mappings.sort(reverse=True)
    return [f"rss {rss:>8} KiB of {what}" for rss, what in mappings[:top]]


def last_mallinfo(dump: Path) -> str:
    lines = [line for line in dump.read_text().splitlines() if line.startswith("mallinfo:")]
    return lines[-1] if lines else ""


def status_kib(pid: int) -> dict[str, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {key: int(fields[key].split()[0]) for key in STATUS_FIELDS}


def run(args: argparse.Namespace) -> None:
    from confluent_kafka import Producer

    from durable_producer.local.agent_process import AgentProcess
    from durable_producer.local.broker import KafkaBroker
    from durable_producer.local.topics import create_topic

    work = Path(tempfile.mkdtemp(prefix="rss-bench-"))
    dump = work / "reports.txt"

    class LaunchedAgent(AgentProcess):
        def command(self) -> list[str]:
            agent = super().command()
            extra = ["--tracemalloc"] if args.tracemalloc else []
            return [sys.executable, __file__, "--launch-agent", str(dump), *extra, *agent[3:]]

    def producer() -> Any:
        return Producer(
            {
                "bootstrap.servers": agent.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "log_level": 2,
            }
        )

    def produce(client: Any, phase: int) -> float:
        failures: list[object] = []

        def report(error: object, message: object) -> None:
            if error is not None:
                failures.append(error)

        started = time.monotonic()
        for index in range(args.records):
            value = (b"%d-%09d-" % (phase, index)).ljust(VALUE_BYTES, b"x")
            while True:
                try:
                    client.produce(TOPIC, value, partition=index % PARTITIONS, on_delivery=report)
                    break
                except BufferError:
                    client.poll(0.01)
            if index % 1000 == 0:
                client.poll(0)
        assert client.flush(300) == 0
        assert not failures, failures[:3]
        return args.records / (time.monotonic() - started)

    def caught_up() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            metrics = agent.metrics()
            forwarded = metrics["durable_agent_forwarded_records_total"]
            if forwarded >= metrics["durable_agent_ingest_records_total"]:
                return
            time.sleep(0.2)
        raise SystemExit("the forwarder did not catch up in 300 s")

    def trimmed(pid: int) -> dict[str, int]:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2 if not args.tracemalloc else 10)
        return status_kib(pid)

    with KafkaBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        agent = LaunchedAgent(work / "volume", broker.bootstrap, log_path=work / "agent.log")
        with agent:
            assert agent.process is not None
            pid = agent.process.pid
            time.sleep(args.settle)
            start = trimmed(pid)
            print(f"agent pid {pid}, work {work}; at start {start} KiB (after trim)")
            print(f"at start {last_mallinfo(dump)}")
            print(
                f"{'records':>10} {'rec/s':>8} {'VmRSS':>8} {'RssAnon':>8} {'RssFile':>8}"
                f" {'trimmed':>8} {'anon':>8}   (KiB)"
            )
            kept = producer() if args.producers == "reuse" else None
            rows = []
            for phase in range(args.phases):
                client = kept or producer()
                rate = produce(client, phase)
                if kept is None:
                    del client  # a new producer next phase: this one's id is never seen again
                caught_up()
                time.sleep(args.settle)
                before = status_kib(pid)
                after = trimmed(pid)
                records = (phase + 1) * args.records
                rows.append((records, after["RssAnon"]))
                print(
                    f"{records:>10,} {rate:>8,.0f} {before['VmRSS']:>8} {before['RssAnon']:>8}"
                    f" {before['RssFile']:>8} {after['VmRSS']:>8} {after['RssAnon']:>8}"
                    f"   {last_mallinfo(dump)}",
                    flush=True,
                )
            if len(rows) >= 3:
                half = rows[len(rows) // 2 :]
                (r0, a0), (r1, a1) = half[0], half[-1]
                whole = (rows[-1][1] - rows[0][1]) * 1024 / (rows[-1][0] - rows[0][0])
                late = (a1 - a0) * 1024 / (r1 - r0) if r1 > r0 else 0.0
                print(
                    f"RssAnon after trim: {whole:.1f} B/record from the first phase to the last,"
                    f" {late:.1f} B/record over the second half"
                    f" ({whole * 1e6 / 2**20:.1f} / {late * 1e6 / 2**20:.1f} MiB per million)"
                )
            print(f"reports (objects by type{', tracemalloc' if args.tracemalloc else ''}): {dump}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--launch-agent":
        sys.exit(launch_agent(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=10)
    parser.add_argument("--records", type=int, default=200_000, help="records per phase")
    parser.add_argument("--producers", choices=("reuse", "new"), default="reuse")
    parser.add_argument("--settle", type=float, default=12.0, help="seconds at rest per phase")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the agent's heap")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
