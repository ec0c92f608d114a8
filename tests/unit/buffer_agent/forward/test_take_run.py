"""The compiled take of a merge run does exactly what the Python reference does.

``PartitionQueue.next_batch`` takes the frames it merges into one batch with
``partition_queue.take_run`` (C, ``_number_frames.c``); ``take_run_python`` is the reference.
Both run here on equal copies of the same deque of ``Pending`` tuples: batches of varied
lengths (bytes, and views of an older agent's frame of several), attributes that change
inside the deque, budgets that stop a run anywhere (and runs whose first frame alone is over
the budget).
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.forward.partition_queue import (
    MERGE_SPARE,
    Pending,
    take_run,
    take_run_python,
)

compiled = pytest.importorskip("durable_producer.buffer_agent.forward._number_frames")


def pending(offset: int, length: int, records: int, attributes: int, view: bool) -> Pending:
    batch: bytes | memoryview = bytes([offset % 251]) * length
    if view:
        batch = memoryview(b"\x01" * 3 + bytes(batch))[3:]
    return (offset, batch, records, offset * 7, attributes, 0, False, 1_000 + offset)


frames_strategy = st.lists(
    st.tuples(
        st.integers(61, 400),  # a batch's length
        st.integers(1, 5),  # its records
        st.sampled_from([0, 0, 0, 8]),  # attributes: mostly the same, the timestamp type apart
        st.booleans(),  # a view, not bytes
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(frames=frames_strategy, data=st.data())
def test_compiled_take_matches_the_reference(
    frames: list[tuple[int, int, int, bool]], data: st.DataObject
) -> None:
    tuples = [pending(offset, *fields) for offset, fields in enumerate(frames)]
    # A budget anywhere, or at one byte either side of a run's merged size (the edges).
    sizes = [frames[0][0]]
    for length, *_ in frames[1:]:
        sizes.append(sizes[-1] + length - MERGE_SPARE)
    edge = st.sampled_from(sizes).flatmap(lambda size: st.sampled_from([size - 1, size, size + 1]))
    max_bytes = data.draw(st.one_of(st.integers(0, 4_000), edge))
    ours, theirs = deque(tuples), deque(tuples)
    taken, batches, records, stored = compiled.take_run(ours, max_bytes, MERGE_SPARE)
    expected = take_run_python(theirs, max_bytes, MERGE_SPARE)
    assert (taken, batches, records, stored) == expected
    assert list(ours) == list(theirs), "the same frames are left"
    assert all(a is b for a, b in zip(taken, expected[0], strict=True)), "the frames themselves"
    assert taken, "the first frame is taken whatever its size"
    assert records == sum(frame[2] for frame in taken)
    assert stored == sum(len(frame[1]) for frame in taken)


def test_the_queue_takes_runs_with_the_compiled_code_where_built() -> None:
    from durable_producer.buffer_agent.forward import partition_queue

    assert partition_queue.take_run is compiled.take_run
    frames = deque([pending(0, 100, 1, 0, False), pending(1, 100, 1, 0, False)])
    assert [frame[0] for frame in take_run(frames, 1 << 20, MERGE_SPARE)[0]] == [0, 1]


def test_an_empty_deque_or_an_item_that_is_no_pending_is_refused_and_nothing_is_taken() -> None:
    with pytest.raises(IndexError):
        compiled.take_run(deque(), 1 << 20, MERGE_SPARE)
    good = pending(0, 100, 1, 0, False)
    for bad in [(1, 2), "not a tuple", (*good[:7], 1, 2)]:
        frames = deque([good, bad, good])
        with pytest.raises(TypeError):
            compiled.take_run(frames, 1 << 20, MERGE_SPARE)
        assert list(frames) == [good, bad, good], "the walk fails before anything is popped"
