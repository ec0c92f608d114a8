"""A segment's spans, held in arrays, read as the list of ``FrameSpan`` they stand for; what
recovery keeps of a whole segment (its summary, not its spans)."""

from __future__ import annotations

import gc
import tracemalloc
from itertools import pairwise
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.recovery.scan import FrameSpan, Spans
from durable_producer.buffer_agent.wal.stats import record_runs
from support.wal_helpers import payload_for

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
    assert list(spans.record_counts()) == [(span.offset, span.record_count) for span in listed]
    assert spans.frame_bytes() == sum(span.end - span.start for span in listed)
    assert list(spans.starts()) == [span.start for span in listed]


@given(st.dictionaries(st.integers(0, 60), st.integers(0, 3)))
def test_record_runs_stand_for_the_frames_and_their_offsets(frames: dict[int, int]) -> None:
    runs = record_runs(sorted(frames.items()))
    assert {
        first + index: count for first, length, count in runs for index in range(length)
    } == frames
    ranges = runs.ranges()
    assert {offset for first, last in ranges for offset in range(first, last + 1)} == set(frames)
    assert all(later[0] > earlier[1] + 1 for earlier, later in pairwise(ranges))
    assert len(runs) <= len(frames)


def test_opening_holds_one_segments_spans_at_a_time(tmp_path: Path) -> None:
    """A restart over a large backlog of one-record frames (a linger.ms=0 client while Kafka
    was away): opening's peak memory does not grow with the log's frames. It held every
    segment's spans until it had decided (about 60 bytes a frame at the peak: 6 million
    frames filled the agent's default 512 MiB), so a large enough backlog killed the agent
    at each start."""
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
    per_frame = peak / frames
    assert per_frame < 12, f"opening peaked at {per_frame:.1f} bytes a frame ({peak} bytes)"
