"""Background fsync: group commit for ``always``, a timer for ``interval``, nothing for ``never``.

Appends register "tell me when offset X is durable"; one fsync of the active segment covers
every frame written before it started, so all writers waiting meanwhile share it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .config import FsyncPolicy, WalConfig
from .errors import WalFailedError

if TYPE_CHECKING:
    from .log import SyncTarget, WriteAheadLog

DurabilityCallback = Callable[[BaseException | None], None]
log = logging.getLogger(__name__)


class Syncer:
    def __init__(
        self,
        wal: WriteAheadLog,
        config: WalConfig,
        observer: Callable[[float], None] | None,
    ) -> None:
        self._wal = wal
        self._policy = config.fsync
        self._interval_s = config.fsync_interval_ms / 1000
        self._observer = observer
        self._cond = threading.Condition()
        self._waiters: deque[tuple[int, DurabilityCallback]] = deque()
        self._stopping = False
        self._error: BaseException | None = None
        self.durable_offset = wal.next_offset - 1
        self._released: tuple[int, int] = (-1, 0)  # (segment base offset, bytes released)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._policy is FsyncPolicy.NEVER:
            return
        target = self._run_group_commit if self._policy is FsyncPolicy.ALWAYS else self._run_timer
        self._thread = threading.Thread(target=target, name="wal-fsync", daemon=True)
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

    def _run_group_commit(self) -> None:
        while True:
            with self._cond:
                while not self._waiters and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            if not self._sync_once():
                return

    def _run_timer(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._cond.wait(self._interval_s)
                if self._stopping:
                    return
            if not self._sync_once():
                return

    def _sync_once(self) -> bool:
        snapshot = self._wal.snapshot_for_sync()
        fd, target = snapshot.fd, snapshot.last_offset
        try:
            if target > self.durable_offset:
                started = time.perf_counter()
                os.fdatasync(fd)
                if self._observer is not None:
                    self._observer(time.perf_counter() - started)
                self._release_pages(snapshot)
        except OSError as error:
            failure = WalFailedError(f"fsync of the WAL failed: {error}")
            self._wal.mark_failed(failure)
            self._fail_all(failure)
            return False
        finally:
            os.close(fd)
        ready = []
        with self._cond:
            self.durable_offset = max(self.durable_offset, target)
            while self._waiters and self._waiters[0][0] <= target:
                ready.append(self._waiters.popleft()[1])
        for callback in ready:
            callback(None)
        return True

    def _release_pages(self, snapshot: SyncTarget) -> None:
        segment, released = self._released
        if segment != snapshot.segment_base_offset:
            released = 0
        released = self._wal.release_synced_pages(snapshot.fd, snapshot.segment_size, released)
        self._released = (snapshot.segment_base_offset, released)

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            failed = [callback for _, callback in self._waiters]
            self._waiters.clear()
        for callback in failed:
            callback(error)
