"""The checkpoint: "every frame below this offset has been delivered to Kafka"."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

from crc32c import crc32c

from ..atomic_file import write_atomic

CHECKPOINT_FILE = "checkpoint"
_MAGIC = b"DPWALCK1"
_LAYOUT = struct.Struct(">8sQI")

log = logging.getLogger(__name__)


def write_checkpoint(directory: Path, offset: int) -> None:
    body = _MAGIC + struct.pack(">Q", offset)
    write_atomic(directory / CHECKPOINT_FILE, _LAYOUT.pack(_MAGIC, offset, crc32c(body)))


def read_checkpoint(directory: Path) -> int | None:
    """The stored checkpoint, or None when there is none or it is unreadable.

    An unreadable checkpoint is not fatal: replaying from the oldest segment only adds
    duplicates, never loses data. The caller logs what it falls back to.
    """
    path = directory / CHECKPOINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _LAYOUT.size:
        log.warning(
            "checkpoint file %s has %d bytes, expected %d: ignoring it",
            path,
            len(data),
            _LAYOUT.size,
        )
        return None
    magic, offset, crc = _LAYOUT.unpack(data)
    if magic != _MAGIC or crc32c(data[:16]) != crc:
        log.warning("checkpoint file %s is corrupt (bad magic or CRC): ignoring it", path)
        return None
    return offset
