"""Settings of the write-ahead log; the fields marked ``option`` are the agent's flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from durable_producer.buffer_agent.kafka.produce_wire import MAX_TIMEOUT_MS
from durable_producer.buffer_agent.options import (
    non_negative_int,
    option,
    positive_float,
    positive_int,
    values_of,
)
from durable_producer.contract import DEFAULT_FSYNC_POLICY, DEFAULT_FULL_DISK_POLICY

MIB = 1024 * 1024
DEFAULT_MAX_WAL_FRAME_BYTES = 16 * MIB
"""Largest WAL frame payload unless ``--max-batch-bytes`` asks for more
(``settings.wal_frame_limit``).

Not the limit on a Kafka request (``kafka.protocol.DEFAULT_MAX_REQUEST_FRAME_BYTES``)."""
MAX_FSYNC_INTERVAL_MS = 3_600_000
"""``--fsync-interval-ms`` at most: an hour. A longer period means no fsync at all (``never``
says so); one above ~9.2e12 ms overflowed the syncer's wait and ended its thread, so the
agent acknowledged on without any fsync."""


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


def _window_bytes(text: str) -> int | None:
    """``--page-cache-window-bytes``: 0 means no window (caching left to the kernel)."""
    return non_negative_int(text) or None


@dataclass(frozen=True, slots=True)
class WalConfig:
    """Tuning of one WAL directory. ``validate()`` explains any inconsistent combination."""

    segment_bytes: int = field(
        default=64 * MIB,
        metadata=option(
            "size of one WAL segment (space is freed a segment at a time)", parse=positive_int
        ),
    )
    max_bytes: int = field(
        default=1024 * MIB,
        metadata=option(
            "size limit of the WAL; lowered at start, with a warning, to what the volume "
            "holds beside a reserve for the agent's other files",
            flag="--max-buffer-bytes",
            parse=positive_int,
        ),
    )
    max_frame_bytes: int = DEFAULT_MAX_WAL_FRAME_BYTES
    """The agent derives it from ``--max-batch-bytes`` (see ``settings.py``)."""
    fsync: FsyncPolicy = field(
        default=FsyncPolicy(DEFAULT_FSYNC_POLICY),
        metadata=option(
            "always: answer after fsync (group commit); interval: fsync every "
            "--fsync-interval-ms; never: page cache only",
            parse=FsyncPolicy,
            choices=values_of(FsyncPolicy),
        ),
    )
    fsync_interval_ms: int = field(
        default=100,
        metadata=option(
            f"fsync period of the interval policy, at most {MAX_FSYNC_INTERVAL_MS} (an hour)",
            parse=positive_int,
        ),
    )
    full_disk_policy: FullDiskPolicy = field(
        default=FullDiskPolicy(DEFAULT_FULL_DISK_POLICY),
        metadata=option(
            "reject: answer a full buffer with a retriable error at once; "
            "block: wait up to --block-timeout first",
            parse=FullDiskPolicy,
            choices=values_of(FullDiskPolicy),
        ),
    )
    block_timeout_s: float = field(
        default=5.0,
        metadata=option(
            "seconds a produce request waits for space under --full-disk-policy=block (never past"
            f" the request's own timeout less 1 s, so at most {MAX_TIMEOUT_MS / 1000})",
            flag="--block-timeout",
            parse=positive_float,
        ),
    )
    page_cache_window_bytes: int | None = field(
        default=64 * MIB,
        metadata=option(
            "WAL bytes behind the write head kept in the page cache after fsync (the "
            "forwarder's normal read window); older synced data is dropped so a busy agent "
            "reuses memory instead of growing the cache. 0 leaves caching to the kernel",
            parse=_window_bytes,
        ),
    )
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
        if self.fsync_interval_ms > MAX_FSYNC_INTERVAL_MS:
            problems.append(
                f"fsync_interval_ms={self.fsync_interval_ms} is more than an hour: give at most"
                f" {MAX_FSYNC_INTERVAL_MS} (or --fsync never for no fsync at all)"
            )
        if self.page_cache_window_bytes is not None and self.page_cache_window_bytes < 0:
            problems.append(
                f"page_cache_window_bytes={self.page_cache_window_bytes} must not be negative"
            )
        if self.block_timeout_s < 0:
            problems.append(f"block_timeout_s={self.block_timeout_s} must not be negative")
        if int(self.block_timeout_s * 1000) > MAX_TIMEOUT_MS:
            problems.append(
                f"block_timeout_s={self.block_timeout_s:.15g} is longer than any request waits"
                f" (a 32-bit count of milliseconds): give at most {MAX_TIMEOUT_MS / 1000}"
            )
        if problems:
            raise ValueError("invalid WAL configuration: " + "; ".join(problems))
