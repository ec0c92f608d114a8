"""The dead-letter area keeps refused records exactly, survives torn writes, tracks re-sends."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.dead_letter import (
    DEAD_LETTERS_FILE,
    DeadLetterStore,
    list_dead_letters,
)


def _add_sample(store: DeadLetterStore, wal_offset: int, index: int) -> None:
    store.add_record(
        wal_offset=wal_offset,
        topic="orders",
        partition=2,
        record_index=index,
        timestamp_ms=1_700_000_000_123,
        key=None,
        value=b"\x00\xffbinary" * 3,
        headers=[("trace", b"t"), ("none", None)],
        reason="Broker: Message size too large",
        error_code="MSG_SIZE_TOO_LARGE",
    )


def test_records_round_trip_exactly(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path / "dead-letter")
    _add_sample(store, 7, 0)
    store.add_frame(
        wal_offset=8,
        topic="orders",
        partition=0,
        payload=b"not a batch",
        reason="invalid record batch",
        error_code="INVALID_RECORD",
    )

    letters = list_dead_letters(tmp_path / "dead-letter")

    assert store.added == 2
    assert [letter.id for letter in letters] == ["7-0", "8-frame"]
    record, frame = letters
    assert record.key is None
    assert record.value == b"\x00\xffbinary" * 3
    assert record.headers == (("trace", b"t"), ("none", None))
    assert record.timestamp_ms == 1_700_000_000_123
    assert record.partition == 2 and record.error_code == "MSG_SIZE_TOO_LARGE"
    assert not record.is_frame
    assert frame.is_frame and frame.payload == b"not a batch"


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path)
    _add_sample(store, 1, 0)
    with (tmp_path / DEAD_LETTERS_FILE).open("ab") as file:
        file.write(b'{"id":"2-0","recorded_')

    assert [letter.id for letter in list_dead_letters(tmp_path)] == ["1-0"]
    _add_sample(store, 3, 0)  # appends after the torn line remain readable
    assert [letter.id for letter in list_dead_letters(tmp_path)] == ["1-0", "3-0"]


def test_resent_letters_are_hidden_unless_asked_for(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path)
    _add_sample(store, 1, 0)
    _add_sample(store, 1, 1)
    store.mark_resent("1-0")

    assert [letter.id for letter in list_dead_letters(tmp_path)] == ["1-1"]
    everything = list_dead_letters(tmp_path, include_resent=True)
    assert [(letter.id, letter.resent) for letter in everything] == [
        ("1-0", True),
        ("1-1", False),
    ]


def test_missing_directory_lists_nothing(tmp_path: Path) -> None:
    assert list_dead_letters(tmp_path / "absent") == []


def test_a_letter_the_disk_has_no_room_for_is_cut_back_not_left_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DeadLetterStore(tmp_path)
    _add_sample(store, 1, 0)
    size = (tmp_path / DEAD_LETTERS_FILE).stat().st_size
    real_write = os.write
    calls = [0]

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        _add_sample(store, 2, 0)
    monkeypatch.undo()
    assert (tmp_path / DEAD_LETTERS_FILE).stat().st_size == size
    assert store.added == 1, "a letter not written is not counted"
    _add_sample(store, 2, 0)
    assert [letter.id for letter in list_dead_letters(tmp_path)] == ["1-0", "2-0"]
