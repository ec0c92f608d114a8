"""Whether the log accepts appends, and why not: full, disk full, or stopped by an I/O failure.

Three reasons refuse an append, each with a retriable error (nothing of the refused group is
kept):

- ``buffer_limit``: the segments would exceed ``max_bytes`` (``WalFullError``). Space returns
  when the checkpoint deletes delivered segments.
- ``disk_full``: the filesystem said ENOSPC/EDQUOT. The partial write was rolled back; the
  next append simply tries again (no ``statvfs`` per append), so accepting resumes by itself
  as soon as anything frees space.
- ``wal_failed``: an fsync failed (or a failed write could not be rolled back). After a
  failed fsync Linux may have dropped the dirty pages and marked them clean, so whether
  anything written since the last good fsync is on disk is unknowable, and a later fsync of
  the same file may succeed without making it durable. The log stops acknowledging at once
  (``WalFailedError``) but keeps serving reads, so the forwarder delivers what was written
  (from the page cache). Once the checkpoint reaches the offset the failure happened at,
  nothing on disk is needed any more: the log closes the failed file, starts a new segment
  after it and accepts again, in process, with no restart (see ``WriteAheadLog``).

``refusing`` is the reason the latest append was refused, cleared by the next one that
succeeds: what the agent publishes as its full/failed state.
"""

from __future__ import annotations

import errno
import os
import time
from enum import StrEnum
from pathlib import Path

from .errors import WalFailedError, WalFullError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
REOPEN_RETRY_S = 1.0
"""Least time between two attempts to reopen a failed log from the append path."""


class Refusal(StrEnum):
    BUFFER_LIMIT = "buffer_limit"
    DISK_FULL = "disk_full"
    WAL_FAILED = "wal_failed"


class LogHealth:
    """The refusal state of one log. Not thread-safe: the log's lock guards it."""

    __slots__ = ("_directory", "_last_reopen_attempt", "failed_below", "failure", "refusing")

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self.refusing: Refusal | None = None
        self.failure: BaseException | None = None
        """The I/O failure that stopped appends (None: appends may succeed)."""
        self.failed_below = 0
        """The log's next offset when it failed: once the checkpoint reaches it, every frame
        whose durability is in doubt has been delivered."""
        self._last_reopen_attempt = 0.0

    # ----------------------------------------------------------------- failure
    def fail(self, error: BaseException, next_offset: int) -> bool:
        """Record an I/O failure; False if the log had already failed."""
        self.refusing = Refusal.WAL_FAILED
        if self.failure is not None:
            return False
        self.failure = error
        self.failed_below = next_offset
        return True

    def may_reopen(self, checkpoint: int, *, from_append: bool) -> bool:
        """The log failed and everything written before the failure is delivered (the append
        path tries at most every :data:`REOPEN_RETRY_S`)."""
        if self.failure is None or checkpoint < self.failed_below:
            return False
        if from_append:
            now = time.monotonic()
            if now - self._last_reopen_attempt < REOPEN_RETRY_S:
                return False
            self._last_reopen_attempt = now
        return True

    def reopened(self) -> None:
        self.failure = None
        self.refusing = None

    def __str__(self) -> str:
        if self.failure is None:
            return "accepting"
        return (
            "no longer acknowledging appends; forwarding what was written, accepting again"
            f" once everything below offset {self.failed_below} is in Kafka"
        )

    def failed_error(self) -> WalFailedError:
        self.refusing = Refusal.WAL_FAILED
        return WalFailedError(
            f"WAL {self._directory} stopped accepting after an I/O failure ({self.failure}):"
            " what was written since the last good fsync may not be on disk. It accepts again"
            f" by itself once everything below offset {self.failed_below} has reached Kafka;"
            " retry later"
        )

    # ----------------------------------------------------------------- full
    def limit_error(self, size: int, max_bytes: int, needed: int) -> WalFullError:
        self.refusing = Refusal.BUFFER_LIMIT
        return WalFullError(
            f"WAL {self._directory} is full: {size} of {max_bytes} bytes used, {needed} more"
            " needed. Records are retained until Kafka acknowledges them; retry later (the"
            " client's retries back off) or give the buffer a larger volume"
        )

    def disk_full_error(self, error: OSError) -> WalFullError:
        self.refusing = Refusal.DISK_FULL
        return WalFullError(
            f"the disk under {self._directory} is full ({os.strerror(error.errno or 0)}); the"
            " partial write was rolled back, nothing earlier is affected. Retry later or free"
            " space on the volume"
        )
