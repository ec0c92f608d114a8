"""The checkpoint: "every frame below this offset has been delivered to Kafka".

Two slots in a preallocated file, written alternately in place (``volume/slot_file.py``; the layout
is in ``volume/format.py``): a torn write can only damage the slot being written, so the other still
holds the previous checkpoint. Unlike temp-file-and-rename, an in-place write needs no new
disk blocks, so the checkpoint that frees space still works when the disk is full.
"""

from __future__ import annotations

import logging
from pathlib import Path

from durable_producer.buffer_agent.volume.format import CHECKPOINT_FILE, CHECKPOINT_MAGIC
from durable_producer.buffer_agent.volume.slot_file import SlotFile, read_slots

log = logging.getLogger(__name__)


def read_checkpoint(directory: Path) -> int | None:
    """The stored checkpoint, or None when there is none or both slots are unreadable.

    An unreadable checkpoint is not fatal: replaying from the oldest segment only adds
    duplicates, never loses data. The caller logs what it falls back to.
    """
    path = directory / CHECKPOINT_FILE
    if path.exists() and not path.is_file():
        return None  # not a checkpoint: recovery moves it aside (``damage.py``) and says so
    values = read_slots(path, CHECKPOINT_MAGIC, 1)
    if values is None:
        if checkpoint_damaged(directory):
            log.warning("checkpoint file %s is corrupt (no valid slot): ignoring it", path)
        return None
    return values[0]


def checkpoint_damaged(directory: Path) -> bool:
    """The checkpoint is there and unreadable: written (not the zeros it is made with, kept
    until a first frame is delivered: no damage) with no valid slot, or no file at all."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return False
    if not path.is_file():
        return True
    return read_slots(path, CHECKPOINT_MAGIC, 1) is None and any(path.read_bytes())


class CheckpointFile:
    """The open checkpoint file; ``write`` is crash-safe and allocates nothing."""

    def __init__(self, directory: Path) -> None:
        self._slots = SlotFile(directory / CHECKPOINT_FILE, CHECKPOINT_MAGIC, 1)

    def write(self, offset: int) -> None:
        """Store ``offset`` durably (fdatasync); ``OSError`` if the disk failed."""
        self._slots.write((offset,))

    def close(self) -> None:
        self._slots.close()
