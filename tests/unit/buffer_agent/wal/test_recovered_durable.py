"""Frames found on open are made durable before the log serves (review finding 2).

A batch written to the page cache but not yet fsynced when the agent is killed is recovered on
restart and counted durable: a client's retry of it is answered as a duplicate at once. Unless
the open fsyncs it, a node crash before writeback loses a record acknowledged under ``always``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WalError, WriteAheadLog
from durable_producer.buffer_agent.wal.segment import list_segments
from support.wal_helpers import payload_for

CONFIG = WalConfig(segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096)


def write_unsynced(directory: Path, frames: int) -> None:
    """Frames in the page cache only, as a kill -9 before the group fsync leaves them."""
    with WriteAheadLog.open(directory, WalConfig(
        segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.NEVER
    )) as log:  # fmt: skip
        for offset in range(frames):
            log.append("t", 0, payload_for(offset))


@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
def test_open_fdatasyncs_every_recovered_segment_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: FsyncPolicy
) -> None:
    write_unsynced(tmp_path, 200)  # several segments
    segments = [path for _, path in list_segments(tmp_path)]
    assert len(segments) > 2
    synced: list[Path] = []
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    config = WalConfig(segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096, fsync=policy)
    with WriteAheadLog.open(tmp_path, config) as log:
        synced_on_open = list(synced)
        assert log.next_offset == 200

    assert set(segments) <= set(synced_on_open)


def test_a_log_never_synced_is_not_synced_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_unsynced(tmp_path, 20)
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    with WriteAheadLog.open(tmp_path, WalConfig(
        segment_bytes=8192, max_bytes=1 << 20, max_frame_bytes=4096, fsync=FsyncPolicy.NEVER
    )):  # fmt: skip
        pass
    assert calls == []  # never means never


def test_a_failed_fsync_on_open_refuses_to_open_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_unsynced(tmp_path, 20)

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(WalError, match="could not fsync the recovered WAL"):
        WriteAheadLog.open(tmp_path, CONFIG)
    monkeypatch.undo()
    with WriteAheadLog.open(tmp_path, CONFIG) as log:  # the lock was released
        assert log.next_offset == 20
