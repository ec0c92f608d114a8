"""Reading a whole segment file back: which bytes are valid frames and which are damage.

Used when the log is opened (``damage.py``, ``repair.py``) and by ``durable-agent wal
inspect``; never on the append or read path. The layout it checks is in ``volume/format.py``.
A wrong segment header does not stop the scan: the file name gives the base offset and every
frame carries its own offset and CRC.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from durable_producer.buffer_agent.volume.format import (
    FRAME_MAGIC,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
)

from ..frame import FrameProblem, complete_frame_at, decode_frame, decode_frames, encoded_size_of
from ..stats import RecordRuns, record_runs

_SCAN_FRAMES = 256
_SCAN_PAYLOAD_BYTES = 8 << 20
"""Frames and payload bytes the scanner copies out at once (then only their spans are kept)."""


@dataclass(frozen=True, slots=True)
class FrameSpan:
    """Where a valid frame lies in a segment file."""

    offset: int
    start: int
    end: int
    record_count: int = 0


class Spans(Sequence[FrameSpan]):
    """The valid frames of a segment, in file order: a list of ``FrameSpan`` to its readers,
    held as four arrays (32 bytes a frame; a ``FrameSpan`` object a frame held about 130
    bytes with its numbers). Recovery keeps them only for a damaged segment, which it needs
    them for (what lies around the damage, what to salvage): of a whole one it keeps the
    ``SegmentScan`` summary (docs/wal.md, "Memory")."""

    __slots__ = ("_counts", "_ends", "_offsets", "_starts")

    def __init__(self) -> None:
        self._offsets = array("q")
        self._starts = array("q")
        self._ends = array("q")
        self._counts = array("q")

    def add(self, offset: int, start: int, end: int, record_count: int) -> None:
        self._offsets.append(offset)
        self._starts.append(start)
        self._ends.append(end)
        self._counts.append(record_count)

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> FrameSpan: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[FrameSpan]: ...

    def __getitem__(self, index: int | slice) -> FrameSpan | Sequence[FrameSpan]:
        if isinstance(index, slice):
            raise TypeError("Spans are read by index or in order, not sliced")
        return FrameSpan(
            self._offsets[index], self._starts[index], self._ends[index], self._counts[index]
        )

    def __iter__(self) -> Iterator[FrameSpan]:
        for values in zip(self._offsets, self._starts, self._ends, self._counts, strict=True):
            yield FrameSpan(*values)

    def starts(self) -> array[int]:
        return self._starts

    def record_counts(self) -> Iterator[tuple[int, int]]:
        """(offset, record count) of each frame."""
        return zip(self._offsets, self._counts, strict=True)

    def frame_bytes(self) -> int:
        """The bytes of every frame together."""
        return sum(self._ends) - sum(self._starts)


@dataclass(slots=True)
class Damage:
    """A run of unreadable bytes between two valid frames (or up to the end of the file)."""

    start: int
    end: int
    problem: str
    resynced: bool


@dataclass(slots=True)
class SegmentScan:
    """What a full scan of one segment file found."""

    path: Path
    base_offset: int
    file_size: int
    header_problem: str | None = None
    """What is wrong with the 16-byte header (the frames after it are scanned anyway)."""
    spans: Spans = field(default_factory=Spans)
    """Every valid frame, until ``keep_summary_only`` drops them for a whole segment."""
    damage: list[Damage] = field(default_factory=list)
    tail_frames: int = 0
    """Complete frames (see ``frame.complete_frame_at``) at the start of damage that runs to the
    end of the file: 0 for a torn write, more when whole frames were there and went bad."""

    # The summary of the valid frames, kept when the spans are dropped (``summarize``).
    frames: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    valid_end: int = SEGMENT_HEADER_SIZE
    """End of the last valid frame (or of the header): where appends may continue."""
    frame_bytes: int = 0
    runs: RecordRuns = field(default_factory=RecordRuns)
    """The frames' offsets and record counts."""

    def summarize(self) -> None:
        spans = self.spans
        self.frames = len(spans)
        if spans:
            self.first_offset = spans[0].offset
            self.last_offset = spans[-1].offset
            self.valid_end = spans[-1].end
        self.frame_bytes = spans.frame_bytes()
        self.runs = record_runs(spans.record_counts())

    def keep_summary_only(self) -> None:
        """Drop the spans of a segment with no damage (nothing needs them): the summary stays.
        Opening a log of millions of frames then holds one segment's spans at a time."""
        if self.whole:
            self.spans = Spans()

    @property
    def whole(self) -> bool:
        """Nothing wrong: a valid header, every byte a valid frame."""
        return self.header_problem is None and not self.damage

    @property
    def damaged_in_middle(self) -> bool:
        """True when valid frames follow damaged bytes: not a torn tail but real corruption."""
        return any(d.resynced for d in self.damage)

    @property
    def tail(self) -> Damage | None:
        """Damage that runs to the end of the file (nothing valid after it), if any."""
        return self.damage[-1] if self.damage and not self.damage[-1].resynced else None


