"""A WAL writer process for crash tests: prints each record id once its append has returned.

Usage: ``python -m support.wal_writer DIRECTORY THREADS RUN``. Several threads append
concurrently with fsync ``always`` (so they share fsyncs); each payload is derived from its id
so a reader can check it byte for byte.
"""

from __future__ import annotations

import sys
import threading
import zlib
from pathlib import Path

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog

CRASH_CONFIG = WalConfig(
    segment_bytes=64 * 1024, max_bytes=1 << 30, max_frame_bytes=8192, fsync=FsyncPolicy.ALWAYS
)


def payload_for_id(ident: str) -> bytes:
    size = 50 + zlib.crc32(ident.encode()) % 3000
    seed = (ident + "|").encode()
    return (seed * (size // len(seed) + 1))[:size]


def id_of(payload: bytes) -> str:
    return payload.split(b"|", 1)[0].decode()


def main() -> None:
    directory, threads, run = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    wal = WriteAheadLog.open(directory, CRASH_CONFIG)
    out_lock = threading.Lock()
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def writer(thread: int) -> None:
        sequence = 0
        while True:
            ident = f"r{run}t{thread}n{sequence}"
            wal.append("crash", sequence % 5, payload_for_id(ident))
            with out_lock:
                sys.stdout.write(ident + "\n")
                sys.stdout.flush()
            sequence += 1

    for thread in range(threads):
        threading.Thread(target=writer, args=(thread,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
