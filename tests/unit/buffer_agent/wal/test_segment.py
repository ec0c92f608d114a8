"""A Segment owns one file: creation, appends, roll-back, sealing, deletion; and the log rolls
a failed group back across segment boundaries."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import SEGMENT_HEADER_SIZE, encode_segment_header
from durable_producer.buffer_agent.wal import AppendItem, WalFullError, WriteAheadLog
from durable_producer.buffer_agent.wal import segment as segment_module
from durable_producer.buffer_agent.wal.segment import Segment, SegmentPolicy, list_segments
from support.wal_helpers import SMALL, payload_for

POLICY = SegmentPolicy(sync=True, page_cache_window=None)


def test_a_new_segment_holds_its_header_and_takes_appends(tmp_path: Path) -> None:
    segment = Segment.create(tmp_path, 1742, POLICY)
    assert segment.path.name == "00000000000000001742.seg"
    assert segment.active and segment.size == SEGMENT_HEADER_SIZE
    assert segment.path.read_bytes() == encode_segment_header(1742)
    assert segment.write([b"abc", memoryview(b"defg")]) == 7
    assert segment.size == SEGMENT_HEADER_SIZE + 7
    segment.truncate(SEGMENT_HEADER_SIZE + 3)
    segment.seal()
    assert not segment.active
    assert segment.path.read_bytes() == encode_segment_header(1742) + b"abc"
    assert segment.view(sealed=True).visible_end == SEGMENT_HEADER_SIZE + 3
    segment.delete()
    assert not segment.path.exists()


def test_creating_a_segment_that_exists_fails_and_keeps_the_file(tmp_path: Path) -> None:
    Segment.create(tmp_path, 0, POLICY).seal()
    with pytest.raises(FileExistsError):
        Segment.create(tmp_path, 0, POLICY)
    assert [base for base, _ in list_segments(tmp_path)] == [0]


def test_a_recovered_segment_is_reactivated_for_appends(tmp_path: Path) -> None:
    Segment.create(tmp_path, 5, POLICY).seal()
    segment = Segment(5, tmp_path / "00000000000000000005.seg", SEGMENT_HEADER_SIZE, POLICY)
    assert not segment.active
    segment.activate()
    segment.write([b"more"])
    segment.close()
    assert segment.path.read_bytes() == encode_segment_header(5) + b"more"


def test_a_write_failing_in_a_new_segment_rolls_the_whole_group_back(
    wal_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's first frames went to the old segment, the rest failed in a new one."""
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        wal.append("t", 0, payload_for(0, 1000))
        size_before = wal.stats().size_bytes
        real_pwritev = os.pwritev
        calls = 0

        def failing_second_write(fd: int, buffers: list[bytes], offset: int) -> int:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError(errno.ENOSPC, "injected: no space left")
            return real_pwritev(fd, buffers, offset)

        monkeypatch.setattr(segment_module.os, "pwritev", failing_second_write)
        group = [AppendItem("t", 0, payload_for(i, 3000)) for i in range(1, 4)]
        with pytest.raises(WalFullError, match="rolled back"):
            wal.append_many(group)
        monkeypatch.undo()
        assert calls == 2, "the group spanned two segments"
        assert wal.stats().size_bytes == size_before
        assert wal.next_offset == 1
        assert len(list_segments(wal_dir)) == 1, "the new segment was removed"
        assert list_segments(wal_dir)[0][1].stat().st_size == size_before
        assert wal.append_many(group) == [1, 2, 3]
        frames = wal.reader(0).poll(10)
        assert [f.offset for f in frames] == [0, 1, 2, 3]
        assert all(f.payload == payload_for(f.offset, len(f.payload)) for f in frames)
        assert [len(f.payload) for f in frames] == [1000, 3000, 3000, 3000]


def test_a_failed_rotation_leaves_the_old_segment_taking_appends(
    wal_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with WriteAheadLog.open(wal_dir, SMALL) as wal:
        wal.append("t", 0, payload_for(0, 3000))
        wal.append("t", 0, payload_for(1, 3000))

        def no_space(*args: object) -> Segment:
            raise OSError(errno.ENOSPC, "injected: no space for a new segment")

        monkeypatch.setattr(Segment, "create", no_space)
        with pytest.raises(WalFullError):
            wal.append("t", 0, payload_for(2, 3000))
        assert wal.append("t", 0, payload_for(2, 500)) == 2, "the sealed segment is active again"
        monkeypatch.undo()
        assert wal.append("t", 0, payload_for(3, 3000)) == 3
        assert [f.offset for f in wal.reader(0).poll(10)] == [0, 1, 2, 3]
        assert wal.stats().segment_count == 2
