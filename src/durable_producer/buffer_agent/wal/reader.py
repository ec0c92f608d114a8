"""Reading frames from an offset, following the live tail of the log."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from durable_producer.buffer_agent.volume.format import (
    FRAME_PREFIX,
    HEADER_SIZE,
    PREFIX_SIZE,
    SEGMENT_HEADER_SIZE,
)

from .errors import WalError
from .frame import Frame, FrameProblem, decode_frame, decode_frames
from .segment import SegmentView


class ReadableLog(Protocol):
    """What a reader needs of the log (``WriteAheadLog`` provides it)."""

    @property
    def closed(self) -> bool: ...

    def segment_views(self) -> list[SegmentView]: ...

    def wait_for_data(self, segment_base: int | None, position: int, timeout: float) -> None: ...


_READ_CHUNK = 4 * 1024 * 1024

DEFAULT_POLL_BYTES = 16 * 1024 * 1024
"""What one ``poll`` returns at most, in frame bytes (always at least one frame): each frame's
payload is copied out of the chunk read, so a poll's memory is this plus one chunk (kept
between polls while it holds frames not returned yet), whatever the frames' size (256 frames
of 1 MiB client batches were 256 MiB)."""


class WalReader:
    """Iterates frames with offset >= the start offset, in order, across segments.

    Only bytes the writer has published (complete frames) are read. A segment a checkpoint
    deletes while the reader is on it is read to its end through the open descriptor, then
    the reader goes on with the next segment. (That happens whenever a reader waits at the end
    of the newest segment, an append starts a new one and a checkpoint reaches its base offset
    before the reader looks again: the forwarder's reader, once it has delivered everything.)
    """

    def __init__(self, wal: ReadableLog, from_offset: int) -> None:
        self._wal = wal
        self._wanted = from_offset
        self._base: int | None = None
        self._path: Path | None = None
        self._deleted = False
        """The open segment was deleted by a checkpoint (``_deleted_view``)."""
        self._fd = -1
        self._position = 0
        self._chunk = b""
        """The open segment's bytes last read, from file position ``_chunk_at`` on: a poll
        that stops at ``max_frames`` leaves whole frames in it, which the next poll decodes
        without reading them again (a catch-up's polls of 4,096 small frames used a quarter
        of each 4 MiB read, and the copies were a sixth of the forwarder's work a frame)."""
        self._chunk_at = 0

    def close(self) -> None:
        self._chunk = b""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> WalReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def next_offset(self) -> int:
        """The lowest offset this reader has not returned yet."""
        return self._wanted

    def poll(
        self, max_frames: int = 1024, timeout: float = 0.0, max_bytes: int = DEFAULT_POLL_BYTES
    ) -> list[Frame]:
        """Up to ``max_frames`` frames and about ``max_bytes`` of payload (at least one frame);
        waits up to ``timeout`` seconds if none is available."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self._read_available(max_frames, max_bytes)
            remaining = deadline - time.monotonic()
            if frames or remaining <= 0 or self._wal.closed:
                return frames
            self._wal.wait_for_data(self._base, self._position, remaining)

    def _read_available(self, max_frames: int, max_bytes: int) -> list[Frame]:
        frames: list[Frame] = []
        budget = [max_bytes]
        while len(frames) < max_frames and budget[0] > 0:
            views = self._wal.segment_views()
            view = self._current_view(views)
            if view is None:
                return frames
            if self._position >= view.visible_end:
                if not view.sealed:
                    return frames
                self._advance_past(view.base_offset, views)
                continue
            self._read_segment(view, frames, max_frames, budget)
        return frames

    def _current_view(self, views: list[SegmentView]) -> SegmentView | None:
        if self._base is not None:
            for view in views:
                if view.base_offset == self._base:
                    return view
            if self._fd >= 0:
                return self._deleted_view()
        candidates = [view for view in views if view.base_offset <= self._wanted]
        chosen = candidates[-1] if candidates else (views[0] if views else None)
        if chosen is None:
            return None
        self._open(chosen)
        return chosen

    def _deleted_view(self) -> SegmentView:
        """The open segment left the log: a checkpoint deleted it. The newest segment never
        leaves, so it was sealed and its file is complete: what is left of it can be read
        through the descriptor, then ``_advance_past`` moves on to the next segment."""
        assert self._base is not None and self._path is not None
        self._deleted = True
        return SegmentView(self._base, self._path, os.fstat(self._fd).st_size, sealed=True)

    def _open(self, view: SegmentView) -> None:
        self.close()
        try:
            self._fd = os.open(view.path, os.O_RDONLY)
        except FileNotFoundError:
            self._base = None
            raise WalError(
                f"segment {view.path.name} vanished before it could be read: the checkpoint "
                f"moved past offset {self._wanted} while this reader still needed it"
            ) from None
        self._base = view.base_offset
        self._path = view.path
        self._deleted = False
        self._position = SEGMENT_HEADER_SIZE

    def _advance_past(self, base: int, views: list[SegmentView]) -> None:
        later = [view for view in views if view.base_offset > base]
        self.close()
        self._base = None
        if later:
            self._wanted = max(self._wanted, later[0].base_offset)
            self._open(later[0])

    def _read_segment(
        self, view: SegmentView, frames: list[Frame], max_frames: int, budget: list[int]
    ) -> None:
        """Frames from the reader's position, while ``max_frames`` and the byte ``budget``
        (a one-element list, spent here) allow."""
        data, pos = self._bytes_from_position(view, budget[0])
        origin = self._position - pos  # the file position of data[0]
        buffer = memoryview(data)
        while pos < len(buffer) and len(frames) < max_frames and budget[0] > 0:
            decoded_many, pos, self._wanted, budget[0] = decode_frames(
                data, pos, max_frames - len(frames), budget[0], self._wanted
            )
            frames += decoded_many
            if pos >= len(buffer) or len(frames) >= max_frames or budget[0] <= 0:
                break
            # No whole valid frame at pos (or no compiled scanner): one frame in Python,
            # which says what is wrong there.
            if len(buffer) - pos < HEADER_SIZE and origin + pos + HEADER_SIZE <= view.visible_end:
                break
            decoded = decode_frame(buffer, pos)
            if isinstance(decoded, FrameProblem):
                if decoded is FrameProblem.INCOMPLETE and origin + pos > self._position:
                    break
                if self._deleted:  # delivered; what a failed roll-back left is no frame
                    pos = view.visible_end - origin
                    break
                raise WalError(
                    f"{decoded.value} in {view.path.name} at byte {origin + pos} while "
                    "reading; the disk corrupted data after it was written. Restart the agent: "
                    "recovery quarantines the segment and salvages the valid frames"
                )
            frame, end = decoded
            pos = end
            if frame.offset >= self._wanted:
                frames.append(frame)
                budget[0] -= len(frame.payload)
                self._wanted = frame.offset + 1
        self._position = origin + pos
        if not _whole_frame_in(data, pos):
            self._chunk = b""  # nothing left in it to return: not kept

    def _bytes_from_position(self, view: SegmentView, budget: int) -> tuple[bytes, int]:
        """(data, start): ``data[start:]`` is the segment's bytes from the reader's position,
        at least its first whole frame where the segment has it. The chunk read last when it
        still holds a whole frame there; else a new read (of the whole frame when it is larger
        than the chunk), kept for the next poll."""
        start = self._position - self._chunk_at
        chunk = self._chunk
        if start >= 0 and _whole_frame_in(chunk, start):
            return chunk, start
        length = min(view.visible_end - self._position, _READ_CHUNK, max(budget, HEADER_SIZE))
        data = os.pread(self._fd, length, self._position)
        if len(data) >= PREFIX_SIZE:
            whole = _frame_end(data, 0)
            if whole > len(data) and self._position + whole <= view.visible_end:
                data = os.pread(self._fd, whole, self._position)
        self._chunk, self._chunk_at = data, self._position
        return data, 0


def _whole_frame_in(data: bytes, start: int) -> bool:
    """``data`` holds, from ``start``, a whole frame header and the length it gives. The
    header is asked for whole even where a damaged length says less: with fewer bytes the
    read stops short of judging the frame, and a reader that kept such a chunk would stop at
    the same place again at every try."""
    return start + HEADER_SIZE <= len(data) and _frame_end(data, start) <= len(data)


def _frame_end(data: bytes, start: int) -> int:
    """Where the frame at ``start`` ends by the length its prefix gives (whole prefix
    needed; the length may be damaged: nothing here checks it)."""
    body_length: int = FRAME_PREFIX.unpack_from(data, start)[1]
    return start + PREFIX_SIZE + body_length
