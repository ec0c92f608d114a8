"""WAL append throughput beside raw sequential writes on the same disk, as ratios.

    .venv/bin/python benchmarks/wal_bench.py [--dir DIR] [--mib 128]

For 16 KiB and 1 MiB frames it measures WriteAheadLog appends under each fsync policy and
``dd`` writing the same bytes: ``conv=fdatasync`` (one sync at the end: the ceiling for
``interval``/``never``) and ``oflag=dsync`` (every write synced: the baseline for ``always``).
``always`` runs with 8 concurrent writers, so group commit is what is measured.

A second table writes ``--sustained-mib`` (default 3200) of 1 MiB frames under ``interval``
with the page-cache window off (the kernel keeps every written page) and at its 64 MiB
default (synced pages further behind are dropped), reporting MB/s and this process's CPU
seconds per GiB written: what keeping the page cache small saves once fresh memory is dear.
Figures are from one run on one machine; only the ratios mean much on a shared machine.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog

MIB = 1024 * 1024


def dd_seconds(path: Path, block: int, count: int, flag: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}", flag],
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def wal_seconds(
    directory: Path, frame: int, count: int, policy: FsyncPolicy, writers: int
) -> float:
    config = WalConfig(
        segment_bytes=64 * MIB,
        max_bytes=64 * 1024 * MIB,
        max_frame_bytes=2 * MIB,
        fsync=policy,
        fsync_interval_ms=100,
    )
    payload = bytes(frame)
    wal = WriteAheadLog.open(directory, config)
    per_writer = count // writers

    def write() -> None:
        for _ in range(per_writer):
            wal.append("bench", 0, payload)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wal.close()  # includes the final fsync, as dd's conv=fdatasync does
    elapsed = time.perf_counter() - started
    shutil.rmtree(directory)
    return elapsed


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sustained(directory: Path, mib: int, window: int | None) -> tuple[float, float]:
    """(MB/s, CPU seconds per GiB) appending ``mib`` MiB of 1 MiB frames under ``interval``."""
    config = WalConfig(
        segment_bytes=256 * MIB,
        max_bytes=(mib + 512) * MIB,
        max_frame_bytes=2 * MIB,
        fsync=FsyncPolicy.INTERVAL,
        page_cache_window_bytes=window,
    )
    payload = bytes(MIB)
    wal = WriteAheadLog.open(directory, config)
    cpu_before, started = cpu_seconds(), time.perf_counter()
    for _ in range(mib):
        wal.append("bench", 0, payload)
    wal.close()
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    shutil.rmtree(directory)
    return mib / elapsed * MIB / 1e6, cpu / (mib / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="directory on the disk to test (default: a temp dir)")
    parser.add_argument("--mib", type=int, default=128, help="MiB written per measurement")
    parser.add_argument(
        "--dsync-mib", type=int, default=16, help="MiB for the slow per-write-sync runs"
    )
    parser.add_argument(
        "--sustained-mib", type=int, default=3200, help="MiB for the page-cache window runs"
    )
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="wal-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"disk under test: {base}")
    rows = []
    for frame in (16 * 1024, MIB):
        label = "16 KiB" if frame < MIB else "1 MiB"
        count = args.mib * MIB // frame
        sync_count = max(8, args.dsync_mib * MIB // frame)
        sync_count -= sync_count % 8
        raw = dd_seconds(base / "dd.raw", frame, count, "conv=fdatasync")
        raw_dsync = dd_seconds(base / "dd.dsync", frame, sync_count, "oflag=dsync")
        for policy, writers, n, reference, ref_name in (
            (FsyncPolicy.NEVER, 1, count, raw, "dd conv=fdatasync"),
            (FsyncPolicy.INTERVAL, 1, count, raw, "dd conv=fdatasync"),
            (FsyncPolicy.ALWAYS, 8, sync_count, raw_dsync, "dd oflag=dsync"),
        ):
            seconds = wal_seconds(base / f"wal-{policy}", frame, n, policy, writers)
            mb_s = n * frame / MIB / seconds
            ref_n = count if reference is raw else sync_count
            ref_mb_s = ref_n * frame / MIB / reference
            rows.append((label, f"{policy} x{writers}", mb_s, n / seconds, ref_name, ref_mb_s))
    print()
    header = f"{'frame':<7} {'WAL policy':<12} {'WAL MB/s':>9} {'frames/s':>10}  "
    print(header + f"{'raw baseline':<18} {'raw MB/s':>9} {'ratio':>6}")
    for label, policy, mb_s, fps, ref_name, ref_mb_s in rows:
        print(
            f"{label:<7} {policy:<12} {mb_s:>9.1f} {fps:>10.0f}  {ref_name:<18} {ref_mb_s:>9.1f}"
            f" {mb_s / ref_mb_s:>6.2f}"
        )
    print("\ntargets: interval with 1 MiB frames >= 0.70 of raw; always x8 >= 0.50 of dsync")
    if args.sustained_mib:
        print(f"\nsustained: {args.sustained_mib} MiB of 1 MiB frames, fsync interval")
        print(f"{'page-cache window':<18} {'MB/s':>8} {'CPU s/GiB':>10}")
        results = {}
        for name, window in (("off (kernel)", None), ("64 MiB", 64 * MIB)):
            results[name] = sustained(base / "wal-sustained", args.sustained_mib, window)
            print(f"{name:<18} {results[name][0]:>8.0f} {results[name][1]:>10.2f}")
        (off_rate, off_cpu), (on_rate, on_cpu) = results.values()
        print(f"{'ratio (64 MiB/off)':<18} {on_rate / off_rate:>8.2f} {on_cpu / off_cpu:>10.2f}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
