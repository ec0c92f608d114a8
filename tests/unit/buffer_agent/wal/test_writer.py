from __future__ import annotations

import asyncio
import json
import mmap
import os
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import (
    AppendItem,
    FrameTooLargeError,
    FsyncPolicy,
    FullDiskPolicy,
    WalClosedError,
    WalConfig,
    WalFullError,
    WalLockedError,
    WriteAheadLog,
)
from durable_producer.buffer_agent.wal.segment import list_segments
from durable_producer.buffer_agent.wal.writer import OFFLOAD_WRITE_BYTES
from support.waiting import wait_for
from support.wal_helpers import SMALL, payload_for


def test_appends_are_read_back_in_order_across_segments(small_wal: WriteAheadLog) -> None:
    offsets = [small_wal.append("t", i % 4, payload_for(i, 700), 2) for i in range(40)]
    assert offsets == list(range(40))
    assert small_wal.stats().segment_count > 3
    frames = small_wal.reader(0).poll(max_frames=1000)
    assert [f.offset for f in frames] == offsets
    assert all(f.payload == payload_for(f.offset, 700) for f in frames)
    assert all(f.partition == f.offset % 4 and f.record_count == 2 for f in frames)


def test_append_many_is_one_group_with_consecutive_offsets(small_wal: WriteAheadLog) -> None:
    small_wal.append("t", 0, b"first")
    items = [AppendItem(f"topic-{i}", i, payload_for(i, 1500), i) for i in range(10)]
    assert small_wal.append_many(items) == list(range(1, 11))
    frames = small_wal.reader(1).poll(100)
    assert [(f.topic, f.partition, f.payload) for f in frames] == [
        (item.topic, item.partition, bytes(item.payload)) for item in items
    ]


def test_reader_starts_from_any_offset_and_follows_the_tail(small_wal: WriteAheadLog) -> None:
    for i in range(30):
        small_wal.append("t", 0, payload_for(i, 500))
    reader = small_wal.reader(17)
    assert [f.offset for f in reader.poll(5)] == [17, 18, 19, 20, 21]
    assert [f.offset for f in reader.poll(100)] == list(range(22, 30))
    assert reader.poll(100, timeout=0.05) == []

    def late_writer() -> None:
        time.sleep(0.2)
        small_wal.append("t", 0, payload_for(30, 500))

    thread = threading.Thread(target=late_writer)
    started = time.monotonic()
    thread.start()
    frames = reader.poll(100, timeout=5)
    thread.join()
    assert [f.offset for f in frames] == [30]
    assert time.monotonic() - started < 4, "the reader must wake up on the append, not time out"


def test_checkpoint_deletes_whole_segments_and_survives_reopen(wal_dir: Path) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for i in range(60):
            wal.append("t", 0, payload_for(i, 600))
        before = wal.stats()
        wal.checkpoint(45)
        after = wal.stats()
        assert after.segment_count < before.segment_count
        assert after.size_bytes < before.size_bytes
        remaining = [base for base, _ in list_segments(wal_dir)]
        assert remaining[0] <= 45 < (remaining[1] if len(remaining) > 1 else 10**9)
        wal.checkpoint(10)  # lower checkpoints are ignored, never moved backwards
        assert wal.checkpoint_offset == 45
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.checkpoint_offset == 45
        assert wal.next_offset == 60
        assert [f.offset for f in wal.reader().poll(100)] == list(range(45, 60))
        assert wal.append("t", 0, b"more") == 60


def test_checkpoint_beyond_the_log_is_refused(small_wal: WriteAheadLog) -> None:
    small_wal.append("t", 0, b"x")
    with pytest.raises(ValueError, match="beyond the next WAL offset"):
        small_wal.checkpoint(5)


def test_a_second_agent_cannot_open_the_same_directory(small_wal: WriteAheadLog) -> None:
    with pytest.raises(WalLockedError, match="must never share a buffer volume"):
        WriteAheadLog.open(small_wal.directory, SMALL)


def test_the_lock_is_released_on_close(wal_dir: Path) -> None:
    WriteAheadLog.open(wal_dir, SMALL).close()
    WriteAheadLog.open(wal_dir, SMALL).close()


