"""Reading a whole segment file back: which bytes are valid frames and which are damage.

Used when the log is opened (``damage.py``, ``repair.py``) and by ``durable-agent wal
inspect``; never on the append or read path. The layout it checks is in ``volume/format.py``.
A wrong segment header does not stop the scan: the file name gives the base offset and every
frame carries its own offset and CRC.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, overload

from durable_producer.buffer_agent.volume.format import (
    FRAME_MAGIC,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
)

from ..frame import FrameProblem, complete_frame_at, decode_frame, scan_spans
from ..stats import RecordRuns

_SCAN_FRAMES = 16384
"""Frames the compiled scan reads in one call (their spans, 512 KiB, are copied once more)."""


@dataclass(frozen=True, slots=True)
class FrameSpan:
    """Where a valid frame lies in a segment file."""

    offset: int
    start: int
    end: int
    record_count: int = 0


class Spans(Sequence[FrameSpan]):
    """The valid frames of a segment, in file order: a list of ``FrameSpan`` to its readers,
    held as four numbers a frame in one array (32 bytes a frame; a ``FrameSpan`` object a
    frame held about 130 bytes with its numbers). Opening the log keeps them only for a damaged
    segment, which recovery needs them for (what lies around the damage, what to salvage):
    of a whole one only the ``SegmentScan`` summary is made (docs/wal.md, "Memory")."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values = array("q")
        """offset, start, end, record count; a frame after the other."""

    def add(self, offset: int, start: int, end: int, record_count: int) -> None:
        self._values.extend((offset, start, end, record_count))

    def add_packed(self, packed: bytes) -> None:
        """Frames as ``frame.scan_spans`` gives them (four native int64s a frame)."""
        self._values.frombytes(packed)

    def __len__(self) -> int:
        return len(self._values) // 4

    @overload
    def __getitem__(self, index: int) -> FrameSpan: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[FrameSpan]: ...

    def __getitem__(self, index: int | slice) -> FrameSpan | Sequence[FrameSpan]:
        if isinstance(index, slice):
            raise TypeError("Spans are read by index or in order, not sliced")
        frames = len(self)
        if not -frames <= index < frames:
            raise IndexError("span index out of range")
        at = 4 * (index % frames)
        return FrameSpan(*self._values[at : at + 4])

    def __iter__(self) -> Iterator[FrameSpan]:
        values = self._values
        for at in range(0, len(values), 4):
            yield FrameSpan(values[at], values[at + 1], values[at + 2], values[at + 3])

    def starts(self) -> array[int]:
        """Where each frame starts (a copy)."""
        return self._values[1::4]


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
    keeps_spans: bool = True
    spans: Spans = field(default_factory=Spans)
    """Every valid frame (none unless ``keeps_spans``)."""
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
    """The valid frames' bytes together (counted as they are added)."""
    runs: RecordRuns = field(default_factory=RecordRuns)
    """The frames' offsets and record counts (built as they are added)."""

    def add(self, offset: int, start: int, end: int, record_count: int) -> None:
        """The next valid frame, its offset above every one's so far."""
        if self.keeps_spans:
            self.spans.add(offset, start, end, record_count)
        self.runs.add(offset, record_count)
        self.frame_bytes += end - start

    def add_packed(self, spans: bytes, runs: bytes, frame_bytes: int) -> None:
        """The next valid frames, as ``frame.scan_spans`` gives them."""
        self.spans.add_packed(spans)
        self.runs.add_packed(runs)
        self.frame_bytes += frame_bytes

    def summarize(self, valid_end: int) -> None:
        """The rest of the summary: the frame count and first and last offsets, from the
        runs; ``valid_end``, where the last valid frame ends."""
        self.frames = self.runs.frames()
        offsets = self.runs.offsets()
        if offsets is not None:
            self.first_offset, self.last_offset = offsets
        self.valid_end = valid_end

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


