"""The write-ahead log: segmented, append-only, one write per appended group of frames.

``WriteAheadLog`` coordinates: it assigns offsets, keeps the size limit, has groups of frames
written to its segments (``segment_list.py``, ``segment.py``), moves the checkpoint and drops
delivered segments, runs the syncer, stops acknowledging after an I/O failure and reopens once
its frames are delivered (``health.py``), and lets readers (``reader.py``) see and wait for new
frames. The files it writes are described in ``volume/format.py``.

Thread-safe. Writers append under one lock (offsets are assigned there); durability waits and
fsyncs happen outside it (see ``syncer.py``), so concurrent appends share fsyncs (group commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from durable_producer.buffer_agent.volume.format import LOG_ID_FILE

from .checkpoint import CheckpointFile
from .config import FsyncPolicy, FullDiskPolicy, WalConfig
from .errors import WalClosedError, WalError, WalFailedError, WalFullError
from .frame import AppendItem, PreparedFrame, encoded_size, prepare_frames
from .health import DISK_FULL_ERRNOS, LogHealth
from .log_id import LogId, open_log_id
from .reader import WalReader
from .recovery.lock import DirectoryLock
from .recovery.repair import recover_log
from .segment import Segment, SegmentPolicy, SegmentView
from .segment_list import SegmentList
from .stats import RecordBacklog, WalStats
from .syncer import DurabilityCallback, Syncer, SyncTarget

log = logging.getLogger(__name__)

OFFLOAD_WRITE_BYTES = 64 * 1024
"""``append_many_async`` writes groups at least this large on the WAL's writer thread.

