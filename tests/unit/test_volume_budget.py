"""The volume split operator and agent share: the overhead model stays above what real
filesystems were measured to take, and the WAL budget is whole segments beside the reserve."""

from __future__ import annotations

import pytest

from durable_producer.volume_budget import (
    GIB,
    MIB,
    BudgetError,
    ext4_journal_bytes,
    filesystem_overhead_bytes,
    reserve_bytes,
    usable_bytes,
    wal_budget,
)

# benchmarks/filesystem_overhead.py (docs/wal.md, "Space budget"): bytes a non-root process
# could write (statvfs f_bavail * f_frsize) on a freshly made filesystem, as Kubernetes
# formats volumes (mkfs.ext4 -F -m0, mkfs.xfs -f).
MEASURED_AVAILABLE = {
    1: (1_003_900_928, 965_767_168),
    2: (2_023_571_456, 2_032_025_600),
    5: (5_179_580_416, 5_230_784_512),
    10: (10_447_220_736, 10_562_068_480),
    16: (16_713_093_120, 16_959_598_592),
    32: (33_484_955_648, 34_019_680_256),
    50: (52_504_764_416, 53_212_303_360),
    64: (67_032_862_720, 68_139_859_968),
    100: (105_072_459_776, 106_525_089_792),
    128: (134_128_574_464, 136_380_223_488),
    256: (269_410_672_640, 272_794_279_936),
    512: (539_961_487_360, 545_622_429_696),
    1024: (1_081_084_370_944, 1_091_278_692_352),
}


@pytest.mark.parametrize("gib", sorted(MEASURED_AVAILABLE))
def test_the_model_never_promises_more_than_the_filesystems_give(gib: int) -> None:
    predicted = usable_bytes(gib * GIB)
    ext4, xfs = MEASURED_AVAILABLE[gib]
    assert predicted <= min(ext4, xfs)
    # ... and wastes little: within 1 % of the volume plus 64 MiB of the tighter one
    assert min(ext4, xfs) - predicted <= gib * GIB // 100 + 64 * MIB


def test_ext4_journal_follows_mke2fs_defaults() -> None:
    assert ext4_journal_bytes(64 * MIB) == 4 * MIB
    assert ext4_journal_bytes(GIB - 1) == 16 * MIB
    assert ext4_journal_bytes(GIB) == 32 * MIB
    assert ext4_journal_bytes(10 * GIB) == 64 * MIB
    assert ext4_journal_bytes(100 * GIB) == 512 * MIB
    assert ext4_journal_bytes(1024 * GIB) == GIB
    assert filesystem_overhead_bytes(100 * GIB) > filesystem_overhead_bytes(10 * GIB)


def test_budget_is_whole_segments_beside_the_reserve() -> None:
    segment, batch = 64 * MIB, MIB
    reserve = reserve_bytes(segment, batch)
    assert reserve == 4 * MIB + segment + 2 * batch
    budget = wal_budget(GIB, segment, batch)
    assert budget.reserve_bytes == reserve
    assert budget.wal_bytes % segment == 0
    assert budget.wal_bytes + reserve <= GIB < budget.wal_bytes + reserve + segment
    assert wal_budget(usable_bytes(GIB), segment, batch).wal_bytes == 832 * MIB


def test_a_volume_without_room_for_two_segments_names_the_numbers() -> None:
    with pytest.raises(BudgetError, match=r"^1000 usable bytes .* 2 segments of 4096") as error:
        wal_budget(1000, 4096, 1024)
    assert str(4 * MIB + 4096 + 2048 + 2 * 4096) in str(error.value)
