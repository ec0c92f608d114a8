"""The public API readers use: segment views, ``wait_for_data``, the waits for appends."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import (
    HEADER_SIZE,
    PREFIX_SIZE,
    SEGMENT_HEADER_SIZE,
)
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal import reader as reader_module
from durable_producer.buffer_agent.wal.errors import WalError
from durable_producer.buffer_agent.wal.frame import Frame
from durable_producer.buffer_agent.wal.reader import WalReader
from support.wal_helpers import SMALL, payload_for


def timed_wait(wait: Callable[[], None], then: Callable[[], None], after: float = 0.2) -> float:
    """Seconds ``wait`` blocked when ``then`` runs ``after`` seconds into it."""
    timer = threading.Timer(after, then)
    started = time.monotonic()
    timer.start()
    try:
        wait()
    finally:
        timer.join()
    return time.monotonic() - started


def test_segment_views_show_complete_frames_and_which_segments_are_sealed(
    small_wal: WriteAheadLog,
) -> None:
    views = small_wal.segment_views()
    assert [(v.visible_end, v.sealed) for v in views] == [(SEGMENT_HEADER_SIZE, False)]
    for i in range(20):
        small_wal.append("t", 0, payload_for(i, 700))
    views = small_wal.segment_views()
    assert len(views) == small_wal.stats().segment_count > 1
    assert [v.sealed for v in views] == [True] * (len(views) - 1) + [False]
    assert [v.base_offset for v in views] == sorted(v.base_offset for v in views)
    assert all(v.visible_end == v.path.stat().st_size for v in views)
    assert sum(v.visible_end for v in views) == small_wal.stats().size_bytes


def test_wait_for_data_returns_at_once_when_there_is_more_to_read(
    small_wal: WriteAheadLog,
) -> None:
    small_wal.append("t", 0, b"x")
    (view,) = small_wal.segment_views()
    started = time.monotonic()
    small_wal.wait_for_data(None, 0, timeout=5)  # nothing read yet, a frame exists
    small_wal.wait_for_data(view.base_offset, SEGMENT_HEADER_SIZE, timeout=5)  # grew past it
    small_wal.wait_for_data(view.base_offset + 1000, 0, timeout=5)  # segment gone: no waiting
    assert time.monotonic() - started < 1


def test_wait_for_data_times_out_when_nothing_is_appended(small_wal: WriteAheadLog) -> None:
    small_wal.append("t", 0, b"x")
    (view,) = small_wal.segment_views()
    started = time.monotonic()
    small_wal.wait_for_data(view.base_offset, view.visible_end, timeout=0.2)
    assert 0.15 < time.monotonic() - started < 3


def test_wait_for_data_wakes_on_an_append(small_wal: WriteAheadLog) -> None:
    (view,) = small_wal.segment_views()
    waited = timed_wait(
        lambda: small_wal.wait_for_data(view.base_offset, view.visible_end, timeout=10),
        lambda: small_wal.append("t", 0, b"late"),
    )
    assert 0.15 < waited < 5, "woken by the append, not by the timeout"


def test_wait_for_data_wakes_when_the_segment_is_sealed(small_wal: WriteAheadLog) -> None:
    small_wal.append("t", 0, payload_for(0, 3000))
    (view,) = small_wal.segment_views()

    def fill_the_segment() -> None:
        while len(small_wal.segment_views()) == 1:
            small_wal.append("t", 0, payload_for(1, 3000))

    waited = timed_wait(
        lambda: small_wal.wait_for_data(view.base_offset, 10**9, timeout=10), fill_the_segment
    )
    assert waited < 5, "a newer segment means the reader must move on"


def test_wait_for_data_wakes_on_close(wal_dir: Path) -> None:
    wal = WriteAheadLog.open(wal_dir, SMALL)
    (view,) = wal.segment_views()
    waited = timed_wait(
        lambda: wal.wait_for_data(view.base_offset, view.visible_end, timeout=10), wal.close
    )
    assert waited < 5
    started = time.monotonic()
    wal.wait_for_data(view.base_offset, view.visible_end, timeout=10)
    assert time.monotonic() - started < 1, "a closed log never blocks a reader"


def test_wait_for_data_wakes_on_wake_waiters(small_wal: WriteAheadLog) -> None:
    (view,) = small_wal.segment_views()
    waited = timed_wait(
        lambda: small_wal.wait_for_data(view.base_offset, view.visible_end, timeout=10),
        small_wal.wake_waiters,
    )
    assert waited < 5


def test_wait_for_append_wakes_on_an_append_and_on_close(wal_dir: Path) -> None:
    wal = WriteAheadLog.open(wal_dir, SMALL)
    waited = timed_wait(
        lambda: wal.wait_for_append(wal.next_offset, timeout=10),
        lambda: wal.append("t", 0, b"x"),
    )
    assert waited < 5
    waited = timed_wait(lambda: wal.wait_for_append(wal.next_offset, timeout=10), wal.close)
    assert waited < 5


def test_watch_appends_wakes_an_event_loop_on_an_append_wake_waiters_and_close(
    wal_dir: Path,
) -> None:
    """The forwarder's wait: a future of its loop, done from the appending thread."""
    wal = WriteAheadLog.open(wal_dir, SMALL)

    async def waited_for(then: Callable[[], None]) -> float:
        appended = wal.watch_appends(wal.next_offset)
        assert appended is not None
        timer = threading.Timer(0.2, then)
        started = time.monotonic()
        timer.start()
        try:
            await asyncio.wait_for(appended, 10)
        finally:
            timer.join()
            wal.unwatch_appends(appended)
        return time.monotonic() - started

    async def scenario() -> None:
        assert await waited_for(lambda: wal.append("t", 0, b"x")) < 5
        assert await waited_for(wal.wake_waiters) < 5
        before = wal.next_offset
        wal.append("t", 0, b"y")
        assert wal.watch_appends(before) is None, "a frame past it is there already"
        left = wal.watch_appends(wal.next_offset)
        assert left is not None
        wal.unwatch_appends(left)
        wal.append("t", 0, b"z")
        assert not left.done(), "handed back: not woken"
        assert await waited_for(wal.close) < 5
        assert wal.watch_appends(wal.next_offset) is None, "closed"

    asyncio.run(scenario())


