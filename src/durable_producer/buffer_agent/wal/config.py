"""Settings of the write-ahead log."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MIB = 1024 * 1024


class FsyncPolicy(StrEnum):
    """When appended frames are forced to stable storage.

    ``always``: an append returns only after an fsync that covers it (group commit: concurrent
    appends share one fsync). ``interval``: a background fsync every ``fsync_interval_ms``; a crash
    loses at most that window. ``never``: page cache only; survives agent crashes, not node crashes.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class FullDiskPolicy(StrEnum):
    """What an append does when the log is at its size limit: fail at once, or wait for space."""

    REJECT = "reject"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class WalConfig:
    """Tuning of one WAL directory. ``validate()`` explains any inconsistent combination."""

    segment_bytes: int = 64 * MIB
    max_bytes: int = 1024 * MIB
    max_frame_bytes: int = 16 * MIB
    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_ms: int = 100
    full_disk_policy: FullDiskPolicy = FullDiskPolicy.REJECT
    block_timeout_s: float = 5.0
    page_cache_window_bytes: int | None = 64 * MIB
    """Synced data further than this behind the write head leaves the page cache.

    After each fsync (and at segment rotation) older bytes are dropped with
    ``posix_fadvise(DONTNEED)``: the forwarder normally reads frames within moments of their
    append, so the window covers it, and a busy agent keeps reusing the same memory instead
    of growing the page cache. On VMs that hand freed guest memory back to the host, touching
    fresh pages for every write made page-cache copies several times dearer (seen here: 2.5 ns
    instead of 0.25 ns a byte). A forwarder that falls further behind reads from disk. ``None``
    leaves caching entirely to the kernel."""

    def validate(self) -> None:
        problems = []
        if self.segment_bytes < 4096:
            problems.append(f"segment_bytes={self.segment_bytes} is below the minimum of 4096")
        if self.max_frame_bytes > self.segment_bytes:
            problems.append(
                f"max_frame_bytes={self.max_frame_bytes} exceeds segment_bytes="
                f"{self.segment_bytes}: a frame must fit in one segment"
            )
        if self.max_bytes < 2 * self.segment_bytes:
            problems.append(
                f"max_bytes={self.max_bytes} must be at least two segments "
                f"(2 x {self.segment_bytes}); space is freed a whole segment at a time"
            )
        if self.fsync_interval_ms <= 0:
            problems.append(f"fsync_interval_ms={self.fsync_interval_ms} must be positive")
        if self.page_cache_window_bytes is not None and self.page_cache_window_bytes < 0:
            problems.append(
                f"page_cache_window_bytes={self.page_cache_window_bytes} must not be negative"
            )
        if self.block_timeout_s < 0:
            problems.append(f"block_timeout_s={self.block_timeout_s} must not be negative")
        if problems:
            raise ValueError("invalid WAL configuration: " + "; ".join(problems))
