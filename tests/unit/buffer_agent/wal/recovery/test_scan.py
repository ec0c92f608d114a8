"""A segment's spans, held in arrays, read as the list of ``FrameSpan`` they stand for."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from durable_producer.buffer_agent.wal.recovery.damage import _consecutive
from durable_producer.buffer_agent.wal.recovery.scan import FrameSpan, Spans

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


@given(_spans, st.integers(-40, 40), st.integers(-40, 40), st.integers(-3, 3).filter(bool))
def test_spans_read_as_the_list_they_stand_for(
    listed: list[FrameSpan], index: int, stop: int, step: int
) -> None:
    spans = Spans()
    for span in listed:
        spans.add(span.offset, span.start, span.end, span.record_count)
    assert len(spans) == len(listed) and bool(spans) == bool(listed)
    assert list(spans) == listed
    assert spans[index:stop:step] == listed[index:stop:step]
    if -len(listed) <= index < len(listed):
        assert spans[index] == listed[index]
    assert list(spans.record_counts()) == [(span.offset, span.record_count) for span in listed]
    assert spans.frame_bytes() == sum(span.end - span.start for span in listed)


@given(st.sets(st.integers(0, 60)))
def test_consecutive_offsets_become_ranges(offsets: set[int]) -> None:
    ranges = _consecutive(sorted(offsets))
    assert {offset for first, last in ranges for offset in range(first, last + 1)} == offsets
    assert all(later[0] > earlier[1] + 1 for earlier, later in pairwise(ranges))
