"""The delivery marks file: what Kafka is known to hold, kept for the run after a crash.

``state/delivery-marks`` lets the next run count exactly which of the records it sends again
Kafka already has (``replay_accounting``). It holds one ``DeliveryMarks`` record:

- ``checkpoint``: the WAL checkpoint when it was written (a file older than the WAL's
  checkpoint history, e.g. beside a recreated WAL, is ignored);
- ``delivered_below``: every frame below this WAL offset is in Kafka;
- ``partition_delivered``: per topic and partition, every frame of that partition up to
  this offset is in Kafka;
- ``sent_below``: no frame at or above this offset was ever handed to a Kafka client. It is
  written *before* the forwarder produces beyond it, so after a crash it is never too low.

Format: two slots of ``SLOT_BYTES`` written alternately in place (no rename, no new block
once the file exists: it is preallocated), each ``MAGIC``, a sequence number, the payload's
length and CRC-32, then the payload (JSON). The valid slot with the higher sequence wins; a
torn or missing file only makes the next run count the replayed records as *possible*
duplicates instead of certain ones. Writes go to the page cache (no fsync): they survive a
process crash, not a node crash.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MARKS_FILE = "delivery-marks"
MAGIC = b"DPM1"
SLOT_BYTES = 32 * 1024
_HEADER = struct.Struct(">4sQII")  # magic, sequence, payload length, payload CRC-32


@dataclass(frozen=True, slots=True)
class DeliveryMarks:
    checkpoint: int = 0
    delivered_below: int = 0
    sent_below: int = 0
    partition_delivered: dict[tuple[str, int], int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "checkpoint": self.checkpoint,
                "delivered_below": self.delivered_below,
                "sent_below": self.sent_below,
                "partitions": [
                    [topic, partition, offset]
                    for (topic, partition), offset in self.partition_delivered.items()
                ],
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes) -> DeliveryMarks:
        entry = json.loads(data)
        return DeliveryMarks(
            checkpoint=int(entry["checkpoint"]),
            delivered_below=int(entry["delivered_below"]),
            sent_below=int(entry["sent_below"]),
            partition_delivered={
                (str(topic), int(partition)): int(offset)
                for topic, partition, offset in entry["partitions"]
            },
        )


def read_marks(state_dir: Path | None) -> DeliveryMarks | None:
    """The newest valid record, or None (no file, or neither slot is intact)."""
    if state_dir is None:
        return None
    try:
        data = (Path(state_dir) / MARKS_FILE).read_bytes()
    except OSError:
        return None
    best: tuple[int, DeliveryMarks] | None = None
    for start in (0, SLOT_BYTES):
        slot = data[start : start + SLOT_BYTES]
        if len(slot) < _HEADER.size:
            continue
        magic, sequence, length, crc = _HEADER.unpack_from(slot)
        payload = slot[_HEADER.size : _HEADER.size + length]
        if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
            continue
        try:
            marks = DeliveryMarks.decode(payload)
        except (ValueError, KeyError, TypeError):
            continue
        if best is None or sequence > best[0]:
            best = (sequence, marks)
    return None if best is None else best[1]


class MarksFile:
    """Writes ``DeliveryMarks`` in place. A failing write (full disk, I/O error) is logged
    once and skipped: it costs exactness of the next run's duplicate count, nothing else."""

    def __init__(self, state_dir: Path | None) -> None:
        self._path = None if state_dir is None else Path(state_dir) / MARKS_FILE
        self._fd: int | None = None
        self._sequence = 0
        self._failed = False

    def write(self, marks: DeliveryMarks) -> bool:
        if self._path is None:
            return False
        payload = marks.encode()
        if len(payload) > SLOT_BYTES - _HEADER.size:
            # Too many partitions in flight: keep the global marks, drop the per-partition ones.
            marks = DeliveryMarks(marks.checkpoint, marks.delivered_below, marks.sent_below)
            payload = marks.encode()
        try:
            fd = self._open()
            self._sequence += 1
            record = _HEADER.pack(MAGIC, self._sequence, len(payload), zlib.crc32(payload))
            os.pwrite(fd, record + payload, (self._sequence % 2) * SLOT_BYTES)
        except OSError as error:
            if not self._failed:
                log.warning(
                    "cannot write %s (%s): duplicates replayed after a crash will be counted"
                    " as possible rather than certain",
                    self._path,
                    error,
                )
            self._failed = True
            return False
        self._failed = False
        return True

    def _open(self) -> int:
        if self._fd is None:
            assert self._path is not None
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < 2 * SLOT_BYTES:
                    os.posix_fallocate(fd, 0, 2 * SLOT_BYTES)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            self._sequence = max(self._sequence, self._newest_sequence())
        return self._fd

    def _newest_sequence(self) -> int:
        assert self._fd is not None
        newest = 0
        for start in (0, SLOT_BYTES):
            header = os.pread(self._fd, _HEADER.size, start)
            if len(header) == _HEADER.size and header[:4] == MAGIC:
                newest = max(newest, _HEADER.unpack(header)[1])
        return newest

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