def scan_segment(
    path: Path, expected_base: int, *, summary_of_whole: bool = False, copy: bool = False
) -> SegmentScan:
    """Read a whole segment and classify every byte as a valid frame or damage.

    ``expected_base`` is the base offset of the file name. Damage followed by a valid frame is
    marked ``resynced`` (corruption in the middle); damage that runs to the end of the file is a
    torn (or zero-filled) tail unless ``tail_frames`` says whole frames were there.

    ``summary_of_whole`` (opening the log): a segment found whole keeps only its summary, no
    spans; a damaged one, rare, is read a second time keeping them (recovery needs what lies
    around the damage and what to salvage). Opening a log of millions of frames then holds no
    frame's span beyond the damaged segments' (docs/wal.md, "Memory").

    ``copy``: read the file into memory instead of mapping it. For the newest segment: a
    running agent cuts it back when a write fails (a full disk), and ``wal inspect`` takes no
    lock; a mapped page past the new end would kill the inspecting process with SIGBUS.
    """
    scan = _scan_segment(path, expected_base, keeps_spans=not summary_of_whole, copy=copy)
    if not scan.keeps_spans and not scan.whole:
        scan = _scan_segment(path, expected_base, keeps_spans=True, copy=copy)
    return scan


def _scan_segment(path: Path, expected_base: int, *, keeps_spans: bool, copy: bool) -> SegmentScan:
    with open(path, "rb") as file:
        copied = file.read() if copy else None
        size = os.fstat(file.fileno()).st_size if copied is None else len(copied)
        scan = SegmentScan(
            path=path, base_offset=expected_base, file_size=size, keeps_spans=keeps_spans
        )
        if size < SEGMENT_HEADER_SIZE:
            scan.header_problem = f"file is {size} bytes, shorter than the segment header"
            return scan
        with _contents(file, copied) as view:
            _scan_view(view, scan)
    return scan


@contextmanager
def _contents(file: BinaryIO, copied: bytes | None) -> Iterator[memoryview]:
    """A view of the whole file: ``copied``, or a read-only mapping of it."""
    if copied is not None:
        with memoryview(copied) as view:
            yield view
        return
    with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            yield view
        finally:
            view.release()


def _scan_view(view: memoryview, scan: SegmentScan) -> None:
    magic, base = SEGMENT_HEADER.unpack_from(view, 0)
    if magic != SEGMENT_MAGIC:
        scan.header_problem = "segment header magic is wrong (not a WAL segment)"
    elif base != scan.base_offset:
        scan.header_problem = f"header says base offset {base}, file name says {scan.base_offset}"
    valid_end = _scan_frames(view, scan)
    tail = scan.tail
    if tail is not None:
        scan.tail_frames = _complete_frames(view, tail.start)
    scan.summarize(valid_end)


def _complete_frames(view: memoryview, start: int) -> int:
    """How many complete frames follow each other from ``start`` (valid CRC or not)."""
    count = 0
    pos: int | None = start
    while pos is not None and pos < len(view):
        pos = complete_frame_at(view, pos)
        count += pos is not None
    return count


def _scan_frames(view: memoryview, scan: SegmentScan) -> int:
    """Every byte after the header, as valid frames (runs of them read by the compiled scan,
    ``frame.scan_spans``: opening a log of one-record frames a frame at a time in Python took
    3.6 us a frame, through the reader's scanner 1.2) or damage (``decode_frame`` at each
    position the compiled scan stops at says what is there). Returns where the last valid
    frame ends (the header's end if none)."""
    pos = valid_end = SEGMENT_HEADER_SIZE
    last_offset = scan.base_offset - 1
    end = len(view)
    while pos < end:
        spans, runs, frame_bytes, stop, last = scan_spans(
            view, pos, last_offset, _SCAN_FRAMES, scan.keeps_spans
        )
        if stop != pos:
            scan.add_packed(spans, runs, frame_bytes)
            pos = valid_end = stop
            last_offset = last
            continue
        decoded = decode_frame(view, pos)
        if isinstance(decoded, FrameProblem):
            problem = decoded.value
        else:
            frame, frame_end = decoded
            if frame.offset > last_offset:
                scan.add(frame.offset, pos, frame_end, frame.record_count)
                last_offset = frame.offset
                pos = valid_end = frame_end
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
            return valid_end
        pos = resume
    return valid_end
