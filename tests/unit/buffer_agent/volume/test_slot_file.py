"""Two-slot files (checkpoint, forwarder hint): rewritten in place, never a new block, and a
failed or torn write never costs the previous values."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.volume.format import SLOT_FILE_SIZE, SLOT_SPACING
from durable_producer.buffer_agent.volume.slot_file import SlotFile, read_slots

MAGIC = b"TESTSLT1"


def test_values_round_trip_and_the_file_never_grows(tmp_path: Path) -> None:
    path = tmp_path / "slots"
    slots = SlotFile(path, MAGIC, 2)
    assert slots.values is None
    assert path.stat().st_size == SLOT_FILE_SIZE
    blocks = path.stat().st_blocks
    for value in range(1, 50):
        slots.write((value, value * 10), sync=value % 2 == 0)
    slots.close()
    assert path.stat().st_size == SLOT_FILE_SIZE and path.stat().st_blocks == blocks
    assert read_slots(path, MAGIC, 2) == (49, 490)
    assert SlotFile(path, MAGIC, 2).values == (49, 490)
    assert read_slots(path, b"OTHERMAG", 2) is None
    assert read_slots(tmp_path / "missing", MAGIC, 2) is None


def test_a_torn_slot_leaves_the_previous_values(tmp_path: Path) -> None:
    path = tmp_path / "slots"
    slots = SlotFile(path, MAGIC, 1)
    slots.write((7,))
    slots.write((8,))  # sequence 2: slot at 0
    slots.close()
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert read_slots(path, MAGIC, 1) == (7,)


def test_a_failed_write_retries_the_same_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "slots"
    slots = SlotFile(path, MAGIC, 1)
    slots.write((1,))  # sequence 1: slot at 512
    real_fdatasync = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        slots.write((2,))  # written to slot 0 but not known to be durable
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    slots.write((3,))  # slot 0 again: slot 512 still holds 1
    slots.close()
    data = path.read_bytes()
    assert data[SLOT_SPACING + 8 : SLOT_SPACING + 16] == (1).to_bytes(8, "big")
    assert read_slots(path, MAGIC, 1) == (3,)
