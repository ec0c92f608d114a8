"""The ingest's first step alone: receiving large requests from a socket, this tree beside another.

    .venv/bin/python benchmarks/receive_bench.py --baseline-src CHECKOUT/src
        [--sizes 200000 1000000] [--mib 300] [--rounds 5]

A sender process writes ``--mib`` of size-prefixed frames over loopback TCP as fast as it
can; the receiving process runs one ``FrameReceiver`` (the agent's code, with the agent's
allocator settings) and takes every frame. Printed: the receiver's CPU microseconds per MB,
for this tree and for ``--baseline-src`` (e.g. a ``git worktree`` of an older commit),
alternating in every round, with the median ratio. No broker, no WAL: what the receive path
costs, which the whole-agent benchmark (``ingest_bench.py``) cannot separate from the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path


def send_frames(port: int, size: int, count: int) -> None:
    frame = struct.pack(">i", size) + os.urandom(size)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(count):
            sock.sendall(frame)
        sock.recv(1)  # the receiver's "done"


async def receive(size: int, count: int) -> float:
    """CPU seconds this process spent receiving ``count`` frames of ``size`` bytes."""
    from durable_producer.buffer_agent.ingest.frame_receiver import FrameReceiver
    from durable_producer.buffer_agent.process_tuning import keep_freed_memory

    keep_freed_memory()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    tasks: set[asyncio.Task[None]] = set()

    async def consume(receiver: FrameReceiver) -> None:
        started = time.process_time()
        for _ in range(count):
            received = await receiver.next_frame()
            if received is None or len(received) != size:
                done.set_exception(RuntimeError("a frame was lost or cut"))
                return
        done.set_result(time.process_time() - started)
        await receiver.send(b"x")

    def connected(receiver: FrameReceiver) -> None:
        tasks.add(loop.create_task(consume(receiver)))

    server = await loop.create_server(
        lambda: FrameReceiver(size + 1024, on_connection_made=connected), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    sender = multiprocessing.Process(target=send_frames, args=(port, size, count))
    sender.start()
    try:
        return await asyncio.wait_for(done, 300)
    finally:
        await asyncio.to_thread(sender.join)
        server.close()


def measure(source: Path | None, size: int, mib: int) -> float:
    """Receiver CPU microseconds per MB, in a fresh process running ``source`` (None: this tree)."""
    env = dict(os.environ)
    if source is not None:  # ahead of the editable install's path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    count = max(1, mib * 1_000_000 // size)
    result = subprocess.run(
        [sys.executable, __file__, "--receive", str(size), str(count)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)["cpu_s"] * 1e6 / (size * count / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-src", type=Path, required=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--mib", type=int, default=300, help="MB received per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--receive", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receive:
        size, count = args.receive
        print(json.dumps({"cpu_s": asyncio.run(receive(size, count))}))
        return
    sources: dict[str, Path | None] = {"this tree": None}
    if args.baseline_src is not None:
        sources = {"base": args.baseline_src, "this tree": None}
    rows = []
    for size in args.sizes:
        figures: dict[str, list[float]] = {name: [] for name in sources}
        for round_number in range(1, args.rounds + 1):
            for name, source in sources.items():
                figures[name].append(measure(source, size, args.mib))
                print(
                    f"{size:>9} B round {round_number} {name:>9}:"
                    f" {figures[name][-1]:7.1f} CPU-us/MB",
                    file=sys.stderr,
                )
        rows.append((size, {name: statistics.median(values) for name, values in figures.items()}))
    ratio = "; ratio = this tree / base" if args.baseline_src is not None else ""
    print(f"\nreceiver CPU-us per MB (median of rounds){ratio}")
    for size, medians in rows:
        line = f"  frames of {size:>9} B: " + "  ".join(f"{n} {v:7.1f}" for n, v in medians.items())
        if "base" in medians:
            line += f"  ratio {medians['this tree'] / medians['base']:.2f}"
        print(line)


if __name__ == "__main__":
    main()