def test_oversize_frame_is_refused_with_advice(small_wal: WriteAheadLog) -> None:
    with pytest.raises(FrameTooLargeError, match="max frame size of 4096"):
        small_wal.append("t", 0, bytes(5000))
    assert small_wal.next_offset == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_frame_bytes": 10_000}, "must fit in one segment"),
        ({"max_bytes": 10_000}, "at least two segments"),
        ({"fsync_interval_ms": 0}, "must be positive"),
    ],
)
def test_inconsistent_configuration_is_explained(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(SMALL, **change).validate()


def test_full_log_rejects_then_accepts_after_a_checkpoint(wal_dir: Path) -> None:
    config = replace(SMALL, max_bytes=3 * 8192)
    with WriteAheadLog.open(wal_dir, config) as wal:
        appended = []
        with pytest.raises(WalFullError, match="is full"):
            for i in range(1000):
                appended.append(wal.append("t", 0, payload_for(i, 1000)))
        assert len(appended) > 10
        assert wal.stats().size_bytes <= config.max_bytes
        with pytest.raises(WalFullError):
            wal.append("t", 0, payload_for(999, 1000))
        frames = wal.reader(0).poll(10_000)
        assert [f.offset for f in frames] == appended
        assert all(f.payload == payload_for(f.offset, 1000) for f in frames)
        wal.checkpoint(appended[-1] + 1)
        assert wal.append("t", 0, b"after checkpoint") == appended[-1] + 1


def test_block_policy_waits_for_space_then_succeeds(wal_dir: Path) -> None:
    config = replace(
        SMALL, max_bytes=3 * 8192, full_disk_policy=FullDiskPolicy.BLOCK, block_timeout_s=5
    )
    offset = 0
    with (
        WriteAheadLog.open(wal_dir, replace(config, full_disk_policy=FullDiskPolicy.REJECT)) as wal,
        pytest.raises(WalFullError),
    ):
        while True:
            offset = wal.append("t", 0, payload_for(offset, 1000)) + 1
    with WriteAheadLog.open(wal_dir, config) as wal:
        timer = threading.Timer(0.3, wal.checkpoint, args=(offset,))
        started = time.monotonic()
        timer.start()
        assert wal.append("t", 0, payload_for(offset, 1000)) == offset
        waited = time.monotonic() - started
        timer.join()
        assert 0.2 < waited < 4


def test_block_policy_gives_up_after_its_bound(wal_dir: Path) -> None:
    config = replace(
        SMALL, max_bytes=2 * 8192, full_disk_policy=FullDiskPolicy.BLOCK, block_timeout_s=0.2
    )
    with WriteAheadLog.open(wal_dir, config) as wal:
        with pytest.raises(WalFullError):
            for i in range(100):
                wal.append("t", 0, payload_for(i, 1000))
        started = time.monotonic()
        with pytest.raises(WalFullError):
            wal.append("t", 0, b"x" * 1000)
        assert time.monotonic() - started >= 0.19


def test_closed_log_refuses_appends(wal_dir: Path) -> None:
    wal = WriteAheadLog.open(wal_dir, SMALL)
    wal.close()
    with pytest.raises(WalClosedError):
        wal.append("t", 0, b"late")


def test_always_policy_group_commit_from_many_threads(wal_dir: Path) -> None:
    fsyncs: list[float] = []
    config = replace(SMALL, fsync=FsyncPolicy.ALWAYS, segment_bytes=1 << 20, max_bytes=1 << 24)
    with WriteAheadLog.open(wal_dir, config, fsync_observer=fsyncs.append) as wal:
        results: list[int] = []
        lock = threading.Lock()

        def writer(n: int) -> None:
            for i in range(50):
                offset = wal.append(f"t{n}", n, payload_for(i, 200))
                assert wal.stats().durable_offset >= offset
                with lock:
                    results.append(offset)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == list(range(400))
        assert 0 < len(fsyncs) < 400, "concurrent appends must share fsyncs"


def test_async_appends_wait_for_durability_without_blocking_the_loop(wal_dir: Path) -> None:
    config = replace(SMALL, fsync=FsyncPolicy.ALWAYS, segment_bytes=1 << 20, max_bytes=1 << 24)

    async def scenario(wal: WriteAheadLog) -> list[list[int]]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        batches = [
            [AppendItem("t", p, payload_for(p * 100 + i, 300)) for i in range(3)] for p in range(20)
        ]
        results = await asyncio.gather(*(wal.append_many_async(b) for b in batches))
        tick_task.cancel()
        assert ticks > 0
        return results

    with WriteAheadLog.open(wal_dir, config) as wal:
        results = asyncio.run(scenario(wal))
        flat = sorted(o for group in results for o in group)
        assert flat == list(range(60))
        assert all(group == list(range(group[0], group[0] + 3)) for group in results)
        assert wal.stats().durable_offset == 59


def test_interval_policy_syncs_in_the_background(wal_dir: Path) -> None:
    config = replace(SMALL, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=20)
    with WriteAheadLog.open(wal_dir, config) as wal:
        offset = wal.append("t", 0, b"x")
        wait_for(lambda: wal.stats().durable_offset >= offset, timeout=5, interval=0.01,
                 what="the background fsync")
        assert wal.stats().durable_offset == offset


def test_backlog_records_follow_appends_checkpoints_and_reopen(wal_dir: Path) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for i in range(30):
            wal.append("t", 0, payload_for(i, 500), record_count=i)
        assert wal.stats().backlog_records == sum(range(30))
        wal.checkpoint(10)
        assert wal.stats().backlog_records == sum(range(10, 30))
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.stats().backlog_records == sum(range(10, 30))
        wal.checkpoint(30)
        assert wal.stats().backlog_records == 0


def test_large_async_groups_are_written_off_the_event_loop(wal_dir: Path) -> None:
    """Groups of OFFLOAD_WRITE_BYTES or more go to the writer thread; small ones stay inline."""
    config = replace(SMALL, segment_bytes=1 << 22, max_frame_bytes=1 << 21, max_bytes=1 << 26)
    writer_threads: list[str] = []

    async def scenario(wal: WriteAheadLog) -> list[list[int]]:
        real_append = wal._append

        def spy(*args: object, **kwargs: object) -> list[int]:
            writer_threads.append(threading.current_thread().name)
            return real_append(*args, **kwargs)  # type: ignore[arg-type]

        wal._append = spy  # type: ignore[method-assign]
        large = [AppendItem("t", 0, payload_for(i, OFFLOAD_WRITE_BYTES)) for i in range(2)]
        small = [AppendItem("t", 1, payload_for(9, 100))]
        return [await wal.append_many_async(large), await wal.append_many_async(small)]

    with WriteAheadLog.open(wal_dir, config) as wal:
        assert asyncio.run(scenario(wal)) == [[0, 1], [2]]
        frames = wal.reader(0).poll(10)
        assert [f.payload for f in frames] == [
            payload_for(0, OFFLOAD_WRITE_BYTES),
            payload_for(1, OFFLOAD_WRITE_BYTES),
            payload_for(9, 100),
        ]
    assert writer_threads[0].startswith("wal-writer")
    assert writer_threads[1] == threading.main_thread().name


def test_offloaded_appends_after_close_fail_cleanly(wal_dir: Path) -> None:
    config = replace(SMALL, segment_bytes=1 << 22, max_frame_bytes=1 << 21, max_bytes=1 << 26)
    wal = WriteAheadLog.open(wal_dir, config)
    wal.close()

    async def scenario() -> None:
        await wal.append_many_async([AppendItem("t", 0, bytes(OFFLOAD_WRITE_BYTES))])

    with pytest.raises((WalClosedError, RuntimeError)):
        asyncio.run(scenario())


def cached_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, from util-linux's fincore (mincore(2))."""
    report = subprocess.run(
        ["fincore", "--json", "--bytes", str(path)], capture_output=True, text=True, check=True
    )
    return int(json.loads(report.stdout)["fincore"][0]["res"])


@pytest.mark.skipif(shutil.which("fincore") is None, reason="util-linux fincore not installed")
@pytest.mark.parametrize("window", [1 << 20, None], ids=["1MiB-window", "kernel-decides"])
def test_synced_data_behind_the_window_leaves_the_page_cache(
    wal_dir: Path, window: int | None
) -> None:
    config = WalConfig(
        segment_bytes=64 << 20,
        max_bytes=256 << 20,
        max_frame_bytes=1 << 20,
        fsync=FsyncPolicy.INTERVAL,
        fsync_interval_ms=10,
        page_cache_window_bytes=window,
    )
    payload = os.urandom(512 * 1024)
    with WriteAheadLog.open(wal_dir, config) as wal:
        # One fsync per frame: each release then starts and ends inside a page (a frame is
        # 512 KiB plus its header), the case where a page at each boundary used to stay.
        for _ in range(32):  # 16 MiB
            offset = wal.append("t", 0, payload)
            # The syncer releases pages before it publishes the durable offset.
            wait_for(lambda o=offset: wal.stats().durable_offset >= o, 10, 0.005, "the fsync")
        segment = list_segments(wal_dir)[0][1]
        size = segment.stat().st_size
        cached = cached_bytes(segment)
        assert [f.payload == payload for f in wal.reader(0).poll(100)] == [True] * 32
    if window is None:
        assert cached == pytest.approx(size, abs=8192)
    else:
        # Up to a page of the window's far end stays (releases are whole pages).
        assert window - 8192 <= cached <= window + mmap.PAGESIZE + 8192, (
            f"{cached - window} bytes beyond the {window}-byte window stay cached"
        )
