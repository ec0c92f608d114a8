"""A few integers kept in two slots of a preallocated file, rewritten in place.

LMDB's meta-page scheme (the layout is in ``format.py``): write number ``sequence`` goes to
the slot at ``(sequence % 2) * SLOT_SPACING``, so a torn write can only damage the slot being
written and the other still holds the previous values; on reading, the valid slot with the
highest sequence wins. Unlike temp-file-and-rename, an in-place write needs no new disk
block, so the files that let the agent free space (the checkpoint, the forwarder hint) can be
written on a completely full disk. Only creating the file allocates (one block), and that
happens when the agent opens the volume.
"""

from __future__ import annotations

import os
from pathlib import Path

from crc32c import crc32c

from .atomic_file import fsync_directory
from .format import SLOT_FILE_SIZE, SLOT_SPACING, slot_structs


def _decode_slots(data: bytes, magic: bytes, fields: int) -> list[tuple[int, tuple[int, ...]]]:
    """(sequence, values) of each valid slot in ``data``."""
    head, slot = slot_structs(fields)
    found = []
    for start in (0, SLOT_SPACING):
        raw = data[start : start + slot.size]
        if len(raw) < slot.size:
            continue
        stored_magic, sequence, *rest = slot.unpack(raw)
        values, crc = tuple(rest[:-1]), rest[-1]
        if stored_magic == magic and crc32c(raw[: head.size]) == crc:
            found.append((sequence, values))
    return found


def read_slots(path: Path, magic: bytes, fields: int) -> tuple[int, ...] | None:
    """The newest valid values in ``path``; None when there is no file or no valid slot."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    found = _decode_slots(data, magic, fields)
    return max(found)[1] if found else None


class SlotFile:
    """The open file; :meth:`write` allocates nothing (safe on a full disk)."""

    def __init__(self, path: Path, magic: bytes, fields: int) -> None:
        """Open ``path``, creating and preallocating it (zeros, fsynced) if it is new or short.

        Raises ``OSError`` (e.g. ENOSPC) only when the file has to be created or extended.
        """
        self.path = path
        self._magic = magic
        self._head, self._slot = slot_structs(fields)
        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            data = os.pread(self._fd, SLOT_FILE_SIZE, 0)
            found = _decode_slots(data, magic, fields)
            self._sequence = max((sequence for sequence, _ in found), default=0)
            self.values = max(found)[1] if found else None
            """The newest values written (None: none yet)."""
            if len(data) < SLOT_FILE_SIZE:
                # Real zeros rather than fallocate: no unwritten extent to convert later.
                os.pwrite(self._fd, bytes(SLOT_FILE_SIZE - len(data)), len(data))
                os.fsync(self._fd)
            if not existed:
                fsync_directory(path.parent)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, values: tuple[int, ...], *, sync: bool = True) -> None:
        """Store ``values`` in the older slot; fdatasync unless ``sync`` is False.

        After a failure (``OSError``) the next write goes to the same slot again: the other
        one keeps the last values known to be written.
        """
        sequence = self._sequence + 1
        head = self._head.pack(self._magic, sequence, *values)
        slot = head + crc32c(head).to_bytes(4, "big")
        os.pwrite(self._fd, slot, (sequence % 2) * SLOT_SPACING)
        if sync:
            os.fdatasync(self._fd)
        self._sequence = sequence
        self.values = values

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
