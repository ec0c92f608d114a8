"""Shared WAL test settings and deterministic payloads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from durable_producer.buffer_agent.wal import Frame, FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.stats import RecordRuns

SMALL = WalConfig(
    segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.NEVER
)


def payload_for(offset: int, size: int = 100) -> bytes:
    """Deterministic content so a test can check a frame by its offset alone."""
    seed = f"frame-{offset}-".encode()
    return (seed * (size // len(seed) + 1))[:size]


def write_frames(
    directory: Path,
    count: int,
    *,
    config: WalConfig = SMALL,
    size: int = 100,
    topic: str = "t",
    partitions: int = 1,
) -> None:
    """A log of ``count`` one-record frames, offsets 0.., frame i on partition ``i % partitions``
    with ``payload_for(i, size)``; the log is closed after."""
    with WriteAheadLog.open(directory, config) as wal:
        for offset in range(count):
            wal.append(topic, offset % partitions, payload_for(offset, size), 1)


@contextmanager
def forwarding_wal(
    directory: Path,
    *,
    segment_bytes: int = 256 * 1024,
    max_frame_bytes: int = 128 * 1024,
    max_bytes: int = 64 * 1024 * 1024,
) -> Iterator[WriteAheadLog]:
    """A WAL for forwarder tests (fsync ``never``: durability is not what they test)."""
    log = WriteAheadLog.open(
        directory,
        WalConfig(
            segment_bytes=segment_bytes,
            max_frame_bytes=max_frame_bytes,
            max_bytes=max_bytes,
            fsync=FsyncPolicy.NEVER,
        ),
    )
    try:
        yield log
    finally:
        if not log.closed:
            log.close()


def all_frames(wal: WriteAheadLog, from_offset: int = 0) -> list[Frame]:
    """Every frame from ``from_offset`` on (a poll returns only about 16 MiB of them)."""
    frames: list[Frame] = []
    with wal.reader(from_offset) as reader:
        while batch := reader.poll(max_frames=100_000):
            frames.extend(batch)
    return frames


def record_runs(frames: Iterable[tuple[int, int]]) -> RecordRuns:
    """(offset, record count) of frames, oldest first, as runs (one ``add`` a frame)."""
    runs = RecordRuns()
    for offset, records in frames:
        runs.add(offset, records)
    return runs
