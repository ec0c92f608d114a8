"""The log's segments in offset order: where groups of frames are written, what readers see.

The newest segment is active. A group of frames goes to it with one ``pwritev`` per segment
touched; whenever the next frame would take the active segment past ``segment_bytes`` it is
sealed and a new segment started (see ``volume/format.py`` for the rule). A group that fails
part way is rolled back, so nothing half-written stays. Delivered segments leave from the
oldest end.

Not thread-safe: ``WriteAheadLog`` calls it under its lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from durable_producer.buffer_agent.volume.atomic_file import fsync_directory
from durable_producer.buffer_agent.volume.format import SEGMENT_HEADER_SIZE

from .frame import PreparedFrame, encode_frame_header
from .segment import Buffer, Segment, SegmentPolicy, SegmentView

WriteMark = tuple[int, int, int]
"""Where the segments stood before a group was written (segment count, active segment's size,
total size): what a roll-back returns to. A plain tuple: one is made for every append."""


class SegmentList:
    """Oldest first and never empty; the last segment takes the appends."""

    def __init__(
        self, directory: Path, segment_bytes: int, policy: SegmentPolicy, segments: list[Segment]
    ) -> None:
        assert segments, "a log always has a segment to append to"
        self._directory = directory
        self._segment_bytes = segment_bytes
        self._policy = policy
        self._segments = segments
        self.size_bytes = sum(segment.size for segment in segments)
        """Bytes of all segments: what the log's size limit counts."""

    @classmethod
    def resume(
        cls,
        directory: Path,
        segment_bytes: int,
        policy: SegmentPolicy,
        recovered: list[Segment],
        next_offset: int,
    ) -> SegmentList:
        """Continue appending to the newest recovered segment, or to a new one if none."""
        if recovered:
            recovered[-1].activate()
        else:
            recovered = [Segment.create(directory, next_offset, policy)]
        return cls(directory, segment_bytes, policy, recovered)

    def make_durable(self) -> None:
        """fdatasync every segment and fsync the directory: what was recovered on open.

        Frames written before a kill -9 (or under ``never``) may be in the page cache only;
        the log treats every recovered frame as durable (a client's retry of one is answered
        as a duplicate at once), so they must be on disk before it serves. Clean pages cost
        nothing to sync. Raises ``OSError``: the log must not open then."""
        for segment in self._segments:
            fd = os.open(segment.path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        fsync_directory(self._directory)

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def oldest_base_offset(self) -> int:
        return self._segments[0].base_offset

    # ----------------------------------------------------------------- writing
    def needed_bytes(self, frame_sizes: Iterable[int]) -> int:
        """Bytes a group adds, counting the header of every segment it would start."""
        segment_bytes = self._segment_bytes
        active_size = self._segments[-1].size
        needed = 0
        for size in frame_sizes:
            if active_size > SEGMENT_HEADER_SIZE and active_size + size > segment_bytes:
                active_size = SEGMENT_HEADER_SIZE
                needed += SEGMENT_HEADER_SIZE
            active_size += size
            needed += size
        return needed

    def mark(self) -> WriteMark:
        return len(self._segments), self._segments[-1].size, self.size_bytes

    def write(self, frames: Sequence[PreparedFrame], first_offset: int, now_ms: int) -> None:
        """Write ``frames`` with consecutive offsets from ``first_offset``.

        On ``OSError`` part of the group may be on disk: call :meth:`roll_back` with the
        :meth:`mark` taken before.
        """
        segment_bytes = self._segment_bytes
        offset = first_offset
        buffers: list[Buffer] = []
        pending = 0
        for item, topic, payload_crc, size in frames:
            active_size = self._segments[-1].size
            if (
                active_size + pending > SEGMENT_HEADER_SIZE
                and active_size + pending + size > segment_bytes
            ):
                self.size_bytes += self._segments[-1].write(buffers)
                buffers = []
                pending = 0
                self._rotate(offset)
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
            pending += size
            offset += 1
        self.size_bytes += self._segments[-1].write(buffers)

    def _rotate(self, base_offset: int) -> None:
        self._segments[-1].seal()
        segment = Segment.create(self._directory, base_offset, self._policy)
        self._segments.append(segment)
        self.size_bytes += segment.size

    def roll_back(self, mark: WriteMark) -> None:
        """Undo everything written since ``mark``. Raises ``OSError`` if the files could not be
        restored (the sizes are restored regardless, so readers never see the partial group)."""
        segment_count, active_size, size_bytes = mark
        started = self._segments[segment_count:]
        del self._segments[segment_count:]
        active = self._segments[-1]
        try:
            for segment in started:
                segment.delete()
            active.activate()
            active.truncate(active_size)
        finally:
            active.size = active_size
            self.size_bytes = size_bytes

    def restart_after_failure(self, next_offset: int) -> None:
        """Leave the active segment's descriptor, whose fsync failed, and append to a fresh
        one from ``next_offset`` (the failed log's frames are all delivered). A new
        descriptor does not inherit the old one's error, so its fsyncs mean something again.
        Raises ``OSError`` (nothing changed but the closed descriptor) if that fails."""
        active = self._segments[-1]
        active.close()
        if active.base_offset == next_offset:  # it holds no frame: reuse the file
            active.activate()
            active.truncate(SEGMENT_HEADER_SIZE)  # anything a failed roll-back left after it
            return
        segment = Segment.create(self._directory, next_offset, self._policy)
        self._segments.append(segment)
        self.size_bytes += segment.size

    # ----------------------------------------------------------------- delivered segments
    def drop_delivered(self, checkpoint: int) -> list[Segment]:
        """Remove segments whose every frame is below ``checkpoint`` from the list; the caller
        deletes their files (outside its lock)."""
        segments = self._segments
        dropped = []
        while len(segments) > 1 and segments[1].base_offset <= checkpoint:
            segment = segments.pop(0)
            self.size_bytes -= segment.size
            dropped.append(segment)
        return dropped

    # ----------------------------------------------------------------- for readers
    def views(self) -> list[SegmentView]:
        last = len(self._segments) - 1
        return [s.view(sealed=index < last) for index, s in enumerate(self._segments)]

    def has_data_past(self, segment_base: int | None, position: int) -> bool:
        """Whether a reader at byte ``position`` of segment ``segment_base`` has more to read
        (that segment grew, a newer one exists, or it is gone); None: any frame at all."""
        segments = self._segments
        if segment_base is None:
            return any(segment.size > SEGMENT_HEADER_SIZE for segment in segments)
        for index, segment in enumerate(segments):
            if segment.base_offset == segment_base:
                return segment.size > position or index < len(segments) - 1
        return True

    def close(self) -> None:
        self._segments[-1].close()
