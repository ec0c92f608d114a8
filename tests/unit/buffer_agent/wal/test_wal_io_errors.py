"""A full or failing disk, injected: the log refuses what it cannot store (retriably), never
acknowledges what may be lost, keeps serving reads, and accepts again by itself."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from durable_producer.buffer_agent.volume.format import segment_name
from durable_producer.buffer_agent.wal import (
    FsyncPolicy,
    WalError,
    WalFailedError,
    WalFullError,
    WriteAheadLog,
)
from durable_producer.buffer_agent.wal.config import WalConfig
from durable_producer.buffer_agent.wal.syncer import Syncer, SyncTarget
from support.wal_helpers import SMALL, payload_for

ALWAYS = replace(SMALL, fsync=FsyncPolicy.ALWAYS)
INTERVAL_NEVER_DUE = replace(SMALL, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=3_600_000)


class Faults:
    """Arms ``os`` functions to fail with an errno a given number of times."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self._lock = threading.Lock()

    def fail(self, name: str, error: int, times: int = 1) -> None:
        original: Callable[..., Any] = getattr(os, name)
        left = [times]

        def failing(*args: Any) -> Any:
            with self._lock:
                if left[0] > 0:
                    left[0] -= 1
                    raise OSError(error, os.strerror(error))
            return original(*args)

        self._monkeypatch.setattr(os, name, failing)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    yield Faults(monkeypatch)


def _frames(wal: WriteAheadLog, start: int = 0) -> list[int]:
    with wal.reader(start) as reader:
        return [frame.offset for frame in reader.poll(10_000)]


def test_enospc_refuses_one_append_then_accepting_resumes_by_itself(
    wal_dir: Path, faults: Faults
) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        first = [wal.append("t", 0, payload_for(i)) for i in range(5)]
        faults.fail("pwritev", errno.ENOSPC)
        with pytest.raises(WalFullError, match=r"disk under .* is full"):
            wal.append("t", 0, payload_for(99))
        assert wal.stats().refusing == "disk_full"
        assert wal.healthy, "a full disk is not a failed log"
        after = wal.append("t", 0, payload_for(5))
        assert after == first[-1] + 1, "the refused append took no offset"
        assert wal.stats().refusing is None
        assert _frames(wal) == [*first, after]


def test_reaching_the_limit_is_reported_as_buffer_limit(wal_dir: Path) -> None:
    with WriteAheadLog.open(wal_dir, replace(SMALL, max_bytes=2 * 8192)) as wal:
        with pytest.raises(WalFullError, match="is full"):
            for i in range(1000):
                wal.append("t", 0, payload_for(i, 1000))
        assert wal.stats().refusing == "buffer_limit"


def test_failed_fsync_stops_acknowledging_until_its_frames_are_delivered(
    wal_dir: Path, faults: Faults
) -> None:
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        acked = [wal.append("t", 0, payload_for(i)) for i in range(3)]
        faults.fail("fdatasync", errno.EIO)
        with pytest.raises(WalFailedError, match="stopped accepting after an I/O failure"):
            wal.append("t", 0, payload_for(3))  # written, but its fsync failed: not acked
        assert not wal.healthy
        assert wal.stats().refusing == "wal_failed"
        with pytest.raises(WalFailedError, match="below offset 4"):
            wal.append("t", 0, payload_for(4))
        assert _frames(wal) == [*acked, 3], "what was written is still there to forward"
        wal.checkpoint(3)
        with pytest.raises(WalFailedError):
            wal.append("t", 0, payload_for(4))  # frame 3 is not delivered yet
        wal.checkpoint(4)  # everything written before the failure is in Kafka: reopen
        assert wal.healthy and wal.stats().refusing is None
        assert wal.append("t", 0, payload_for(4)) == 4, "offsets continue, none reused"
        assert (wal_dir / segment_name(4)).exists(), "a fresh segment after the failed one"
        assert not (wal_dir / segment_name(0)).exists(), "the delivered segment is gone"
    with WriteAheadLog.open(wal_dir, ALWAYS) as wal:
        frames = wal.reader().poll(100)
        assert [(f.offset, f.payload) for f in frames] == [(4, payload_for(4))]


