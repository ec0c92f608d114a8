"""A segment's spans, held in arrays, read as the list of ``FrameSpan`` they stand for; what
recovery keeps of a whole segment (its summary, not its spans)."""

from __future__ import annotations

import contextlib
import gc
import tempfile
import tracemalloc
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_producer.buffer_agent.volume.format import encode_segment_header
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.frame import crc32c, encode_frame_header
from durable_producer.buffer_agent.wal.recovery import scan as scan_module
from durable_producer.buffer_agent.wal.recovery.scan import FrameSpan, Spans, scan_segment
from support.wal_helpers import payload_for, record_runs

_spans = st.lists(
    st.tuples(
        st.integers(0, 2**40), st.integers(0, 2**30), st.integers(0, 2**20), st.integers(0, 99)
    ),
    max_size=30,
).map(
    lambda rows: [
        FrameSpan(offset, start, start + size, count) for offset, start, size, count in rows
    ]
)


@given(_spans, st.integers(-40, 40))
def test_spans_read_as_the_list_they_stand_for(listed: list[FrameSpan], index: int) -> None:
    spans = Spans()
    for span in listed:
        spans.add(span.offset, span.start, span.end, span.record_count)
    assert len(spans) == len(listed) and bool(spans) == bool(listed)
    assert list(spans) == listed
    if -len(listed) <= index < len(listed):
        assert spans[index] == listed[index]
    assert list(spans.starts()) == [span.start for span in listed]
    packed = Spans()
    packed.add_packed(spans._values.tobytes())  # as the compiled scan hands them over
    assert list(packed) == listed


@given(st.dictionaries(st.integers(0, 60), st.integers(0, 3)))
def test_record_runs_stand_for_the_frames_and_their_offsets(frames: dict[int, int]) -> None:
    runs = record_runs(sorted(frames.items()))
    assert {
        first + index: count for first, length, count in runs for index in range(length)
    } == frames
    for cut in range(len(frames) + 1):  # runs handed over in two parts, as the scan does
        head, tail = (
            record_runs(sorted(frames.items())[:cut]),
            record_runs(sorted(frames.items())[cut:]),
        )
        head.add_packed(tail._values.tobytes())
        assert list(head) == list(runs)
    ranges = runs.ranges()
    assert {offset for first, last in ranges for offset in range(first, last + 1)} == set(frames)
    assert all(later[0] > earlier[1] + 1 for earlier, later in pairwise(ranges))
    assert len(runs) <= len(frames)


def test_opening_keeps_no_span_of_a_whole_segment(tmp_path: Path) -> None:
    """A restart over a large backlog of one-record frames (a linger.ms=0 client while Kafka
    was away): opening's peak memory grows neither with the log's frames nor with a
    segment's. It held every segment's spans until it had decided (about 60 bytes a frame at
    the peak: 6 million frames filled the agent's default 512 MiB), so a large enough backlog
    killed the agent at each start; then the segment's it was reading (32 bytes a frame of a
    segment: up to 64 MiB of one-record frames, 7 MB, left in the allocator's heap once
    open)."""
    config = WalConfig(
        max_bytes=1 << 30, fsync=FsyncPolicy.NEVER, segment_bytes=1 << 20, max_frame_bytes=1 << 16
    )
    payload = payload_for(0, 200)
    frames = 60_000
    with WriteAheadLog.open(tmp_path / "wal", config) as wal:
        for _ in range(frames):
            wal.append("t", 0, payload, record_count=1)
        segments = wal.stats().segment_count
    assert segments >= 10  # (about 4,300 frames a segment)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        with WriteAheadLog.open(tmp_path / "wal", config) as reopened:
            peak = tracemalloc.get_traced_memory()[1] - before
            assert reopened.stats().backlog_records == frames
    finally:
        tracemalloc.stop()
    # Nothing a frame: the spans of a whole segment are not kept even while it is read (about
    # 40 KB here, whatever the log holds). Every segment's spans were 2.2 MB here (36 B a
    # frame, before 2026-11-29); then one segment's spans and 256 frames copied out, 400 KB.
    assert peak < 2 * frames, f"opening peaked at {peak / frames:.1f} bytes a frame ({peak} bytes)"


def _frame(offset: int, topic: bytes, payload: bytes, records: int = 1) -> bytes:
    header = encode_frame_header(offset, topic, 0, len(payload), crc32c(payload), records, 7)
    return header + payload


# A segment's contents: frames with offsets that mostly follow each other (some repeat or go
# back), some bytes overwritten, sometimes cut short.
_segment_contents = st.tuples(
    st.lists(
        st.tuples(
            st.integers(-2, 3),
            st.sampled_from([b"t", b"orders"]),
            st.binary(max_size=40),
            st.sampled_from([1, 1, 1, 2, 5]),
        ),
        max_size=40,
    ),
    st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=6)), max_size=3),
    st.integers(0, 60),
)


@given(_segment_contents)
def test_the_scanner_finds_what_a_frame_at_a_time_finds(
    contents: tuple[list[tuple[int, bytes, bytes, int]], list[tuple[int, bytes]], int],
) -> None:
    """The compiled scan takes runs of valid frames; where it stops (damage, a frame whose
    offset does not follow) is scanned a frame at a time: the scan is the one a frame at a
    time gives, spans, damage and summary."""
    steps, overwrites, cut = contents
    data = bytearray(encode_segment_header(100))
    offset = 99
    for step, topic, payload, records in steps:
        offset = max(0, offset + step)
        data += _frame(offset, topic, payload, records)
    for position, replacement in overwrites:
        at = 16 + position % max(1, len(data) - 16)
        data[at : at + len(replacement)] = replacement
    del data[len(data) - min(cut, len(data) - 16) :]
    with pytest.MonkeyPatch.context() as patch, _tmp_file(bytes(data)) as path:
        fast = scan_segment(path, 100)
        opening = scan_segment(path, 100, summary_of_whole=True)
        patch.setattr(scan_module, "scan_spans", lambda *args: (b"", b"", 0, args[1], args[2]))
        slow = scan_segment(path, 100)
    summary = ("frames", "first_offset", "last_offset", "valid_end", "frame_bytes")
    for scan in (fast, opening):
        assert scan.damage == slow.damage and scan.tail_frames == slow.tail_frames
        assert [getattr(scan, name) for name in summary] == [
            getattr(slow, name) for name in summary
        ]
        assert list(scan.runs) == list(slow.runs)
    assert list(fast.spans) == list(slow.spans)
    assert list(opening.spans) == ([] if slow.whole else list(slow.spans))
    assert slow.frames == len(slow.spans)
    assert slow.frame_bytes == sum(span.end - span.start for span in slow.spans)
    if slow.spans:
        assert (slow.first_offset, slow.last_offset) == (
            slow.spans[0].offset,
            slow.spans[-1].offset,
        )
        assert slow.valid_end == slow.spans[-1].end


def test_a_frame_whose_offset_does_not_follow_is_damage() -> None:
    data = encode_segment_header(0) + b"".join(
        _frame(offset, b"t", b"x" * 10) for offset in (0, 1, 2, 1, 3, 4)
    )
    with _tmp_file(data) as path:
        scan = scan_segment(path, 0)
    assert [span.offset for span in scan.spans] == [0, 1, 2, 3, 4]
    assert [(d.problem, d.resynced) for d in scan.damage] == [("offset 1 does not follow 2", True)]


@contextlib.contextmanager
def _tmp_file(data: bytes) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "00000000000000000000.seg"
        path.write_bytes(data)
        yield path
