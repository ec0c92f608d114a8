"""The agent's volume as ``statvfs`` sees it, and the WAL size limit that fits on it.

Measured once at start (``durable-agent run``), never per append: what a non-root process may
still write (``f_bavail``) plus what the WAL's segments already hold is the ``usable`` figure
of ``durable_producer.volume_budget``, which keeps a reserve beside the WAL for the agent's
other files. A ``--max-buffer-bytes`` above what fits is lowered to fit, with one warning
naming both numbers (``fit_wal_limit``): refusing to start would turn an estimate that was a
little off (the filesystem's overhead varies by type and version; the operator predicts it
from the volume size) into a sidecar crash loop that takes the application's pod with it,
while the lower limit is simply what the volume holds. Only a volume too small for two
segments plus the reserve, even if nothing else were on it, is refused (``VolumeTooSmall``);
one that other files fill gets the room its WAL already holds (at least two segments).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from durable_producer.buffer_agent.volume.format import parse_segment_name
from durable_producer.volume_budget import MIN_SEGMENTS, BudgetError, wal_budget


class VolumeTooSmall(Exception):
    """Not even an empty volume this size holds a WAL of two segments plus the reserve."""


@dataclass(frozen=True, slots=True)
class VolumeSpace:
    free_bytes: int
    """What a non-root process may still write (``f_bavail * f_frsize``)."""
    capacity_bytes: int
    """What a non-root process could write on this filesystem if it were empty."""
    segment_bytes: int
    """Disk space the WAL's segments hold now (freed as they are delivered)."""

    @property
    def usable_bytes(self) -> int:
        return self.free_bytes + self.segment_bytes


@dataclass(frozen=True, slots=True)
class WalLimit:
    max_bytes: int
    """The limit to use."""
    warning: str | None
    """Why it is not the configured one (None: it is)."""


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (a new volume's directories come later)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    stats = os.statvfs(_existing(path))
    return stats.f_bavail * stats.f_frsize


def measure_volume(data_dir: Path, wal_dir: Path) -> VolumeSpace:
    stats = os.statvfs(_existing(data_dir))
    root_only = stats.f_bfree - stats.f_bavail
    held = 0
    if wal_dir.is_dir():
        for entry in os.scandir(wal_dir):
            if parse_segment_name(entry.name) is not None and entry.is_file():
                held += entry.stat().st_blocks * 512
    return VolumeSpace(
        free_bytes=stats.f_bavail * stats.f_frsize,
        capacity_bytes=(stats.f_blocks - root_only) * stats.f_frsize,
        segment_bytes=held,
    )


def fit_wal_limit(
    configured: int, space: VolumeSpace, segment_bytes: int, max_batch_bytes: int
) -> WalLimit:
    """The WAL limit for ``--max-buffer-bytes`` ``configured`` on ``space``.

    Raises :class:`VolumeTooSmall` (with the numbers) if the volume could never hold it.
    """
    usable = space.usable_bytes
    try:
        budget = wal_budget(usable, segment_bytes, max_batch_bytes)
    except BudgetError as error:
        try:
            wal_budget(space.capacity_bytes, segment_bytes, max_batch_bytes)
        except BudgetError:
            raise VolumeTooSmall(
                f"the volume ({space.capacity_bytes} bytes writable) is too small for the"
                f" WAL: {error}. Give the agent a larger volume, or lower --segment-bytes"
                f" ({segment_bytes}) or --max-batch-bytes ({max_batch_bytes})"
            ) from None
        # The room the WAL already holds, at least two segments: what it can count on.
        held = space.segment_bytes // segment_bytes * segment_bytes
        limit = min(configured, max(MIN_SEGMENTS * segment_bytes, held))
        return WalLimit(
            limit,
            f"only {usable} bytes of the volume are free for the WAL ({space.capacity_bytes}"
            f" writable; other files hold the rest, e.g. dead letters or quarantined"
            f" segments): WAL limit {limit} instead of --max-buffer-bytes {configured};"
            " produce requests may meet a full disk until space is freed",
        )
    if configured <= budget.wal_bytes:
        return WalLimit(configured, None)
    return WalLimit(
        budget.wal_bytes,
        f"--max-buffer-bytes {configured} does not fit on the volume ({usable} usable"
        f" bytes, {budget.reserve_bytes} kept free for state, dead letters and quarantine):"
        f" WAL limit {budget.wal_bytes} instead",
    )
