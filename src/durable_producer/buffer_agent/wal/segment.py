"""One segment file of the log and everything done to it while the log is open.

A :class:`Segment` knows its base offset, path and size (the end of its last complete frame).
While it is the log's newest segment it is *active*: it holds the descriptor appends are
written through. Sealing it (when the log rotates to a new segment) makes it durable under the
fsync policy and closes that descriptor. The file format is in ``volume/format.py``; reading whole
segment files back (recovery, inspection) is in ``recovery/scan.py``.

A segment is not thread-safe: the log calls it under its own lock. The one exception is
:meth:`Segment.release_synced_pages`, which the syncer calls with a descriptor of its own and
which is only a hint to the kernel.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from durable_producer.buffer_agent.volume.atomic_file import fsync_directory
from durable_producer.buffer_agent.volume.format import (
    MAX_OFFSET,
    SEGMENT_HEADER_SIZE,
    encode_segment_header,
    parse_segment_name,
    segment_name,
)

from .errors import WalFailedError

log = logging.getLogger(__name__)

_IOV_MAX = 1024
Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class SegmentPolicy:
    """How the segments of one log treat the disk."""

    sync: bool
    """fsync new segment headers (and the directory) and sealed segments: the fsync policy is
    not ``never``."""
    page_cache_window: int | None
    """Synced bytes further than this behind a segment's end leave the page cache (None: the
    kernel decides)."""


@dataclass(frozen=True, slots=True)
class SegmentView:
    """What a reader may read of one segment: bytes up to ``visible_end`` are complete frames."""

    base_offset: int
    path: Path
    visible_end: int
    sealed: bool
    """No frame will be added: a newer segment exists."""


class Segment:
    """One segment file. Create the newest with :meth:`create`; wrap recovered ones directly."""

    __slots__ = ("_fd", "_policy", "_released", "_sync_fd", "base_offset", "path", "size")

    def __init__(self, base_offset: int, path: Path, size: int, policy: SegmentPolicy) -> None:
        self.base_offset = base_offset
        self.path = path
        self.size = size
        """Bytes of complete frames (and the header): where the next append goes."""
        self._policy = policy
        self._fd = -1
        self._sync_fd = -1
        """The syncer's own open file (see :meth:`duplicate_fd`)."""
        self._released = 0

    @classmethod
    def create(cls, directory: Path, base_offset: int, policy: SegmentPolicy) -> Segment:
        """A new, active segment holding only its header (durable unless the policy says not)."""
        path = directory / segment_name(base_offset)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        sync_fd = -1
        try:
            sync_fd = os.open(path, os.O_RDONLY)
            header = encode_segment_header(base_offset)
            if os.write(fd, header) != len(header):
                raise OSError(errno.ENOSPC, "short write of a segment header")
            if policy.sync:
                os.fdatasync(fd)
                fsync_directory(directory)
        except OSError:
            os.close(fd)
            if sync_fd >= 0:
                os.close(sync_fd)
            path.unlink(missing_ok=True)
            raise
        segment = cls(base_offset, path, SEGMENT_HEADER_SIZE, policy)
        segment._fd, segment._sync_fd = fd, sync_fd
        return segment

    # ----------------------------------------------------------------- state
    @property
    def active(self) -> bool:
        """True while the segment holds a descriptor for appends."""
        return self._fd >= 0

    def view(self, *, sealed: bool) -> SegmentView:
        return SegmentView(self.base_offset, self.path, self.size, sealed)

    def activate(self) -> None:
        """Open the descriptors appends and the syncer go through (the newest segment after
        opening the log, or after a failure)."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY)
        if self._sync_fd < 0:
            self._sync_fd = os.open(self.path, os.O_RDONLY)

    def duplicate_fd(self) -> int:
        """A descriptor of the active segment that stays valid after sealing; caller closes it.

        It shares the open file the syncer uses, not the one appends and :meth:`seal` use:
        Linux reports a writeback error once to each open file that existed when it happened,
        so a failed fsync in :meth:`seal` cannot hide the error from the syncer's next fsync
        (which would then report success for data that may be lost).
        """
        return os.dup(self._sync_fd)

    # ----------------------------------------------------------------- writing
    def write(self, buffers: Sequence[Buffer]) -> int:
        """Append ``buffers`` at the end (``pwritev``, payloads not copied); bytes written.

        ``size`` grows with every chunk written, so after an error it covers what reached the
        file; the caller rolls back with :meth:`truncate`.
        """
        written_total = 0
        for start in range(0, len(buffers), _IOV_MAX):
            chunk = buffers[start : start + _IOV_MAX]
            total = sum(len(b) for b in chunk)
            written = os.pwritev(self._fd, chunk, self.size)
            if written != total:
                self._finish_short_write(chunk, written)
            self.size += total
            written_total += total
        return written_total

    def _finish_short_write(self, chunk: Sequence[Buffer], written: int) -> None:
        remainder = memoryview(b"".join(bytes(b) for b in chunk))[written:]
        position = self.size + written
        while remainder:
            count = os.pwrite(self._fd, remainder, position)
            if count == 0:
                raise OSError(errno.ENOSPC, "no progress writing to the WAL")
            remainder = remainder[count:]
            position += count

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` (undoing a failed write); ``size`` follows even if the
        truncation itself fails, so nothing past it is ever shown to readers."""
        try:
            os.ftruncate(self._fd, size)
        finally:
            self.size = size

    def seal(self) -> None:
        """No more appends: sync under the policy, drop old pages, close the descriptor.

        Raises ``WalFailedError`` if the fsync fails: what the file holds is then unknown
        (see ``health.py``), unlike a failed write, which a roll-back undoes.
        """
        if self._fd < 0:
            return
        if self._policy.sync:
            try:
                os.fdatasync(self._fd)
            except OSError as error:
                raise WalFailedError(f"fsync of {self.path.name} failed: {error}") from error
            self._released = 0
            self.release_synced_pages(self._fd, self.size)
        self.close()

    # ----------------------------------------------------------------- page cache and removal
    def release_synced_pages(self, fd: int, synced_bytes: int) -> None:
        """After an fsync covering ``synced_bytes``: drop pages further behind than the window.

        ``fd`` is any descriptor of this file (the syncer passes its own duplicate). The
        segment remembers how far it has released, so each range is released once. Only a
        hint: the data is already on disk.
        """
        window = self._policy.page_cache_window
        if window is None:
            return
        already = self._released
        # Whole pages only: the kernel keeps a page the range covers in part, and the next
        # release starts past it, so an unaligned end would leave one page per fsync behind.
        release_to = (synced_bytes - window) // mmap.PAGESIZE * mmap.PAGESIZE
        if release_to <= already:
            return
        try:
            os.posix_fadvise(fd, already, release_to - already, os.POSIX_FADV_DONTNEED)
        except OSError as error:
            log.debug("posix_fadvise on the WAL failed: %s", error)
        self._released = release_to

    def close(self) -> None:
        """Close the descriptors without syncing (the log is closing or failed)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._sync_fd >= 0:
            os.close(self._sync_fd)
            self._sync_fd = -1

    def delete(self) -> None:
        """Remove the file (delivered, or a rolled-back new segment). Open readers keep it."""
        self.close()
        self.path.unlink(missing_ok=True)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """Segment files in ``directory`` as (base offset, path), oldest first.

    Only regular files whose name is a base offset the format can hold; recovery
    (``recovery/damage.py``) decides which of them are really part of the log."""
    found = []
    for entry in os.scandir(directory):
        base = parse_segment_name(entry.name)
        if base is not None and base <= MAX_OFFSET and entry.is_file():
            found.append((base, Path(entry.path)))
    found.sort()
    return found
