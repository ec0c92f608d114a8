"""How a buffer volume's bytes are spent: one function for the operator and the agent.

The operator sizes a volume and tells its agent the WAL's size limit; the agent measures the
filesystem it was given and bounds the WAL below it. Both ask this module, so they cannot
disagree:

    usable   = what the filesystem lets the (non-root) agent write: the volume minus the
               filesystem's own overhead (inode tables, journal, bitmaps, descriptors)
    reserve  = what the agent keeps free beside the WAL: checkpoint, forwarder hint,
               producer-state snapshot, metadata cache, one dead-lettered frame, and one
               salvaged segment for a quarantine
    wal      = usable - reserve, rounded down to whole segments, at least two segments

The operator predicts ``usable`` from the volume's size (:func:`usable_bytes`); the agent
measures it at start (``statvfs``: what it may still write plus its segments) and calls
:func:`wal_budget` with the measured figure.

Pure: no I/O, no imports from the rest of the package (import-linter keeps it that way).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
_BLOCK = 4096

MIN_SEGMENTS = 2
"""The WAL frees space a whole segment at a time: it needs the active one and one to delete."""

STATE_RESERVE_BYTES = 4 * MIB
"""Room for the agent's small files, each of which may exist twice while it is replaced.

Checkpoint and forwarder hint (1 KiB each, preallocated, rewritten in place), the lock,
producer ids, the directories (a block or so each); the metadata cache (about 70 bytes a
topic: 10,000 topics take 0.7 MB); the producer-state snapshot (about 150 bytes per producer
and partition written to: 10,000 of them take 1.5 MB). A write that finds no room anyway is
logged and skipped (the previous file stays); the agent carries on."""

INODE_TABLE_RATIO = 64
"""ext4 (mke2fs defaults): one 256-byte inode per 16 KiB, i.e. 1/64 of the volume."""

METADATA_FIXED_BYTES = 64 * MIB
METADATA_RATIO = 4096
"""Bitmaps, group descriptors, reserved descriptor blocks, root and lost+found: measured
below 64 MiB + 1/4096 of the volume for ext4 from 1 GiB to 1 TiB."""


@dataclass(frozen=True, slots=True)
class VolumeBudget:
    """How a volume's usable bytes are split between the WAL and everything else."""

    usable_bytes: int
    reserve_bytes: int
    wal_bytes: int


class BudgetError(ValueError):
    """The volume is too small to hold a WAL of two segments plus the reserve."""


def ext4_journal_bytes(volume_bytes: int) -> int:
    """The journal mke2fs makes by default (e2fsprogs' ``ext2fs_default_journal_size``, 4 KiB
    blocks): 16 MiB from 128 MiB, doubling at 1, 2, 16, 32, 64 and 128 GiB, at most 1 GiB."""
    blocks = volume_bytes // _BLOCK
    if blocks < 2048:
        return 0
    steps = (
        (32 * 1024, 4 * MIB),
        (256 * 1024, 16 * MIB),
        (512 * 1024, 32 * MIB),
        (4096 * 1024, 64 * MIB),
        (8192 * 1024, 128 * MIB),
        (16384 * 1024, 256 * MIB),
        (32768 * 1024, 512 * MIB),
    )
    for below_blocks, journal in steps:
        if blocks < below_blocks:
            return journal
    return GIB


def filesystem_overhead_bytes(volume_bytes: int) -> int:
    """Bytes of a new volume of ``volume_bytes`` that a non-root process cannot write.

    An upper bound measured for the filesystems Kubernetes makes on a new volume
    (``mkfs.ext4 -F -m0`` and ``mkfs.xfs -f``, as ``k8s.io/mount-utils`` runs them) from
    1 GiB to 1 TiB (``benchmarks/filesystem_overhead.py``; the table is in docs/wal.md):
    ext4's inode tables and journal plus its other metadata. xfs needs less from 2 GiB up.
    A filesystem that reserves blocks for root (plain ``mkfs.ext4``: 5 %) leaves less: the
    agent measures its volume at start and lowers the WAL limit to fit.
    """
    return (
        volume_bytes // INODE_TABLE_RATIO
        + ext4_journal_bytes(volume_bytes)
        + METADATA_FIXED_BYTES
        + volume_bytes // METADATA_RATIO
    )


def usable_bytes(volume_bytes: int) -> int:
    """What the agent can write on a new volume of ``volume_bytes`` (the operator's view)."""
    return max(0, volume_bytes - filesystem_overhead_bytes(volume_bytes))


def reserve_bytes(segment_bytes: int, max_batch_bytes: int) -> int:
    """Space kept free beside the WAL for the agent's other files.

    The small state files (:data:`STATE_RESERVE_BYTES`); one segment, which recovery writes
    when it salvages the valid frames of a damaged segment while the original is kept in
    quarantine; and twice the largest batch: one frame written as a dead letter (base64 in a
    JSON line: 4/3 of its size and the record's fields).
    """
    return STATE_RESERVE_BYTES + segment_bytes + 2 * max_batch_bytes


def wal_budget(usable: int, segment_bytes: int, max_batch_bytes: int) -> VolumeBudget:
    """Split ``usable`` bytes; raise :class:`BudgetError` (numbers in the message) if too small."""
    reserve = reserve_bytes(segment_bytes, max_batch_bytes)
    wal = max(0, usable - reserve) // segment_bytes * segment_bytes
    if wal < MIN_SEGMENTS * segment_bytes:
        raise BudgetError(
            f"{usable} usable bytes hold no WAL of {MIN_SEGMENTS} segments of {segment_bytes}"
            f" bytes beside a reserve of {reserve} bytes: at least"
            f" {MIN_SEGMENTS * segment_bytes + reserve} usable bytes are needed"
        )
    return VolumeBudget(usable_bytes=usable, reserve_bytes=reserve, wal_bytes=wal)