def test_a_polling_reader_wakes_on_close(wal_dir: Path) -> None:
    wal = WriteAheadLog.open(wal_dir, SMALL)
    wal.append("t", 0, b"x")
    with wal.reader(0) as reader:
        assert [f.offset for f in reader.poll(10)] == [0]
        frames: list[object] = []
        waited = timed_wait(lambda: frames.extend(reader.poll(10, timeout=10)), wal.close)
    assert frames == []
    assert waited < 5


def test_a_poll_returns_about_max_bytes_of_frames_and_at_least_one(tmp_path: Path) -> None:
    config = WalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, max_frame_bytes=64 << 10,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path, config) as log:
        for offset in range(100):
            log.append("t", 0, payload_for(offset, 10_000))
        with log.reader(0) as reader:
            first = reader.poll(max_frames=1000, max_bytes=35_000)
            assert [frame.offset for frame in first] == [0, 1, 2, 3]  # 40,000 >= 35,000
            assert [frame.offset for frame in reader.poll(max_bytes=1)] == [4]
            rest = []
            while frames := reader.poll(max_frames=1000, max_bytes=100_000):
                assert len(frames) <= 10
                rest.extend(frame.offset for frame in frames)
            assert rest == list(range(5, 100))


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of every ``os.pread`` from now on (the reader reads only through it)."""
    lengths: list[int] = []
    real = os.pread

    def counted(fd: int, length: int, position: int) -> bytes:
        data = real(fd, length, position)
        lengths.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted)
    return lengths


def test_polls_of_a_few_frames_read_each_byte_of_the_segment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up polls a few thousand small frames at a time from a 4 MiB chunk: the next
    poll decodes the rest of the chunk instead of reading it again."""
    config = WalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, max_frame_bytes=64 << 10,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path, config) as log:
        for offset in range(2000):
            log.append("t", offset % 3, payload_for(offset, 300))
        (view,) = log.segment_views()
        lengths = _count_reads(monkeypatch)
        with log.reader(0) as reader:
            got = []
            while frames := reader.poll(max_frames=64):
                assert len(frames) <= 64
                got.extend(frames)
    assert [(f.offset, f.partition, f.payload) for f in got] == [
        (offset, offset % 3, payload_for(offset, 300)) for offset in range(2000)
    ]
    assert sum(lengths) == view.visible_end - SEGMENT_HEADER_SIZE  # each byte read once


