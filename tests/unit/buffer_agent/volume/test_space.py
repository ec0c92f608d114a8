"""The agent fits its WAL limit to the volume it was given: lowered with a warning naming
both numbers, refused (exit 2 in the agent) only when the volume could never hold it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.space import (
    VolumeSpace,
    VolumeTooSmall,
    fit_wal_limit,
    free_bytes,
    measure_volume,
)
from durable_producer.volume_budget import MIB, reserve_bytes

SEGMENT = MIB
BATCH = 64 * 1024
RESERVE = reserve_bytes(SEGMENT, BATCH)


def space(free: int, capacity: int, segments: int = 0) -> VolumeSpace:
    return VolumeSpace(free_bytes=free, capacity_bytes=capacity, segment_bytes=segments)


def test_a_limit_that_fits_is_kept() -> None:
    limit = fit_wal_limit(4 * MIB, space(100 * MIB, 100 * MIB), SEGMENT, BATCH)
    assert (limit.max_bytes, limit.warning) == (4 * MIB, None)


def test_a_limit_larger_than_the_volume_is_lowered_with_both_numbers() -> None:
    usable = 20 * MIB
    limit = fit_wal_limit(1 << 30, space(usable - 3 * MIB, 64 * MIB, 3 * MIB), SEGMENT, BATCH)
    assert limit.max_bytes == (usable - RESERVE) // SEGMENT * SEGMENT
    assert limit.warning is not None
    assert str(1 << 30) in limit.warning and str(limit.max_bytes) in limit.warning
    assert str(usable) in limit.warning


def test_other_files_filling_a_large_enough_volume_leave_the_wal_its_room() -> None:
    limit = fit_wal_limit(32 * MIB, space(MIB, 64 * MIB), SEGMENT, BATCH)
    assert limit.max_bytes == 2 * SEGMENT
    assert limit.warning is not None and "other files" in limit.warning
    # restarted on a volume another program filled: the segments it holds stay its own
    held = fit_wal_limit(32 * MIB, space(0, 64 * MIB, segments=5 * MIB + 4096), SEGMENT, BATCH)
    assert held.max_bytes == 5 * MIB


def test_a_volume_too_small_for_two_segments_and_the_reserve_is_refused() -> None:
    with pytest.raises(VolumeTooSmall, match=str(2 * SEGMENT + RESERVE)) as error:
        fit_wal_limit(32 * MIB, space(5 * MIB, 5 * MIB), SEGMENT, BATCH)
    assert "--segment-bytes" in str(error.value)


def test_measure_counts_the_wal_segments_and_asks_statvfs(tmp_path: Path) -> None:
    wal = tmp_path / "volume" / "wal"
    wal.mkdir(parents=True)
    (wal / f"{0:020d}.seg").write_bytes(b"x" * 100_000)
    (wal / "checkpoint").write_bytes(b"x" * 100_000)  # not a segment: not counted
    measured = measure_volume(tmp_path / "volume", wal)
    stats = os.statvfs(tmp_path)
    assert 100_000 <= measured.segment_bytes < 100_000 + 64 * 1024
    assert abs(measured.free_bytes - stats.f_bavail * stats.f_frsize) < 64 * MIB
    assert measured.capacity_bytes >= measured.free_bytes
    assert free_bytes(tmp_path / "not" / "yet") > 0  # a new volume's directories come later
