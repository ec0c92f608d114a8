"""Lettering a deleted topic's backlog: one append a letter vs one pass.

Not a test: prints figures. A pass of the forwarder letters every frame of a partition Kafka
no longer has (``Forwarder._letter_for_heads``). Each letter was appended, fsynced and logged
on its own, as before 2026-12-05's second session (here: ``add_batches`` of one letter each);
a pass now appends them together (``add_batches``: one
write and one fsync for each ``LETTERS_WRITE_BYTES``). Both sides on the same filesystem
(``--dir``, the volume's in production: fsync costs depend on it), alternating, ``--reps``
times; wall seconds a pass (the forwarding loop waits them out) and the ratio of the medians.

    .venv/bin/python benchmarks/dead_letter_bench.py [--letters 20000] [--batch-bytes 300]
        [--reps 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from statistics import median

from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, RefusedBatch


def refused(letters: int, batch_bytes: int) -> list[RefusedBatch]:
    reason = "partition orders/7 does not exist (for 60 s)"
    payload = b"b" * batch_bytes
    return [
        RefusedBatch(offset, "orders", 7, payload, reason, "UNKNOWN_TOPIC_OR_PARTITION")
        for offset in range(letters)
    ]


def one_a_letter(store: DeadLetterStore, batches: list[RefusedBatch]) -> None:
    for batch in batches:  # one append and one fsync a letter
        _, error = store.add_batches([batch])
        if error is not None:
            raise SystemExit(f"letter {batch.wal_offset}: {error}")


def one_pass(store: DeadLetterStore, batches: list[RefusedBatch]) -> None:
    stored, error = store.add_batches(batches)
    if error is not None or stored != len(batches):
        raise SystemExit(f"stored {stored} of {len(batches)}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--letters", type=int, default=20_000)
    parser.add_argument("--batch-bytes", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if args.letters < 1 or args.reps < 1:
        raise SystemExit("--letters and --reps: give 1 or more")
    if not args.dir.is_dir():
        raise SystemExit(f"--dir {args.dir}: not a directory")
    batches = refused(args.letters, args.batch_bytes)
    sides = {"one append a letter": one_a_letter, "one pass": one_pass}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(args.reps):
        for name, letter in sides.items():
            with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
                store = DeadLetterStore(Path(scratch))
                started = time.perf_counter()
                letter(store, batches)
                seconds[name].append(time.perf_counter() - started)
        print(f"rep {rep + 1}: " + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in seconds.items()))
    print(f"letters             {args.letters:,} of {args.batch_bytes} B batches in {args.dir}")
    for name, figures in seconds.items():
        print(f"{name:<20}median {median(figures):.3f} s a pass")
    ratio = median(seconds["one pass"]) / median(seconds["one append a letter"])
    print(f"one pass / one a letter  {ratio:.3f}x")


if __name__ == "__main__":
    main()
