"""The WAL's record backlog: exact under any appends, gaps and checkpoints, and its memory does
not grow a frame at a time."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.frame import AppendItem
from durable_producer.buffer_agent.wal.stats import RecordBacklog
from support.wal_helpers import payload_for, record_runs

# (kind, a, b): ("add", gap before the group, record counts of its frames) or ("forget", how
# far below or beyond the newest frame, unused)
_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.sampled_from([0, 0, 0, 1, 5]),
            st.lists(st.sampled_from([0, 1, 1, 1, 2, 500]), min_size=1, max_size=8),
        ),
        st.tuples(st.just("forget"), st.integers(-12, 3), st.just([])),
    ),
    max_size=60,
)


def _prepared(counts: list[int]) -> list[tuple[AppendItem, bytes, int, int]]:
    return [(AppendItem("t", 0, b"", count), b"t", 0, 0) for count in counts]


@given(
    st.lists(st.tuples(st.sampled_from([0, 0, 3]), st.sampled_from([0, 1, 1, 7]))),
    st.integers(0, 40),
    _steps,
)
@settings(max_examples=300, deadline=None)
def test_the_backlog_is_the_records_of_the_frames_at_or_above_the_checkpoint(
    opened: list[tuple[int, int]], checkpoint: int, steps: list[tuple[str, int, list[int]]]
) -> None:
    """Against a frame-by-frame model: frames found at open (with gaps), groups appended
    after gaps or not, checkpoints inside runs, on their edges, behind and beyond the end."""
    model: dict[int, int] = {}
    offset = 0
    for gap, count in opened:
        offset += gap
        model[offset] = count
        offset += 1
    backlog = RecordBacklog(record_runs(sorted(model.items())), checkpoint)
    forgotten = checkpoint
    model = {at: count for at, count in model.items() if at >= checkpoint}
    for kind, shift, counts in steps:
        if kind == "add":
            offset = max(offset + shift, forgotten)  # (the log's checkpoint <= its next offset)
            backlog.add(offset, _prepared(counts))
            for count in counts:
                model[offset] = count
                offset += 1
        else:
            below = max(0, offset + shift)
            backlog.forget_below(below)
            forgotten = max(forgotten, below)
            model = {at: count for at, count in model.items() if at >= below}
        expected = sum(model.values())
        assert backlog.records == expected


def test_forgotten_runs_are_cut_off_and_counting_goes_on() -> None:
    backlog = RecordBacklog([], 0)
    for offset in range(20_000):
        backlog.add(offset, _prepared([offset % 2 + 1]))  # a run a frame
        if offset % 1_000 == 999:
            backlog.forget_below(offset - 10)
    assert backlog.records == sum(at % 2 + 1 for at in range(19_989, 20_000))
    assert len(backlog._starts) < 8_000  # cut off, not 20,000 runs kept


def _traced_growth(action: Callable[[], object]) -> int:
    """Bytes still allocated after ``action`` (what it returns is kept too)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    kept = action()
    gc.collect()
    growth = tracemalloc.get_traced_memory()[0] - before
    del kept
    return growth


def test_one_record_frames_cost_the_log_no_memory_each(tmp_path: Path) -> None:
    """A linger.ms=0 client's frames while Kafka is away, and the log reopened over them: the
    log's memory does not grow with them (it grew 105 bytes a frame, a third of the WAL)."""
    frames = 40_000
    config = WalConfig(max_bytes=1 << 30, fsync=FsyncPolicy.NEVER)
    payload = payload_for(0, 200)
    tracemalloc.start()
    try:
        with WriteAheadLog.open(tmp_path / "wal", config) as wal:
            wal.append("t", 0, payload, record_count=1)  # the first segment and its objects

            def append_all() -> None:
                for _ in range(frames):
                    wal.append("t", 0, payload, record_count=1)

            appended = _traced_growth(append_all)
            assert wal.stats().backlog_records == frames + 1
        reopened: list[WriteAheadLog] = []
        opened = _traced_growth(
            lambda: reopened.append(WriteAheadLog.open(tmp_path / "wal", config))
        )
        try:
            assert reopened[0].stats().backlog_records == frames + 1
        finally:
            reopened[0].close()
    finally:
        tracemalloc.stop()
    assert appended < 256 * 1024, f"{appended / frames:.1f} bytes a frame kept while appending"
    assert opened < 512 * 1024, f"{opened / frames:.1f} bytes a frame kept after reopening"
