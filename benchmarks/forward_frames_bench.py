"""The forwarder's own work per stored batch, without a broker: CPU microseconds a frame.

What a ``linger.ms=0`` client costs the forwarder is Python work per frame (one record a
frame): reading it from the WAL, numbering it in its partition's queue, tracking it, merging
and stamping it into a batch, settling its acknowledgement. ``forward_bench.py`` measures
that against a broker, where the network, the broker and the machine's noise move the
figures by half between rounds. This drives the same code without a network: a preloaded WAL
of one-record frames (``--partitions``, 4 by default, round robin) is read up to the
forwarder's read-ahead budget (``Forwarder._read``, as in a catch-up), every partition's
batches are taken, stamped and acknowledged as a broker's success would settle them
(``PartitionQueue.next_batch``, ``succeeded``, ``Forwarder._acked``), until every record is
settled. The forwarding thread's CPU time per frame, best of ``--reps`` (the least disturbed
run), garbage collections included; the process is tuned first as the agent's is once
serving (``prepare_to_serve``: freed memory kept for reuse, the heap frozen).

It calls the forwarder's private methods: a change of them may need a change here.
``--baseline-src DIR`` runs the same in a child ``python`` with another checkout's ``src``
first on the path, alternating with this checkout's, and prints the ratio.

    .venv/bin/python benchmarks/forward_frames_bench.py [--frames 200000] [--reps 5]
        [--partitions 4] [--records-per-frame 1] [--only-read]
        [--baseline-src /tmp/fwd-baseline/src]

More partitions make each partition's share of a read shorter (fewer frames a merge, more
queues a pass): ``--partitions 1, 4, 64, 1000`` shows how the cost a frame depends on it.
``--only-read`` times the reads alone (``WalReader.poll`` of the forwarder's
``read_batch_frames``, nothing numbered): the WAL's share of the work a frame.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from forward_bench import PARTITIONS, make_batches  # noqa: E402

from durable_producer.buffer_agent.forward.config import ForwarderConfig  # noqa: E402
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore  # noqa: E402
from durable_producer.buffer_agent.forward.forwarder import Forwarder  # noqa: E402
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog  # noqa: E402
from support.batch_builder import build_batch  # noqa: E402

PRODUCER_ID = 7
MAX_MERGE_BYTES = 1 << 20


def one_run(payloads: list[tuple[int, bytes, int]], directory: Path, only_read: bool) -> float:
    """CPU seconds of this thread to forward ``payloads`` (partition, batch, records), or
    ``only_read`` them from the WAL as the forwarder's reads do."""
    wal = WriteAheadLog.open(
        directory / "wal", WalConfig(max_bytes=4 * 1024**3, fsync=FsyncPolicy.NEVER)
    )
    reader = None
    try:
        for partition, payload, count in payloads:
            wal.append("t", partition, payload, count)
        forwarder = Forwarder(
            wal,
            {"bootstrap.servers": "unused:9092"},
            dead_letters=DeadLetterStore(directory / "dead-letter"),
            state_dir=directory / "state",
            config=ForwarderConfig(),
        )
        forwarder._producer_id = PRODUCER_ID  # as after InitProducerId
        # No sender runs here: a new partition's queue asks it for the topic's id (a
        # baseline before e6ebd7d's successor read the id through the sender's client).
        forwarder._sender = SimpleNamespace(  # type: ignore[assignment]
            topic_id=lambda topic: "", client=SimpleNamespace(topic_ids={})
        )
        total = sum(count for _, _, count in payloads)
        reader = wal.reader(0)
        loop = asyncio.new_event_loop()
        gc.collect()
        gc.freeze()
        started = time.thread_time()
        while only_read and reader.poll(ForwarderConfig().read_batch_frames):
            pass
        while not only_read and forwarder._counts.forwarded_records < total:
            while loop.run_until_complete(forwarder._read(reader)):
                pass  # up to the read-ahead budget
            for queue in forwarder._queues.values():
                queue.confirmed = True  # as after the partition's first success
                if queue.producer_id < 0:
                    queue.producer_id = PRODUCER_ID
                while (batch := queue.next_batch(0.0, MAX_MERGE_BYTES)) is not None:
                    forwarder._acked(queue, queue.succeeded(batch))
        elapsed = time.thread_time() - started
        gc.unfreeze()
        loop.close()
        return elapsed
    finally:
        if reader is not None:
            reader.close()
        wal.close()


