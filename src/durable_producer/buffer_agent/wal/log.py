"""The write-ahead log: segmented, append-only, one write per appended group of frames.

Thread-safe. Writers append under one lock (offsets are assigned there); durability waits and
fsyncs happen outside it (see ``syncer.py``), so concurrent appends share fsyncs (group commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from .atomic_file import fsync_directory
from .checkpoint import CheckpointFile, read_checkpoint
from .config import FsyncPolicy, FullDiskPolicy, WalConfig
from .errors import (
    FrameTooLargeError,
    WalClosedError,
    WalError,
    WalFailedError,
    WalFullError,
)
from .frame import AppendItem, encode_frame_header, encoded_size
from .lock import DirectoryLock
from .reader import WalReader
from .recovery import quarantine_count, recover
from .segment import SEGMENT_HEADER_SIZE, encode_segment_header, segment_name
from .syncer import DurabilityCallback, Syncer

log = logging.getLogger(__name__)

_IOV_MAX = 1024
OFFLOAD_WRITE_BYTES = 64 * 1024
"""``append_many_async`` writes groups at least this large on the WAL's writer thread.

Copying a large group into the page cache is the biggest single cost of ingest; done on the
writer thread (``pwritev`` releases the GIL) it overlaps with the event loop receiving the
next requests, so ingest uses a second core. Smaller groups are written inline: for them the
thread hand-over would cost more latency than the copy."""
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    size: int


@dataclass(frozen=True, slots=True)
class WalStats:
    """A snapshot for metrics and ``durable-agent wal inspect``."""

    size_bytes: int
    max_bytes: int
    segment_count: int
    checkpoint_offset: int
    next_offset: int
    durable_offset: int
    quarantined_segments: int
    truncated_bytes_on_open: int
    backlog_records: int
    """Records in frames at or above the checkpoint (from the frames' record counts)."""

    @property
    def backlog_frames(self) -> int:
        """Frames appended but not yet checkpointed (an upper bound if quarantine left gaps)."""
        return self.next_offset - self.checkpoint_offset

    @property
    def free_bytes(self) -> int:
        return max(0, self.max_bytes - self.size_bytes)


@dataclass(frozen=True, slots=True)
class SyncTarget:
    """The active segment as an fsync started now would cover it."""

    fd: int
    last_offset: int
    segment_base_offset: int
    segment_size: int


@dataclass(frozen=True, slots=True)
class SegmentView:
    """What a reader may read of one segment: bytes up to ``visible_end`` are complete frames."""

    base_offset: int
    path: Path
    visible_end: int
    sealed: bool


class WriteAheadLog:
    """Open with ``WriteAheadLog.open(directory, config)``; close with ``close()`` (or ``with``)."""

    def __init__(self, directory: Path, config: WalConfig, lock: DirectoryLock) -> None:
        self.directory = directory
        self.config = config
        self._dir_lock = lock
        self._lock = threading.Lock()
        self.data_available = threading.Condition(self._lock)
        self._space_available = threading.Condition(self._lock)
        self._checkpoint_lock = threading.Lock()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-writer")
        self._segments: list[Segment] = []
        self._active_fd = -1
        self._next_offset = 0
        self._size_bytes = 0
        self._checkpoint_offset = 0
        self._closed = False
        self._failure: BaseException | None = None
        self._quarantined = 0
        self._truncated_on_open = 0
        self._syncer: Syncer | None = None
        self._frame_records: deque[tuple[int, int]] = deque()
        self._backlog_records = 0
        self._checkpoint_file: CheckpointFile | None = None

    # ----------------------------------------------------------------- opening and closing
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
        wal = cls(directory, config, lock)
        try:
            wal._recover_and_start(fsync_observer)
        except BaseException:
            lock.release()
            raise
        return wal

    def _recover_and_start(self, fsync_observer: Callable[[float], None] | None) -> None:
        checkpoint = read_checkpoint(self.directory)
        result = recover(self.directory, checkpoint)
        self._segments = [Segment(s.base_offset, s.path, s.size) for s in result.segments]
        self._next_offset = result.next_offset
        self._truncated_on_open = result.truncated_bytes
        self._quarantined = quarantine_count(self.directory)
        if checkpoint is None:
            checkpoint = self._segments[0].base_offset if self._segments else self._next_offset
            if self._segments:
                log.info(
                    "no usable checkpoint in %s: replaying from offset %d (oldest segment)",
                    self.directory,
                    checkpoint,
                )
        self._checkpoint_offset = checkpoint
        for segment in result.segments:
            self._frame_records.extend(segment.record_counts)
        self._backlog_records = sum(count for _, count in self._frame_records)
        self._forget_records_below(checkpoint)
        self._checkpoint_file = CheckpointFile(self.directory)
        if not self._segments:
            self._segments.append(self._create_segment(self._next_offset))
        self._size_bytes = sum(segment.size for segment in self._segments)
        self._active_fd = os.open(self._segments[-1].path, os.O_WRONLY)
        self._syncer = Syncer(self, self.config, fsync_observer)
        self._syncer.start()
        log.info(
            "opened WAL %s: %d segments, %d bytes, checkpoint %d, next offset %d, policy %s",
            self.directory,
            len(self._segments),
            self._size_bytes,
            self._checkpoint_offset,
            self._next_offset,
            self.config.fsync,
        )

    def close(self) -> None:
        """Flush everything written to disk, stop background work, release the directory lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.data_available.notify_all()
            self._space_available.notify_all()
        self._writer.shutdown(wait=True)  # queued writes fail fast: the log is closed
        assert self._syncer is not None
        self._syncer.stop()
        os.close(self._active_fd)
        if self._checkpoint_file is not None:
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

    async def append_many_async(self, items: Sequence[AppendItem]) -> list[int]:
        """As ``append_many``, for asyncio: fsync and ``block`` waits leave the loop free.

        Groups of :data:`OFFLOAD_WRITE_BYTES` or more are written on the writer thread; the
        payloads must not change until this returns (ingress hands in views of receive
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
            needed = self._frames_size(items)
            await asyncio.to_thread(self._wait_for_space, needed, self.config.block_timeout_s)
            offsets = await write()
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await future
        return offsets

    def _frames_size(self, items: Sequence[AppendItem]) -> int:
        return sum(encoded_size(item.topic.encode(), len(item.payload)) for item in items)

    def _append(
        self, items: Sequence[AppendItem], on_durable: DurabilityCallback, *, blocking: bool
    ) -> list[int]:
        if not items:
            return []
        now_ms = time.time_ns() // 1_000_000
        prepared = []
        for item in items:
            payload_length = len(item.payload)
            if payload_length > self.config.max_frame_bytes:
                raise FrameTooLargeError(
                    f"batch of {payload_length} bytes for {item.topic}-{item.partition} exceeds "
                    f"the WAL's max frame size of {self.config.max_frame_bytes} bytes; lower the "
                    "client's batch.size/message.max.bytes or raise the agent's max frame size"
                )
            topic = item.topic.encode()
            prepared.append(
                (item, topic, crc32c(item.payload), encoded_size(topic, payload_length))
            )
        with self._lock:
            self._check_open()
            needed = self._needed_bytes(size for *_, size in prepared)
            if self._size_bytes + needed > self.config.max_bytes:
                if not blocking or self.config.full_disk_policy is FullDiskPolicy.REJECT:
                    raise self._full_error(needed)
                self._wait_for_space_locked(needed, self.config.block_timeout_s)
                self._check_open()
            offsets = self._write_locked(prepared, now_ms)
            assert self._syncer is not None
            self._syncer.register(offsets[-1], on_durable)
            self.data_available.notify_all()
        return offsets

    def _needed_bytes(self, frame_sizes: object) -> int:
        """Bytes a group adds, counting the header of every segment it would open."""
        active_size = self._segments[-1].size
        needed = 0
        for size in frame_sizes:  # type: ignore[attr-defined]
            if active_size > SEGMENT_HEADER_SIZE and active_size + size > self.config.segment_bytes:
                active_size = SEGMENT_HEADER_SIZE
                needed += SEGMENT_HEADER_SIZE
            active_size += size
            needed += size
        return needed

    def _full_error(self, needed: int) -> WalFullError:
        return WalFullError(
            f"WAL {self.directory} is full: {self._size_bytes} of {self.config.max_bytes} bytes "
            f"used, {needed} more needed. Records are retained until Kafka acknowledges them; "
            "retry later (the client's retries back off) or give the buffer a larger volume"
        )

    def _wait_for_space(self, needed: int, timeout: float) -> None:
        with self._lock:
            self._wait_for_space_locked(needed, timeout)

    def _wait_for_space_locked(self, needed: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._size_bytes + needed > self.config.max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                raise self._full_error(needed)
            self._space_available.wait(remaining)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise WalFailedError(
                f"WAL {self.directory} stopped after an I/O failure ({self._failure}); restart "
                "the agent so it recovers the log from disk"
            )
        if self._closed:
            raise WalClosedError(f"WAL {self.directory} is closed (agent shutting down)")

    def _write_locked(self, prepared: list, now_ms: int) -> list[int]:
        """Write the group: one pwritev per segment touched; roll everything back on failure."""
        first_offset = self._next_offset
        start_segments = len(self._segments)
        start_size = self._segments[-1].size
        start_total = self._size_bytes
        offsets: list[int] = []
        buffers: list[bytes | bytearray | memoryview] = []
        try:
            for item, topic, payload_crc, size in prepared:
                active = self._segments[-1]
                pending = sum(len(b) for b in buffers)
                if (
                    active.size + pending > SEGMENT_HEADER_SIZE
                    and active.size + pending + size > self.config.segment_bytes
                ):
                    self._flush_buffers(buffers)
                    buffers = []
                    self._rotate_locked(self._next_offset + len(offsets))
                offset = self._next_offset + len(offsets)
                buffers.append(
                    encode_frame_header(
                        offset,
                        topic,
                        item.partition,
                        len(item.payload),
                        payload_crc,
                        item.record_count,
                        now_ms,
                    )
                )
                buffers.append(item.payload)
                offsets.append(offset)
            self._flush_buffers(buffers)
        except OSError as error:
            self._roll_back(start_segments, start_size, start_total)
            if error.errno in _DISK_FULL_ERRNOS:
                raise WalFullError(
                    f"the disk under {self.directory} is full ({os.strerror(error.errno)}); the "
                    "partial write was rolled back, nothing earlier is affected. Retry later or "
                    "free space on the volume"
                ) from error
            raise WalError(f"write to {self._segments[-1].path} failed: {error}") from error
        self._next_offset = first_offset + len(offsets)
        for offset, (item, *_) in zip(offsets, prepared, strict=True):
            self._frame_records.append((offset, item.record_count))
            self._backlog_records += item.record_count
        return offsets

    def _forget_records_below(self, offset: int) -> None:
        records = self._frame_records
        while records and records[0][0] < offset:
            self._backlog_records -= records.popleft()[1]

    def _flush_buffers(self, buffers: list[bytes | bytearray | memoryview]) -> None:
        active = self._segments[-1]
        for start in range(0, len(buffers), _IOV_MAX):
            chunk = buffers[start : start + _IOV_MAX]
            total = sum(len(b) for b in chunk)
            written = os.pwritev(self._active_fd, chunk, active.size)
            if written != total:
                self._finish_short_write(chunk, written, active.size)
            active.size += total
            self._size_bytes += total

    def _finish_short_write(self, chunk: list, written: int, position: int) -> None:
        remainder = memoryview(b"".join(bytes(b) for b in chunk))[written:]
        position += written
        while remainder:
            count = os.pwrite(self._active_fd, remainder, position)
            if count == 0:
                raise OSError(errno.ENOSPC, "no progress writing to the WAL")
            remainder = remainder[count:]
            position += count

    def _roll_back(self, segment_count: int, active_size: int, total_size: int) -> None:
        """Undo a failed group so nothing half-written stays in the log."""
        try:
            while len(self._segments) > segment_count:
                doomed = self._segments.pop()
                os.close(self._active_fd)
                doomed.path.unlink(missing_ok=True)
                self._active_fd = os.open(self._segments[-1].path, os.O_WRONLY)
            os.ftruncate(self._active_fd, active_size)
        except OSError as error:
            self._failure = error
            log.error("could not roll back a failed WAL write in %s: %s", self.directory, error)
        self._segments[-1].size = active_size
        self._size_bytes = total_size

    def _rotate_locked(self, base_offset: int) -> None:
        old_fd = self._active_fd
        if self.config.fsync is not FsyncPolicy.NEVER:
            os.fdatasync(old_fd)
            self.release_synced_pages(old_fd, self._segments[-1].size, 0)
        segment = self._create_segment(base_offset)
        self._segments.append(segment)
        self._size_bytes += segment.size
        self._active_fd = os.open(segment.path, os.O_WRONLY)
        os.close(old_fd)

    def _create_segment(self, base_offset: int) -> Segment:
        path = self.directory / segment_name(base_offset)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            header = encode_segment_header(base_offset)
            if os.write(fd, header) != len(header):
                raise OSError(errno.ENOSPC, "short write of a segment header")
            if self.config.fsync is not FsyncPolicy.NEVER:
                os.fdatasync(fd)
        except OSError:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        if self.config.fsync is not FsyncPolicy.NEVER:
            fsync_directory(self.directory)
        return Segment(base_offset, path, SEGMENT_HEADER_SIZE)

    # ----------------------------------------------------------------- reading
    def reader(self, from_offset: int | None = None) -> WalReader:
        """A tail-following reader of frames at or above ``from_offset`` (default: checkpoint)."""
        start = self._checkpoint_offset if from_offset is None else from_offset
        return WalReader(self, start)

    def segment_views(self) -> list[SegmentView]:
        with self._lock:
            return self._segment_views_locked()

    def _segment_views_locked(self) -> list[SegmentView]:
        last = len(self._segments) - 1
        return [
            SegmentView(s.base_offset, s.path, s.size, sealed=index < last)
            for index, s in enumerate(self._segments)
        ]

    def wait_for_append(self, appended_before: int, timeout: float) -> None:
        """Block until a frame at or above ``appended_before`` is appended, the log closes,
        :meth:`wake_waiters` is called, or ``timeout`` seconds pass (whichever comes first)."""
        with self.data_available:
            if self._next_offset == appended_before and not self._closed:
                self.data_available.wait(timeout)

    def wake_waiters(self) -> None:
        """Wake every thread blocked in :meth:`wait_for_append` or a reader's ``poll``."""
        with self.data_available:
            self.data_available.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    # ----------------------------------------------------------------- checkpointing
    def checkpoint(self, offset: int) -> None:
        """Record that every frame below ``offset`` is delivered; delete segments wholly below it.

        Monotonic: a lower offset than the current checkpoint is ignored.
        """
        with self._checkpoint_lock:
            with self._lock:
                self._check_open()
                if offset > self._next_offset:
                    raise ValueError(
                        f"checkpoint {offset} is beyond the next WAL offset {self._next_offset}"
                    )
                if offset <= self._checkpoint_offset:
                    return
            assert self._checkpoint_file is not None
            self._checkpoint_file.write(offset)
            with self._lock:
                self._checkpoint_offset = offset
                self._forget_records_below(offset)
                doomed = []
                while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
                    segment = self._segments.pop(0)
                    self._size_bytes -= segment.size
                    doomed.append(segment)
                if doomed:
                    self._space_available.notify_all()
            for segment in doomed:
                segment.path.unlink(missing_ok=True)

    @property
    def checkpoint_offset(self) -> int:
        return self._checkpoint_offset

    @property
    def next_offset(self) -> int:
        return self._next_offset

    # ----------------------------------------------------------------- state for the syncer
    def snapshot_for_sync(self) -> SyncTarget:
        """What an fsync now would cover; the caller closes ``target.fd``."""
        with self._lock:
            active = self._segments[-1]
            return SyncTarget(
                os.dup(self._active_fd), self._next_offset - 1, active.base_offset, active.size
            )

    def release_synced_pages(self, fd: int, synced_bytes: int, already_released: int) -> int:
        """Drop a synced segment's pages older than the page-cache window; new release mark.

        ``already_released`` is what an earlier call returned for the same segment (0 at
        first), so each byte range is released once.
        """
        window = self.config.page_cache_window_bytes
        if window is None:
            return already_released
        release_to = synced_bytes - window
        if release_to <= already_released:
            return already_released
        try:
            os.posix_fadvise(
                fd, already_released, release_to - already_released, os.POSIX_FADV_DONTNEED
            )
        except OSError as error:  # only a hint: the data is already safe on disk
            log.debug("posix_fadvise on the WAL failed: %s", error)
        return release_to

    def mark_failed(self, error: BaseException) -> None:
        with self._lock:
            self._failure = error
        log.critical("WAL %s failed: %s", self.directory, error)

    @property
    def healthy(self) -> bool:
        """True while appends can succeed (open, no I/O failure): the agent's readiness."""
        return not self._closed and self._failure is None

    def stats(self) -> WalStats:
        assert self._syncer is not None
        with self._lock:
            return WalStats(
                size_bytes=self._size_bytes,
                max_bytes=self.config.max_bytes,
                segment_count=len(self._segments),
                checkpoint_offset=self._checkpoint_offset,
                next_offset=self._next_offset,
                durable_offset=self._syncer.durable_offset,
                quarantined_segments=self._quarantined,
                truncated_bytes_on_open=self._truncated_on_open,
                backlog_records=self._backlog_records,
            )