def test_failed_fsync_of_a_sealed_segment_fails_the_log(wal_dir: Path, faults: Faults) -> None:
    with WriteAheadLog.open(wal_dir, INTERVAL_NEVER_DUE) as wal:
        offsets = [wal.append("t", 0, payload_for(i, 1000)) for i in range(7)]
        assert wal.stats().segment_count == 1
        faults.fail("fdatasync", errno.EIO)  # the next fdatasync is the seal's
        with pytest.raises(WalFailedError):
            for i in range(7, 20):
                offsets.append(wal.append("t", 0, payload_for(i, 1000)))
        assert wal.stats().segment_count == 1, "the new segment was rolled back"
        assert _frames(wal) == offsets
        wal.checkpoint(wal.next_offset)
        assert wal.append("t", 0, payload_for(50, 1000)) == offsets[-1] + 1


def test_a_failed_roll_back_fails_the_log_and_a_fresh_one_reuses_the_empty_segment(
    wal_dir: Path, faults: Faults
) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        faults.fail("pwritev", errno.EIO)
        faults.fail("ftruncate", errno.EIO)
        with pytest.raises(WalFailedError):
            wal.append("t", 0, payload_for(0))
        assert wal.stats().refusing == "wal_failed"
        # Nothing was ever written: the failure point is offset 0, which the checkpoint
        # already covers, so the next append reopens at once.
        assert wal.append("t", 0, payload_for(0)) == 0
        assert _frames(wal) == [0]
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert _frames(wal) == [0]


def test_a_failed_checkpoint_write_deletes_nothing_and_is_retried(
    wal_dir: Path, faults: Faults
) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        for i in range(40):
            wal.append("t", 0, payload_for(i, 1000))
        segments = wal.stats().segment_count
        assert segments > 2
        faults.fail("fdatasync", errno.EIO)
        with pytest.raises(WalError, match="could not write checkpoint 30"):
            wal.checkpoint(30)
        assert wal.checkpoint_offset == 0
        assert wal.stats().segment_count == segments
        assert wal.healthy, "the log itself is fine"
        wal.checkpoint(30)
        assert wal.checkpoint_offset == 30 and wal.stats().segment_count < segments
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        assert wal.checkpoint_offset == 30


def test_a_failed_syncer_answers_every_waiter_with_the_failure() -> None:
    config = WalConfig(fsync=FsyncPolicy.ALWAYS)
    failures: list[BaseException] = []

    def never(*_: object) -> SyncTarget:
        raise AssertionError("no fsync must start")

    syncer = Syncer(config, durable_offset=4, target=never, on_failure=failures.append,
                    observer=None)
    results: list[BaseException | None] = []
    syncer.register(7, results.append)  # waiting for an fsync (the thread is not started)
    syncer.fail(WalFailedError("a sealed segment could not be synced"))
    syncer.register(9, results.append)
    syncer.register(3, results.append)  # already durable before the failure: still refused
    assert len(results) == 3
    assert all(isinstance(result, WalFailedError) for result in results)


def test_a_syncer_thread_ended_by_any_error_fails_the_log(
    wal_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error other than OSError ended the ``wal-fsync`` thread silently (an OverflowError
    from a huge --fsync-interval-ms did): under ``interval`` the log acknowledged on, with no
    fsync ever again. Now it fails the log as a failed fsync does."""
    config = replace(SMALL, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1)
    with WriteAheadLog.open(wal_dir, config) as wal:
        wal.append("t", 0, payload_for(0))

        def broken(fd: int) -> None:
            raise RuntimeError("not an I/O error")

        monkeypatch.setattr(os, "fdatasync", broken)
        wal.append("t", 0, payload_for(1))  # the next fsync ends the thread
        deadline = time.monotonic() + 5
        while wal.healthy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not wal.healthy, "the thread's end must fail the log"
        with pytest.raises(WalFailedError):
            wal.append("t", 0, payload_for(2))
        monkeypatch.undo()