def measure(
    frames: int, reps: int, partitions: int, only_read: bool, per_frame: int = 1
) -> list[float]:
    """Microseconds of CPU a frame (of ``per_frame`` records), one figure a repetition."""
    from durable_producer.buffer_agent.process_tuning import prepare_to_serve

    prepare_to_serve()  # as the agent does once it serves
    payloads = [
        (partition, build_batch(records), len(records))
        for partition, records in make_batches(frames * per_frame, per_frame, partitions)
    ]
    figures = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as scratch:
            figures.append(one_run(payloads, Path(scratch), only_read) / frames * 1e6)
    return figures


def in_child(source: Path, frames: int, partitions: int, only_read: bool, per_frame: int) -> float:
    command = [sys.executable, __file__, "--frames", str(frames), "--reps", "1", "--side"]
    command += ["--partitions", str(partitions), "--records-per-frame", str(per_frame)]
    command += ["--only-read"] if only_read else []
    environment = dict(os.environ, PYTHONPATH=str(source))
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"baseline run failed: {done.stderr.strip()[-500:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["us_per_frame"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument(
        "--records-per-frame",
        type=int,
        default=1,
        help="records a stored batch (1: a linger.ms=0 client's; 100: a batching client's)",
    )
    parser.add_argument(
        "--only-read", action="store_true", help="time the WAL reads alone (reader.poll)"
    )
    parser.add_argument("--baseline-src", type=Path)
    parser.add_argument("--side", action="store_true", help="internal: one run, JSON out")
    args = parser.parse_args()
    if args.partitions < 1:
        raise SystemExit(f"--partitions {args.partitions}: give 1 or more")
    if args.records_per_frame < 1:
        raise SystemExit(f"--records-per-frame {args.records_per_frame}: give 1 or more")
    per_frame = args.records_per_frame
    if args.side:
        figure = measure(args.frames, 1, args.partitions, args.only_read, per_frame)[0]
        print(json.dumps({"us_per_frame": figure}))
        return
    if args.baseline_src is not None and not (args.baseline_src / "durable_producer").is_dir():
        raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
    this_src = ROOT / "src"
    ours: list[float] = []
    theirs: list[float] = []
    for rep in range(args.reps):
        ours.append(in_child(this_src, args.frames, args.partitions, args.only_read, per_frame))
        if args.baseline_src is not None:
            theirs.append(
                in_child(args.baseline_src, args.frames, args.partitions, args.only_read, per_frame)
            )
        line = f"rep {rep + 1}: this checkout {ours[-1]:.2f} us a frame"
        print(line + (f", baseline {theirs[-1]:.2f}" if theirs else ""), flush=True)
    print(
        f"frames              {args.frames:,} frames of {per_frame} records (200 B values),"
        f" {args.partitions} partitions" + (", the reads alone" if args.only_read else "")
    )
    print(
        f"this checkout       best {min(ours):.2f} us a frame, median {median(ours):.2f}"
        f" (all: {_row(ours)})"
    )
    if theirs:
        print(
            f"baseline            best {min(theirs):.2f} us a frame, median {median(theirs):.2f}"
            f" (all: {_row(theirs)})"
        )
        print(
            f"this / baseline     {min(ours) / min(theirs):.2f}x CPU a frame (best of each),"
            f" {median(ours) / median(theirs):.2f}x (medians)"
        )


def _row(figures: list[float]) -> str:
    return " ".join(f"{figure:.2f}" for figure in figures)


if __name__ == "__main__":
    main()