Copying a large group into the page cache is the biggest single cost of ingest; done on the
writer thread (``pwritev`` releases the GIL) it overlaps with the event loop receiving the
next requests, so ingest uses a second core. Smaller groups are written inline: for them the
thread hand-over would cost more latency than the copy."""


class WriteAheadLog:
    """Open with ``WriteAheadLog.open(directory, config)``; close with ``close()`` (or ``with``)."""

    # ----------------------------------------------------------------- opening and closing
    def __init__(
        self,
        directory: Path,
        config: WalConfig,
        lock: DirectoryLock,
        fsync_observer: Callable[[float], None] | None = None,
    ) -> None:
        """Use :meth:`open`: recovers ``directory`` (held by ``lock``) and starts the syncer."""
        self.directory = directory
        self.config = config
        self._dir_lock = lock
        self._lock = threading.Lock()
        self._data_available = threading.Condition(self._lock)
        self._space_available = threading.Condition(self._lock)
        self._space_watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        """Async ``block`` waits (``_wait_for_space_async``), woken with the condition."""
        self._append_watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        """Event loops waiting for the next append (``watch_appends``), woken with it."""
        self._checkpoint_lock = threading.Lock()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-writer")
        self._closed = False
        self._health = LogHealth(directory)
        self._fsync_observer = fsync_observer
        had_id = os.path.lexists(directory / LOG_ID_FILE)  # recovery may move it aside
        opened = recover_log(directory, config.fsync)
        self.recovery = opened.summary  # what opening found, for metrics
        result = opened.result
        self.log_id: LogId = open_log_id(
            directory, holds_frames=result.next_offset > 0, had_entry=had_id
        )
        """Names this log to the marks kept outside it (``log_id.py``)."""
        policy = SegmentPolicy(
            sync=config.fsync is not FsyncPolicy.NEVER,
            page_cache_window=config.page_cache_window_bytes,
        )
        recovered = [Segment(s.base_offset, s.path, s.size, policy) for s in result.segments]
        self._next_offset = result.next_offset
        newest_frame = max(
            (
                first + frames - 1
                for segment in result.segments
                for first, frames, _ in segment.record_runs
            ),
            default=-1,
        )
        self._frames_end = max(newest_frame + 1, opened.checkpoint)
        self._truncated_on_open = result.truncated_bytes
        self._quarantined = opened.quarantined_segments
        self._checkpoint_offset = opened.checkpoint
        self._backlog = RecordBacklog(
            (run for segment in result.segments for run in segment.record_runs),
            opened.checkpoint,
        )
        self._checkpoint_file = CheckpointFile(directory)
        self._segments = SegmentList.resume(
            directory, config.segment_bytes, policy, recovered, self._next_offset
        )
        if policy.sync and recovered:
            self._make_recovered_durable()
        self._syncer = self._start_syncer()
        log.info(
            "opened WAL %s: %d segments, %d bytes, checkpoint %d, next offset %d, policy %s",
            directory,
            len(self._segments),
            self._segments.size_bytes,
            self._checkpoint_offset,
            self._next_offset,
            config.fsync,
        )

    def _make_recovered_durable(self) -> None:
        """The syncer starts with every recovered frame counted durable: make that true."""
        try:
            self._segments.make_durable()
        except OSError as error:
            self._segments.close()
            raise WalError(
                f"could not fsync the recovered WAL in {self.directory} ({error}); its frames"
                " may not be on disk, so none can be acknowledged: check the volume"
            ) from error

    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: WalConfig | None = None,
        *,
        fsync_observer: Callable[[float], None] | None = None,
    ) -> WriteAheadLog:
        """Lock ``directory``, recover it (truncate torn tails, quarantine corruption), and open.

        ``fsync_observer`` receives the duration of every fsync in seconds (for a histogram).
        """
        config = config or WalConfig()
        config.validate()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock(directory)
        lock.acquire()
        try:
            return cls(directory, config, lock, fsync_observer)
        except BaseException:
            lock.release()
            raise

    def close(self) -> None:
        """Flush everything written to disk, stop background work, release the directory lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._appended_locked()
            self._space_freed_locked()
        self._writer.shutdown(wait=True)  # queued writes fail fast: the log is closed
        self._syncer.stop()
        self._segments.close()
        self._checkpoint_file.close()
        self._dir_lock.release()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- appending
    def append(self, topic: str, partition: int, payload: bytes, record_count: int = 0) -> int:
        return self.append_many([AppendItem(topic, partition, payload, record_count)])[0]

    def append_many(self, items: Sequence[AppendItem]) -> list[int]:
        """Append frames with one write; return their offsets once the fsync policy is met."""
        done = threading.Event()
        failure: list[BaseException] = []

        def on_durable(error: BaseException | None) -> None:
            if error is not None:
                failure.append(error)
            done.set()

        offsets = self._append(items, on_durable, blocking=True)
        if self.config.fsync is FsyncPolicy.ALWAYS:
            done.wait()
            if failure:
                raise failure[0]
        return offsets

    async def append_many_async(
        self, items: Sequence[AppendItem], *, wait_s: float | None = None
    ) -> list[int]:
        """As ``append_many``, for asyncio: fsync and ``block`` waits leave the loop free.

        ``wait_s`` shortens the ``block`` wait for this call (a Produce request's own
        timeout); ``block_timeout_s`` bounds it.

        Groups of :data:`OFFLOAD_WRITE_BYTES` or more are written on the writer thread; the
        payloads must not change until this returns (ingest hands in views of receive
        buffers that nothing else writes to).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def resolve(error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        def on_durable(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(resolve, error)

        def append() -> list[int]:
            return self._append(items, on_durable, blocking=False)

        offload = sum(len(item.payload) for item in items) >= OFFLOAD_WRITE_BYTES

        async def write() -> list[int]:
            return await loop.run_in_executor(self._writer, append) if offload else append()

        try:
            offsets = await write()
        except WalFullError:
            if self.config.full_disk_policy is not FullDiskPolicy.BLOCK:
                raise
            timeout = self.config.block_timeout_s
            if wait_s is not None:
                timeout = max(0.0, min(timeout, wait_s))
            await self._wait_for_space_async(self._frames_size(items), timeout)
            offsets = await write()
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await future
        return offsets

    def append_may_wait(self, items: Sequence[AppendItem]) -> bool:
        """Whether ``append_many_async(items)`` may pause (writer thread, fsync or ``block``
        wait); if not, it runs to its end in one step of the event loop."""
        return (
            self.config.fsync is FsyncPolicy.ALWAYS
            or self.config.full_disk_policy is FullDiskPolicy.BLOCK
            or sum(len(item.payload) for item in items) >= OFFLOAD_WRITE_BYTES
        )

    def _frames_size(self, items: Sequence[AppendItem]) -> int:
        return sum(encoded_size(item.topic.encode(), len(item.payload)) for item in items)

    def _append(
        self, items: Sequence[AppendItem], on_durable: DurabilityCallback, *, blocking: bool
    ) -> list[int]:
        if not items:
            return []
        now_ms = time.time_ns() // 1_000_000
        prepared = prepare_frames(items, self.config.max_frame_bytes)
        with self._lock:
            self._check_open()
            needed = self._segments.needed_bytes(size for *_, size in prepared)
            if self._segments.size_bytes + needed > self.config.max_bytes:
                if not blocking or self.config.full_disk_policy is FullDiskPolicy.REJECT:
                    raise self._full_error(needed)
                self._wait_for_space_locked(needed, self.config.block_timeout_s)
                self._check_open()
            offsets = self._write_locked(prepared, now_ms)
            if self._health.refusing is not None:
                self._health.refusing = None
            self._syncer.register(offsets[-1], on_durable)
            self._appended_locked()
        return offsets

    def _full_error(self, needed: int) -> WalFullError:
        return self._health.limit_error(self._segments.size_bytes, self.config.max_bytes, needed)

    async def _wait_for_space_async(self, needed: int, timeout: float) -> None:
        """Wait in the event loop (no thread held) until ``needed`` bytes fit or ``timeout``
        passes (then ``WalFullError``). Woken by the checkpoint that frees segments."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                if self._segments.size_bytes + needed <= self.config.max_bytes:
                    return
                if self._closed:
                    raise self._full_error(needed)
                woken: asyncio.Future[None] = loop.create_future()
                watcher = (loop, woken)
                self._space_watchers.append(watcher)
            try:
                async with asyncio.timeout_at(deadline):
                    await woken
            except TimeoutError:
                with self._lock:
                    if self._segments.size_bytes + needed <= self.config.max_bytes:
                        return
                    raise self._full_error(needed) from None
            finally:
                with self._lock:
                    if watcher in self._space_watchers:
                        self._space_watchers.remove(watcher)

    def _space_freed_locked(self) -> None:
        """Wake every wait for space, threads and event loops (segments deleted, closed)."""
        self._space_available.notify_all()
        watchers, self._space_watchers = self._space_watchers, []
        for loop, woken in watchers:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, woken)

    def _wait_for_space_locked(self, needed: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._segments.size_bytes + needed > self.config.max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                raise self._full_error(needed)
            self._space_available.wait(remaining)

    def _check_open(self) -> None:
        if self._closed:
            raise WalClosedError(f"WAL {self.directory} is closed (agent shutting down)")
        health = self._health
        if health.failure is not None:
            if health.may_reopen(self._checkpoint_offset, from_append=True):
                self._reopen_locked()
            if health.failure is not None:
                raise health.failed_error()

    def _write_locked(self, prepared: list[PreparedFrame], now_ms: int) -> list[int]:
        """Write the group (one pwritev per segment touched); roll it all back on failure.

        A failed write is rolled back and refused; a failed fsync of a sealed segment (or a
        roll-back that fails) stops the log (``health.py``).
        """
        segments = self._segments
        first_offset = self._next_offset
        mark = segments.mark()
        try:
            segments.write(prepared, first_offset, now_ms)
        except (OSError, WalFailedError) as error:
            try:
                segments.roll_back(mark)
            except OSError as rollback_error:
                self._fail_locked(rollback_error, "a failed write could not be rolled back")
                raise self._health.failed_error() from error
            if isinstance(error, WalFailedError):
                self._fail_locked(error, "a sealed segment could not be synced")
                raise self._health.failed_error() from error
            if error.errno in DISK_FULL_ERRNOS:
                raise self._health.disk_full_error(error) from error
            raise WalError(f"write to {segments.active.path} failed: {error}") from error
        self._next_offset = self._frames_end = first_offset + len(prepared)
        self._backlog.add(first_offset, prepared)
        return list(range(first_offset, self._next_offset))

    # ----------------------------------------------------------------- reading
    # What readers (``WalReader``) call: segment views, waits for data, new readers.
    def reader(self, from_offset: int | None = None) -> WalReader:
        """A tail-following reader of frames at or above ``from_offset`` (default: checkpoint)."""
        start = self._checkpoint_offset if from_offset is None else from_offset
        return WalReader(self, start)

    def segment_views(self) -> list[SegmentView]:
        """The segments as a reader may read them now, oldest first (the last one not sealed)."""
        with self._lock:
            return self._segments.views()

    def wait_for_data(self, segment_base: int | None, position: int, timeout: float) -> None:
        """Block until a reader that has read segment ``segment_base`` up to byte ``position``
        has more to read, the log closes, :meth:`wake_waiters` is called, or ``timeout``
        seconds pass (whichever comes first).

        More to read: that segment grew past ``position`` or a newer segment exists (or it is
        gone, deleted by a checkpoint). ``segment_base`` None (nothing read yet) waits for the
        first frame of any segment.
        """
        with self._data_available:
            if not self._closed and not self._segments.has_data_past(segment_base, position):
                self._data_available.wait(timeout)

    def wait_for_append(self, appended_before: int, timeout: float) -> None:
        """Block until a frame at or above ``appended_before`` is appended, the log closes,
        :meth:`wake_waiters` is called, or ``timeout`` seconds pass (whichever comes first)."""
        with self._data_available:
            if self._next_offset == appended_before and not self._closed:
                self._data_available.wait(timeout)

    def wake_waiters(self) -> None:
        """Wake every thread blocked in :meth:`wait_for_append` or :meth:`wait_for_data`, and
        every future of :meth:`watch_appends`."""
        with self._data_available:
            self._appended_locked()

    def watch_appends(self, appended_before: int) -> asyncio.Future[None] | None:
        """A future of the running event loop, done once a frame at or above
        ``appended_before`` is appended, the log closes or :meth:`wake_waiters` is called (no
        thread held meanwhile); None when one is already there, or the log is closed. Hand it
        back with :meth:`unwatch_appends` once done waiting."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._next_offset != appended_before or self._closed:
                return None
            appended: asyncio.Future[None] = loop.create_future()
            self._append_watchers.append((loop, appended))
        return appended

    def unwatch_appends(self, appended: asyncio.Future[None]) -> None:
        with self._lock:
            self._append_watchers = [w for w in self._append_watchers if w[1] is not appended]

    def _appended_locked(self) -> None:
        """Wake every wait for data, threads and event loops (appended, closed, woken)."""
        self._data_available.notify_all()
        if self._append_watchers:
            watchers, self._append_watchers = self._append_watchers, []
            for loop, appended in watchers:
                with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                    loop.call_soon_threadsafe(_wake, appended)

    @property
    def closed(self) -> bool:
        return self._closed

    # ----------------------------------------------------------------- checkpointing
    def checkpoint(self, offset: int) -> None:
        """Record that every frame below ``offset`` is delivered; delete segments wholly below it.

        Monotonic: a lower offset than the current checkpoint is ignored. Works while appends
        are refused (full disk, failed log): nothing it does allocates a block. Raises
        ``WalError`` if the checkpoint could not be written; nothing is deleted then, and a
        later call tries again.
        """
        with self._checkpoint_lock:
            with self._lock:
                if self._closed:
                    raise WalClosedError(f"WAL {self.directory} is closed")
                if offset > self._next_offset:
                    raise ValueError(
                        f"checkpoint {offset} is beyond the next WAL offset {self._next_offset}"
                    )
                if offset <= self._checkpoint_offset:
                    return
            try:
                self._checkpoint_file.write(offset)
            except OSError as error:
                raise WalError(
                    f"could not write checkpoint {offset} in {self.directory} ({error}); the"
                    " delivered segments are kept until a later checkpoint succeeds"
                ) from error
            with self._lock:
                self._checkpoint_offset = offset
                self._backlog.forget_below(offset)
                doomed = self._segments.drop_delivered(offset)
                if doomed:
                    self._space_freed_locked()
            self._delete(doomed)
            with self._lock:
                if self._health.may_reopen(offset, from_append=False):
                    self._reopen_locked()

    def _delete(self, segments: list[Segment]) -> None:
        for segment in segments:
            try:
                segment.delete()
            except OSError as error:  # the next open removes segments below the checkpoint
                log.warning("could not delete delivered segment %s: %s", segment.path, error)

    @property
    def checkpoint_offset(self) -> int:
        return self._checkpoint_offset

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def frames_end(self) -> int:
        """One past the newest frame the log holds: ``next_offset``, unless recovery found the
        newest offsets lost (they are never reused, but no frame will ever settle them); what
        "everything forwarded" means (a drain's target)."""
        return self._frames_end

    # ----------------------------------------------------------------- health and figures
    def _sync_target(self) -> SyncTarget:
        """For the syncer: what an fsync started now would cover."""
        with self._lock:
            active = self._segments.active
            return SyncTarget(active.duplicate_fd(), self._next_offset - 1, active, active.size)

    def _start_syncer(self) -> Syncer:
        syncer = Syncer(
            self.config,
            durable_offset=self._next_offset - 1,
            target=self._sync_target,
            on_failure=self._fail,
            observer=self._fsync_observer,
        )
        syncer.start()
        return syncer

    def _fail(self, error: BaseException) -> None:
        """The syncer's fsync failed (called on its thread)."""
        with self._lock:
            self._fail_locked(error, "fsync failed")

    def _fail_locked(self, error: BaseException, what: str) -> None:
        if self._health.fail(error, self._next_offset):
            log.critical("WAL %s: %s (%s); %s", self.directory, what, error, self._health)
        self._syncer.fail(self._health.failed_error())

    def _reopen_locked(self) -> None:
        """After a failure whose frames are all delivered: continue in a fresh segment."""
        try:
            self._segments.restart_after_failure(self._next_offset)
        except OSError as error:
            log.warning("WAL %s: cannot start a new segment yet: %s", self.directory, error)
            return
        self._delete(self._segments.drop_delivered(self._checkpoint_offset))
        self._syncer.abandon()
        self._syncer = self._start_syncer()
        self._health.reopened()
        self._space_freed_locked()
        log.warning(
            "WAL %s: all written before the I/O failure is in Kafka; accepting again in a new"
            " segment at offset %d",
            self.directory,
            self._next_offset,
        )

    @property
    def healthy(self) -> bool:
        """True while appends can succeed (open, no I/O failure)."""
        return not self._closed and self._health.failure is None

    @property
    def refusing(self) -> str | None:
        """Why the latest append was refused (``health.Refusal``); None once one succeeds."""
        refusal = self._health.refusing
        return None if refusal is None else str(refusal)

    def stats(self) -> WalStats:
        with self._lock:
            return WalStats(
                size_bytes=self._segments.size_bytes,
                max_bytes=self.config.max_bytes,
                segment_count=len(self._segments),
                checkpoint_offset=self._checkpoint_offset,
                next_offset=self._next_offset,
                durable_offset=self._syncer.durable_offset,
                quarantined_segments=self._quarantined,
                truncated_bytes_on_open=self._truncated_on_open,
                backlog_records=self._backlog.records,
                refusing=self.refusing,
            )


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
