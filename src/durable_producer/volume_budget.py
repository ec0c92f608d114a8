"""How a buffer volume's bytes are spent: one function for the operator and the agent.

The operator sizes a volume and tells its agent the WAL's size limit; the agent measures the
filesystem it was given and bounds the WAL below it. Both ask this module, so they cannot
disagree:

    usable   = what the filesystem lets the (non-root) agent write: the volume minus the
               filesystem's own overhead (metadata, journal, blocks reserved for root)
    reserve  = what the agent keeps free beside the WAL: checkpoint, forwarder hint,
               producer-state snapshot, metadata cache, dead letters, quarantine records
    wal      = usable - reserve, rounded down to whole segments, at least two segments

Pure: no I/O, no imports from the rest of the package (import-linter keeps it that way).

STATUS: first numbers; the data-path issue measures the filesystem overhead (ext4, xfs) and
the reserve and replaces the estimates below with measured ones.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

MIN_SEGMENTS = 2
"""The WAL frees space a whole segment at a time: it needs the active one and one to delete."""

STATE_RESERVE_BYTES = 16 * MIB
"""Checkpoint, forwarder hint, producer state, metadata cache (estimate; see STATUS)."""


@dataclass(frozen=True, slots=True)
class VolumeBudget:
    """How a volume's usable bytes are split between the WAL and everything else."""

    usable_bytes: int
    reserve_bytes: int
    wal_bytes: int


class BudgetError(ValueError):
    """The volume is too small to hold a WAL of two segments plus the reserve."""


def filesystem_overhead_bytes(volume_bytes: int) -> int:
    """Bytes of a freshly made filesystem of ``volume_bytes`` the agent cannot use (estimate)."""
    return volume_bytes * 7 // 100 + 64 * MIB


def usable_bytes(volume_bytes: int) -> int:
    """What the agent can write on a new volume of ``volume_bytes`` (the operator's view)."""
    return max(0, volume_bytes - filesystem_overhead_bytes(volume_bytes))


def reserve_bytes(segment_bytes: int, max_batch_bytes: int) -> int:
    """Space kept free beside the WAL for the agent's other files."""
    return STATE_RESERVE_BYTES + 2 * max_batch_bytes


def wal_budget(usable: int, segment_bytes: int, max_batch_bytes: int) -> VolumeBudget:
    """Split ``usable`` bytes; raise :class:`BudgetError` (numbers in the message) if too small."""
    reserve = reserve_bytes(segment_bytes, max_batch_bytes)
    wal = (usable - reserve) // segment_bytes * segment_bytes
    if wal < MIN_SEGMENTS * segment_bytes:
        raise BudgetError(
            f"{usable} usable bytes hold no WAL of {MIN_SEGMENTS} segments of {segment_bytes}"
            f" bytes beside a reserve of {reserve} bytes: at least"
            f" {MIN_SEGMENTS * segment_bytes + reserve} usable bytes are needed"
        )
    return VolumeBudget(usable_bytes=usable, reserve_bytes=reserve, wal_bytes=wal)
