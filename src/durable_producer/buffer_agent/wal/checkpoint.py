"""The checkpoint: "every frame below this offset has been delivered to Kafka".

Two slots in a preallocated file, written alternately in place (LMDB's meta-page scheme; the
layout is in ``format.py``): a torn write can only damage the slot being written, so the other
still holds the previous checkpoint. Unlike temp-file-and-rename, an in-place write needs no
new disk blocks, so the checkpoint that frees space still works when the disk is full.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from crc32c import crc32c

from .atomic_file import fsync_directory
from .format import (
    CHECKPOINT_FILE,
    CHECKPOINT_FILE_SIZE,
    CHECKPOINT_MAGIC,
    CHECKPOINT_SLOT,
    CHECKPOINT_SLOT_HEAD,
    CHECKPOINT_SLOT_SPACING,
)

log = logging.getLogger(__name__)


def _decode_slot(data: bytes) -> tuple[int, int] | None:
    """(sequence, offset) of a valid slot, else None."""
    if len(data) < CHECKPOINT_SLOT.size:
        return None
    magic, sequence, offset, crc = CHECKPOINT_SLOT.unpack_from(data)
    if magic != CHECKPOINT_MAGIC or crc32c(data[: CHECKPOINT_SLOT_HEAD.size]) != crc:
        return None
    return sequence, offset


def _decode_slots(data: bytes) -> list[tuple[int, int] | None]:
    size = CHECKPOINT_SLOT.size
    return [_decode_slot(data[i : i + size]) for i in (0, CHECKPOINT_SLOT_SPACING)]


def read_checkpoint(directory: Path) -> int | None:
    """The stored checkpoint, or None when there is none or both slots are unreadable.

    An unreadable checkpoint is not fatal: replaying from the oldest segment only adds
    duplicates, never loses data. The caller logs what it falls back to.
    """
    path = directory / CHECKPOINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    slots = _decode_slots(data)
    valid = [slot for slot in slots if slot is not None]
    if not valid:
        if any(data):
            log.warning("checkpoint file %s is corrupt (no valid slot): ignoring it", path)
        return None
    return max(valid)[1]


class CheckpointFile:
    """The open checkpoint file; ``write`` is crash-safe and allocates nothing."""

    def __init__(self, directory: Path) -> None:
        path = directory / CHECKPOINT_FILE
        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        data = os.pread(self._fd, CHECKPOINT_FILE_SIZE, 0)
        slots = _decode_slots(data)
        self._sequence = max((slot[0] for slot in slots if slot is not None), default=0)
        if len(data) < CHECKPOINT_FILE_SIZE:
            os.posix_fallocate(self._fd, 0, CHECKPOINT_FILE_SIZE)
            os.fsync(self._fd)
        if not existed:
            fsync_directory(directory)

    def write(self, offset: int) -> None:
        self._sequence += 1
        head = CHECKPOINT_SLOT_HEAD.pack(CHECKPOINT_MAGIC, self._sequence, offset)
        slot = CHECKPOINT_SLOT.pack(CHECKPOINT_MAGIC, self._sequence, offset, crc32c(head))
        os.pwrite(self._fd, slot, (self._sequence % 2) * CHECKPOINT_SLOT_SPACING)
        os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
