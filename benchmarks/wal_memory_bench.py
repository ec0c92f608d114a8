"""What a WAL of one-record frames costs in memory and CPU: a ``linger.ms=0`` client's batches
piling up while Kafka is away, then the agent restarted over them.

    .venv/bin/python benchmarks/wal_memory_bench.py [--frames 2000000] [--reps 3]
        [--baseline-src /tmp/wal-baseline/src] [--dir DIR] [--idempotent]

Each side runs in a ``python`` of its own (``--baseline-src``: another checkout's ``src``
first on the path), the two alternating in every repetition, on a new log in ``--dir``
(default: the system's temp directory) with fsync ``never`` (the disk's sync is not what is
measured). One side's run:

- appends ``--frames`` frames of one record (a 200 B value, a key, as ``forward_bench``
  builds them) one by one: CPU microseconds an append (this thread), and how much the
  process's anonymous memory grew (``RssAnon``) per frame; then closes the log;
- in a new process, opens the log again over all of them (a restart while Kafka is still
  away): seconds, the peak resident memory the open reached above the process before it
  (``VmHWM``) and the anonymous memory kept once open; the seconds the ingest's restore of the
  clients' sequences takes over them without a snapshot (``ProducerState.restore``: after
  ``durable-agent drain`` or a lost snapshot; ``--idempotent`` writes an idempotent
  producer's batches, whose sequences it restores); then moves the checkpoint over them in
  100 steps (Kafka back): CPU microseconds a frame.

Prints each repetition, then the medians side by side with their ratio (this / baseline).
Not a test: figures only (a shared machine's CPU figures move by a third between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durable_producer.buffer_agent.wal import WalConfig

ROOT = Path(__file__).resolve().parent.parent
FIGURES = (
    ("append_us", "CPU us an append"),
    ("append_bytes", "memory kept a frame appended (B)"),
    ("checkpoint_us", "CPU us a frame checkpointed"),
    ("open_s", "open, seconds"),
    ("open_peak_mib", "open, peak RSS above before (MiB)"),
    ("open_kept_mib", "open, memory kept (MiB)"),
    ("replay_s", "sequences replayed, seconds"),
)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1])


def _config() -> WalConfig:
    from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig

    return WalConfig(max_bytes=64 * 1024**3, fsync=FsyncPolicy.NEVER)


def appending(frames: int, directory: Path, idempotent: bool) -> dict[str, float]:
    """In the side's first process: the appends, then the log closed as a stopped agent's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    from forward_bench import make_batches

    from durable_producer.buffer_agent.wal import WriteAheadLog
    from support.batch_builder import build_batch

    records = make_batches(1, 1)[0][1]
    if idempotent:  # one producer, its sequences cycling through 1,000 batches
        payloads = [
            build_batch(records, producer_id=7, producer_epoch=0, base_sequence=n)
            for n in range(1000)
        ]
    else:
        payloads = [build_batch(records)]
    wal = WriteAheadLog.open(directory, _config())
    wal.append("t", 0, payloads[-1], 1)  # the first segment, before the memory is read
    anonymous = _status_kib("RssAnon")
    started = time.thread_time()
    for index in range(frames - 1):
        wal.append("t", 0, payloads[index % len(payloads)], 1)
    elapsed = time.thread_time() - started
    grown = (_status_kib("RssAnon") - anonymous) * 1024
    wal.close()
    return {"append_us": elapsed / frames * 1e6, "append_bytes": grown / frames}


def opening(frames: int, directory: Path) -> dict[str, float]:
    """In the side's second process: the log opened over the frames, the clients' sequences
    replayed from it as the ingest does without a snapshot, then the log checkpointed."""
    from durable_producer.buffer_agent.ingest.producer_state import ProducerState
    from durable_producer.buffer_agent.wal import WriteAheadLog

    peak, anonymous = _status_kib("VmHWM"), _status_kib("RssAnon")
    started = time.perf_counter()
    wal = WriteAheadLog.open(directory, _config())
    figures = {
        "open_s": time.perf_counter() - started,
        "open_peak_mib": max(0, _status_kib("VmHWM") - peak) / 1024,
        "open_kept_mib": (_status_kib("RssAnon") - anonymous) / 1024,
    }
    if wal.stats().backlog_records != frames:
        raise SystemExit(f"opened with {wal.stats().backlog_records} records, not {frames}")
    with tempfile.TemporaryDirectory() as state_dir:  # no snapshot: every frame replayed
        state = ProducerState(wal, Path(state_dir))
        started = time.perf_counter()
        state.restore()
        figures["replay_s"] = time.perf_counter() - started
    started = time.thread_time()
    for step in range(1, 101):
        wal.checkpoint(frames * step // 100)
    figures["checkpoint_us"] = (time.thread_time() - started) / frames * 1e6
    wal.close()
    return figures


def in_child(source: Path, frames: int, parent: Path | None, idempotent: bool) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="wal-memory-", dir=parent))
    environment = dict(os.environ, PYTHONPATH=str(source))
    figures: dict[str, float] = {}
    try:
        for phase in ("append", "open"):
            command = [sys.executable, __file__, "--frames", str(frames)]
            command += ["--side", phase, "--side-dir", str(directory)]
            command += ["--idempotent"] if idempotent else []
            done = subprocess.run(
                command, capture_output=True, text=True, env=environment, timeout=1800
            )
            if done.returncode != 0:
                raise SystemExit(f"the run from {source} failed: {done.stderr.strip()[-500:]}")
            figures.update(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=2_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path)
    parser.add_argument("--dir", type=Path, help="where the logs go (default: temp directory)")
    parser.add_argument("--side", choices=("append", "open"), help="internal: one phase, JSON")
    parser.add_argument("--side-dir", type=Path, help="internal: the phase's log")
    parser.add_argument(
        "--idempotent",
        action="store_true",
        help="batches of an idempotent producer (a Java client's default), whose sequences "
        "the replay restores; without it, batches without sequences",
    )
    args = parser.parse_args()
    if args.side is not None:
        if args.side == "append":
            print(json.dumps(appending(args.frames, args.side_dir, args.idempotent)))
        else:
            print(json.dumps(opening(args.frames, args.side_dir)))
        return
    if args.baseline_src is not None and not (args.baseline_src / "durable_producer").is_dir():
        raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
    sides = {"this checkout": ROOT / "src"}
    if args.baseline_src is not None:
        sides["baseline"] = args.baseline_src
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for rep in range(args.reps):
        order = list(sides.items()) if rep % 2 == 0 else list(reversed(sides.items()))
        for name, source in order:
            runs[name].append(in_child(source, args.frames, args.dir, args.idempotent))
            shown = ", ".join(f"{key} {value:.2f}" for key, value in runs[name][-1].items())
            print(f"rep {rep + 1} {name}: {shown}", flush=True)
    kind = "an idempotent producer's" if args.idempotent else "no producer id"
    print(f"\n{args.frames:,} one-record frames (200 B values, {kind}), fsync never,", end=" ")
    print(f"medians of {args.reps}")
    header = f"{'figure':<38}" + "".join(f"{name:>16}" for name in sides)
    print(header + ("    this/baseline" if len(sides) == 2 else ""))
    for key, label in FIGURES:
        medians = [statistics.median(run[key] for run in runs[name]) for name in sides]
        line = f"{label:<38}" + "".join(f"{value:>16.2f}" for value in medians)
        if len(medians) == 2:
            line += f"    {medians[0] / medians[1]:.2f}x" if medians[1] else "    -"
        print(line)


if __name__ == "__main__":
    main()
