"""A real ENOSPC: the WAL on a tiny tmpfs. Appends fail cleanly, nothing earlier is harmed,
and what frees space (checkpoint, forwarder hint) works on a 100 % full disk."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.progress import HintFile, read_hint
from durable_producer.buffer_agent.wal import WalFullError, WriteAheadLog
from support.volumes import fill, free_bytes
from support.wal_helpers import SMALL, all_frames, payload_for

pytestmark = pytest.mark.integration


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_real_enospc_rolls_back_and_recovers(tiny_filesystem: Path) -> None:
    config = replace(SMALL, max_bytes=1 << 30)  # the disk, not the limit, runs out first
    directory = tiny_filesystem / "wal"
    with WriteAheadLog.open(directory, config) as wal:
        appended = []
        with pytest.raises(WalFullError, match=r"disk under .* is full"):
            for i in range(10_000):
                appended.append(wal.append("t", 0, payload_for(i, 1500)))
        assert len(appended) > 20
        assert wal.next_offset == appended[-1] + 1, "the failed append must not take an offset"
        frames = all_frames(wal)
        assert [f.offset for f in frames] == appended
        assert all(f.payload == payload_for(f.offset, 1500) for f in frames)
        wal.checkpoint(appended[-1] + 1)
        assert wal.append("t", 0, payload_for(10_001, 1500)) == appended[-1] + 1
    with WriteAheadLog.open(directory, config) as wal:
        frames = wal.reader().poll(100)
        assert [f.offset for f in frames] == [appended[-1] + 1]
        assert wal.stats().quarantined_segments == 0


def test_checkpoint_and_hint_need_no_new_block_on_a_completely_full_disk(
    tiny_filesystem: Path,
) -> None:
    config = replace(SMALL, max_bytes=1 << 30)
    hint = HintFile(tiny_filesystem / "state")
    hint.write(0, 0, durable=True)  # created while there is room, as the agent does
    with WriteAheadLog.open(tiny_filesystem / "wal", config) as wal:
        with pytest.raises(WalFullError):
            for i in range(10_000):
                wal.append("t", 0, payload_for(i, 1500))
        fill(tiny_filesystem)
        assert free_bytes(tiny_filesystem) == 0
        hint.write(wal.next_offset, 5, durable=True)
        hint.write(wal.next_offset, 6, durable=False)
        wal.checkpoint(wal.next_offset - 1)  # frees every segment but the newest
        assert free_bytes(tiny_filesystem) > 0
        wal.append("t", 0, payload_for(0, 1500))
    hint.close()
    assert read_hint(tiny_filesystem / "state")["delivered_high"] == 6