def _find_next_frame(view: memoryview, start: int, after_offset: int) -> int | None:
    """Position of the next decodable frame with an offset above ``after_offset``, if any."""
    data = view.obj
    assert isinstance(data, (bytes, mmap.mmap))
    pos = data.find(FRAME_MAGIC, start)
    while pos != -1:
        decoded = decode_frame(view, pos)
        if not isinstance(decoded, FrameProblem) and decoded[0].offset > after_offset:
            return pos
        pos = data.find(FRAME_MAGIC, pos + 1)
    return None


def scan_segment(path: Path, expected_base: int) -> SegmentScan:
    """Read a whole segment and classify every byte as a valid frame or damage.

    ``expected_base`` is the base offset of the file name. Damage followed by a valid frame is
    marked ``resynced`` (corruption in the middle); damage that runs to the end of the file is a
    torn (or zero-filled) tail unless ``tail_frames`` says whole frames were there.
    """
    size = path.stat().st_size
    scan = SegmentScan(path=path, base_offset=expected_base, file_size=size)
    if size < SEGMENT_HEADER_SIZE:
        scan.header_problem = f"file is {size} bytes, shorter than the segment header"
        return scan
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            magic, base = SEGMENT_HEADER.unpack_from(view, 0)
            if magic != SEGMENT_MAGIC:
                scan.header_problem = "segment header magic is wrong (not a WAL segment)"
            elif base != expected_base:
                scan.header_problem = (
                    f"header says base offset {base}, file name says {expected_base}"
                )
            _scan_frames(view, scan)
            tail = scan.tail
            if tail is not None:
                scan.tail_frames = _complete_frames(view, tail.start)
        finally:
            view.release()
    scan.summarize()
    return scan


def _complete_frames(view: memoryview, start: int) -> int:
    """How many complete frames follow each other from ``start`` (valid CRC or not)."""
    count = 0
    pos: int | None = start
    while pos is not None and pos < len(view):
        pos = complete_frame_at(view, pos)
        count += pos is not None
    return count


def _scan_frames(view: memoryview, scan: SegmentScan) -> None:
    pos = SEGMENT_HEADER_SIZE
    last_offset = scan.base_offset - 1
    end = len(view)
    fast = True
    while pos < end:
        if fast:
            pos, last_offset, fast = _valid_run(view, pos, last_offset, scan.spans)
            if pos >= end:
                return
        decoded = decode_frame(view, pos)
        if isinstance(decoded, FrameProblem):
            problem = decoded.value
        else:
            frame, frame_end = decoded
            if frame.offset > last_offset:
                scan.spans.add(frame.offset, pos, frame_end, frame.record_count)
                last_offset = frame.offset
                pos = frame_end
                continue
            problem = f"offset {frame.offset} does not follow {last_offset}"
        resume = _find_next_frame(view, pos + 1, last_offset)
        scan.damage.append(
            Damage(
                start=pos,
                end=resume if resume is not None else end,
                problem=problem,
                resynced=resume is not None,
            )
        )
        if resume is None:
            return
        pos = resume


def _valid_run(view: memoryview, pos: int, last_offset: int, spans: Spans) -> tuple[int, int, bool]:
    """The valid frames from ``pos`` on, each above the one before, added to ``spans`` many at
    a time by the reader's compiled scanner (``frame.decode_frames``; opening a log of
    one-record frames a frame at a time took 3.6 us a frame, this way 1.2): (the position
    after them, the last one's offset, whether to use the scanner again). It stops where
    ``decode_frame`` says what is there. The scanner passes over frames whose offset does not
    follow instead of stopping there: where the frames it took do not fill the bytes it read,
    nothing it read counts and the rest of the segment is scanned a frame at a time (damage
    is rare)."""
    while True:
        frames, stop, _, _ = decode_frames(
            view, pos, _SCAN_FRAMES, _SCAN_PAYLOAD_BYTES, last_offset + 1
        )
        if not frames:
            return pos, last_offset, True
        topic, topic_size = "", 0
        at = pos
        taken: list[tuple[int, int, int, int]] = []
        for frame in frames:
            if frame.topic is not topic:  # (the scanner shares a run's topic object)
                topic, topic_size = frame.topic, len(frame.topic.encode())
            end = at + encoded_size_of(topic_size, len(frame.payload))
            taken.append((frame.offset, at, end, frame.record_count))
            at = end
        if at != stop:  # a frame in between was passed over
            return pos, last_offset, False
        for values in taken:
            spans.add(*values)
        pos, last_offset = stop, frames[-1].offset