def test_frames_that_cross_the_chunk_read_and_frames_appended_between_polls_all_arrive(
    tmp_path: Path,
) -> None:
    sizes = [random.Random(offset).randrange(1, 700_000) for offset in range(40)]
    config = WalConfig(segment_bytes=64 << 20, max_bytes=256 << 20, max_frame_bytes=1 << 20,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path, config) as log:
        for offset in range(30):
            log.append("t", 0, payload_for(offset, sizes[offset]))
        got = []
        with log.reader(0) as reader:
            got.extend(reader.poll(max_frames=2))  # the rest of its chunk stays for later
            for offset in range(30, 40):
                log.append("t", 0, payload_for(offset, sizes[offset]))
            while frames := reader.poll(max_frames=3):
                got.extend(frames)
    assert [len(frame.payload) for frame in got] == sizes
    assert [frame.payload for frame in got] == [
        payload_for(offset, size) for offset, size in enumerate(sizes)
    ]


def _poll_in_thread(reader: WalReader, max_frames: int) -> list[Frame] | BaseException:
    """``reader.poll``'s frames or what it raised, failing the test if it has not returned
    within 20 s (a reader that asks for the same bytes again and again never returns)."""
    outcome: list[list[Frame] | BaseException] = []

    def poll() -> None:
        try:
            outcome.append(reader.poll(max_frames))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    thread.join(20)
    assert outcome, "poll did not return within 20 s"
    return outcome[0]


FRAME_SIZE = HEADER_SIZE + 1 + 100  # a header, topic "t", a 100-byte payload


@pytest.mark.parametrize("short_by", [PREFIX_SIZE, PREFIX_SIZE + 1, HEADER_SIZE - 1])
def test_a_damaged_length_near_the_end_of_a_kept_chunk_is_reported_not_polled_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_by: int
) -> None:
    """The disk zeroed frame 10's prefix (a length of 0) and the chunk read ends ``short_by``
    bytes into it: the reader must read again and say what is there."""
    monkeypatch.setattr(reader_module, "_READ_CHUNK", 10 * FRAME_SIZE + short_by)
    config = WalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, max_frame_bytes=64 << 10,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path, config) as log:
        for offset in range(20):
            log.append("t", 0, payload_for(offset))
        (view,) = log.segment_views()
        assert view.visible_end == SEGMENT_HEADER_SIZE + 20 * FRAME_SIZE
        with open(view.path, "r+b") as segment:
            segment.seek(SEGMENT_HEADER_SIZE + 10 * FRAME_SIZE)
            segment.write(bytes(PREFIX_SIZE))
        with log.reader(0) as reader:
            first = reader.poll(max_frames=1)  # the chunk's other frames are kept
            rest = _poll_in_thread(reader, 100)
    assert [frame.offset for frame in first] == [0]
    assert isinstance(rest, WalError), rest
    assert f"at byte {SEGMENT_HEADER_SIZE + 10 * FRAME_SIZE} while reading" in str(rest)


def test_a_frame_larger_than_the_chunk_between_small_ones_arrives_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "_READ_CHUNK", 4 * FRAME_SIZE)
    sizes = [100] * 6 + [20 * FRAME_SIZE] + [100] * 6
    config = WalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, max_frame_bytes=64 << 10,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path, config) as log:
        for offset, size in enumerate(sizes):
            log.append("t", 0, payload_for(offset, size))
        got = []
        with log.reader(0) as reader:
            while frames := reader.poll(max_frames=2):
                got.extend(frames)
    assert [frame.payload for frame in got] == [
        payload_for(offset, size) for offset, size in enumerate(sizes)
    ]
