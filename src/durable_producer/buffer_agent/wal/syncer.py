"""Background fsync: group commit for ``always``, a timer for ``interval``, nothing for ``never``.

Appends register "tell me when offset X is durable"; one fsync of the active segment covers
every frame written before it started, so all writers waiting meanwhile share it. The syncer
knows the log only through two callbacks: one saying what an fsync started now would cover
(:class:`SyncTarget`), one reporting that an fsync failed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .config import FsyncPolicy, WalConfig
from .errors import WalFailedError
from .segment import Segment

DurabilityCallback = Callable[[BaseException | None], None]
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncTarget:
    """The active segment as an fsync started now would cover it."""

    fd: int
    """A duplicate descriptor of the segment (valid even if it is sealed meanwhile); the
    syncer closes it."""
    last_offset: int
    """The newest frame written; durable once the fsync completes."""
    segment: Segment
    size: int
    """The segment's size when the target was taken: what the fsync covers."""


class Syncer:
    def __init__(
        self,
        config: WalConfig,
        *,
        durable_offset: int,
        target: Callable[[], SyncTarget],
        on_failure: Callable[[WalFailedError], None],
        observer: Callable[[float], None] | None,
    ) -> None:
        """``target`` is called (from the syncer thread) before every fsync; ``on_failure``
        when an fsync failed (the log must stop accepting); ``observer`` gets each fsync's
        duration in seconds."""
        self._target = target
        self._on_failure = on_failure
        self._policy = config.fsync
        self._interval_s = config.fsync_interval_ms / 1000
        self._observer = observer
        self._cond = threading.Condition()
        self._waiters: deque[tuple[int, DurabilityCallback]] = deque()
        self._stopping = False
        self._error: BaseException | None = None
        self.durable_offset = durable_offset
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._policy is FsyncPolicy.NEVER:
            return
        self._thread = threading.Thread(target=self._run, name="wal-fsync", daemon=True)
        self._thread.start()

    def register(self, offset: int, callback: DurabilityCallback) -> None:
        """Call ``callback`` once ``offset`` is durable (only ``always`` waits for it)."""
        if self._policy is not FsyncPolicy.ALWAYS:
            return
        with self._cond:
            if self._error is not None:
                callback(self._error)
                return
            if offset <= self.durable_offset:
                callback(None)
                return
            self._waiters.append((offset, callback))
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread after a final fsync, so a clean shutdown loses nothing written."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._error is None:
            self._sync_once()

    def abandon(self) -> None:
        """Let the thread end without a final fsync and without waiting for it (the log
        replaces a syncer that failed; it may call this holding the lock ``target`` takes)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _run(self) -> None:
        """The thread: any error that ends it fails the log as a failed fsync does, so the log
        never acknowledges on (``interval``) or leaves appends waiting (``always``) without one."""
        try:
            if self._policy is FsyncPolicy.ALWAYS:
                self._run_group_commit()
            else:
                self._run_timer()
        except Exception as error:  # a bug, reported as the log's failure
            log.exception("the WAL's fsync thread failed")
            self._failed(error)

    def _run_group_commit(self) -> None:
        while True:
            with self._cond:
                while not self._waiters and not self._stopping and self._error is None:
                    self._cond.wait()
                if self._stopping or self._error is not None:
                    return
            if not self._sync_once():
                return

    def _run_timer(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._cond.wait(self._interval_s)
                if self._stopping or self._error is not None:
                    return
            if not self._sync_once():
                return

    def _sync_once(self) -> bool:
        try:
            target = self._target()
        except OSError as error:
            return self._failed(error)
        try:
            if target.last_offset > self.durable_offset:
                started = time.perf_counter()
                os.fdatasync(target.fd)
                if self._observer is not None:
                    self._observer(time.perf_counter() - started)
                target.segment.release_synced_pages(target.fd, target.size)
        except OSError as error:
            return self._failed(error)
        finally:
            os.close(target.fd)
        ready = []
        with self._cond:
            if self._error is not None:  # the log failed meanwhile: nothing is acknowledged
                return False
            self.durable_offset = max(self.durable_offset, target.last_offset)
            while self._waiters and self._waiters[0][0] <= target.last_offset:
                ready.append(self._waiters.popleft()[1])
        for callback in ready:
            callback(None)
        return True

    def _failed(self, error: Exception) -> bool:
        if isinstance(error, OSError):
            failure = WalFailedError(f"fsync of the WAL failed: {error}")
        else:
            failure = WalFailedError(f"the WAL's fsync thread failed: {error!r}")
        self._on_failure(failure)
        self.fail(failure)
        return False

    def fail(self, failure: BaseException) -> None:
        """Durability is unknown (an fsync failed here or elsewhere in the log): every append
        waiting, and every later one, gets ``failure``; the thread ends."""
        with self._cond:
            if self._error is None:
                self._error = failure
            failed = [callback for _, callback in self._waiters]
            self._waiters.clear()
            self._cond.notify_all()
        for callback in failed:
            callback(failure)
