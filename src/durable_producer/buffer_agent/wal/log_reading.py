"""The reading side of the write-ahead log: what readers (``WalReader``) call.

``WriteAheadLog`` inherits it; the state it reads (the segments, offsets, the lock and the
condition appends notify) belongs to the log and is only read here.
"""

from __future__ import annotations

import threading

from .reader import WalReader
from .segment import SegmentView
from .segment_list import SegmentList


class LogReading:
    """Readers' access to the log: segment views, waits for data, new readers."""

    _lock: threading.Lock
    _data_available: threading.Condition
    _segments: SegmentList
    _closed: bool
    _next_offset: int
    _checkpoint_offset: int

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
        """Wake every thread blocked in :meth:`wait_for_append` or :meth:`wait_for_data`."""
        with self._data_available:
            self._data_available.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
