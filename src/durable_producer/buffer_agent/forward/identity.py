"""The forwarding producer's identity on the volume: producer id, epochs, sequences, marks.

``state/producer-identity`` lets the run after a crash send the frames Kafka may not have with
the same producer id, epoch and sequence numbers as before, so that the brokers recognise the
copies they hold (and its leaders can say, with DescribeProducers, which ones those are). It
holds one ``IdentityRecord``; its fields, bytes, when it is fdatasync'ed and what a damaged
one becomes: ``volume/format.py``. ``sent_below`` is written *before* the forwarder sends
beyond it, so after a crash it is never too low. A partition's ``gaps`` entry (its leader was
found not to know the producer, or a dead-lettered batch may be in Kafka) or another topic id
makes the next run take a new epoch for it instead of asking its leader (``Anchor``).
``written_ms``: a broker forgets an idle producer after ``producer.id.expiration.ms``.

The record is valid only for the WAL it names (``wal/log_id.py``) at a checkpoint between
``written_checkpoint`` and ``delivered_below`` (it is written before every checkpoint).
Otherwise the next run takes a new producer id and counts the frames it sends again below
``sent_below`` as possible duplicates.

An ordinary write survives a process crash, not a node crash, after which the brokers' answers
(an epoch they know, sequences out of order) are resolved as ``partition_queue`` describes. A
damaged file never stops the agent: it is moved aside (``state_file.set_aside``) and the
forwarder takes a new producer id.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from durable_producer.buffer_agent.volume.atomic_file import write_atomic
from durable_producer.buffer_agent.volume.state_file import StateDamage, set_aside
from durable_producer.buffer_agent.wal.log_id import LogId

log = logging.getLogger(__name__)

IDENTITY_FILE = "producer-identity"
LEGACY_MARKS_FILE = "delivery-marks"
"""The per-record forwarder's marks (no sequences): ignored, removed on the first write."""
MAGIC = b"DPID"
SLOT_BYTES = 64 * 1024
_HEADER = struct.Struct(">4sQII")  # magic, sequence, payload length, payload CRC-32


@dataclass(frozen=True, slots=True)
class Anchor:
    producer_id: int
    epoch: int
    offset: int
    sequence: int
    topic_id: str = ""
    """The topic's id this numbering was taken for ("" unknown); another id now: the topic
    was created again, and a new epoch is taken instead of asking its leader."""
    gap: bool = False
    """Its leader took a batch past one it refused (``PartitionQueue.gap``): a new epoch."""
    gap_why: str = ""
    """Why, where not for the leader's forgetting (``PartitionQueue.gap_why``)."""


@dataclass(frozen=True, slots=True)
class IdentityRecord:
    producer_id: int
    epoch: int
    delivered_below: int = 0
    sent_below: int = 0
    partitions: dict[tuple[str, int], Anchor] = field(default_factory=dict)
    written_checkpoint: int = 0
    """The WAL checkpoint when it was written (a record from before a checkpoint it cannot
    have seen, e.g. beside a recreated WAL, is ignored)."""
    written_ms: int = 0
    wal_id: str = ""
    """The id of the WAL it was written for ("": by an agent before ids)."""

    def fits(self, checkpoint: int, log_id: LogId) -> bool:
        """Whether it speaks of the WAL ``log_id`` names at ``checkpoint`` (module docstring)."""
        return (
            log_id.named_by(self.wal_id)
            and self.producer_id >= 0
            and self.delivered_below >= checkpoint >= self.written_checkpoint
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "producer_id": self.producer_id,
                "epoch": self.epoch,
                "delivered_below": self.delivered_below,
                "sent_below": self.sent_below,
                "written_checkpoint": self.written_checkpoint,
                "written_ms": self.written_ms,
                "wal_id": self.wal_id,
                "partitions": [
                    [topic, partition, a.producer_id, a.epoch, a.offset, a.sequence]
                    for (topic, partition), a in self.partitions.items()
                ],
                # apart, so that an agent from before them still reads the record
                "topic_ids": [
                    [topic, partition, a.topic_id]
                    for (topic, partition), a in self.partitions.items()
                    if a.topic_id
                ],
                "gaps": [list(key) for key, a in self.partitions.items() if a.gap],
                "gap_reasons": [
                    [*key, a.gap_why] for key, a in self.partitions.items() if a.gap and a.gap_why
                ],
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(data: bytes) -> IdentityRecord:
        entry = json.loads(data)
        topic_ids = {(str(t), int(p)): str(i) for t, p, i in entry.get("topic_ids", [])}
        gaps = {(str(t), int(p)) for t, p in entry.get("gaps", [])}
        why = {(str(t), int(p)): str(w) for t, p, w in entry.get("gap_reasons", [])}
        partitions = {}
        for t, p, pid, epoch, offset, sequence in entry["partitions"]:
            key = (str(t), int(p))
            partitions[key] = Anchor(
                int(pid),
                int(epoch),
                int(offset),
                int(sequence),
                topic_ids.get(key, ""),
                key in gaps,
                why.get(key, ""),
            )
        return IdentityRecord(
            producer_id=int(entry["producer_id"]),
            epoch=int(entry["epoch"]),
            delivered_below=int(entry["delivered_below"]),
            sent_below=int(entry["sent_below"]),
            written_checkpoint=int(entry["written_checkpoint"]),
            written_ms=int(entry["written_ms"]),
            wal_id=str(entry.get("wal_id", "")),
            partitions=partitions,
        )


def _slots(data: bytes) -> list[tuple[int, bytes]]:
    size = max(SLOT_BYTES, len(data) // 2)
    found = []
    for start in (0, size):
        head = data[start : start + _HEADER.size]
        if len(head) < _HEADER.size:
            continue
        magic, sequence, length, crc = _HEADER.unpack(head)
        payload = data[start + _HEADER.size : start + _HEADER.size + length]
        if magic == MAGIC and len(payload) == length and zlib.crc32(payload) == crc:
            found.append((sequence, payload))
    return found


FALLBACK = "taking a new producer id (records sent again may be duplicates)"


def load_identity(state_dir: Path) -> tuple[IdentityRecord | None, StateDamage | None]:
    """The newest valid record (None: no file, or damaged) and the damage found, if any.

    A damaged file is moved aside and logged once (``state_file.set_aside``)."""
    path = Path(state_dir) / IDENTITY_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return None, set_aside(path, error.strerror or type(error).__name__, FALLBACK)
    slots = _slots(data)
    for _, payload in sorted(slots, reverse=True):
        try:
            return IdentityRecord.decode(payload), None
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: deep JSON
            continue
    if not data.strip(b"\0"):
        return None, None  # preallocated, never written
    reason = "no valid slot" if not slots else "no slot holds a producer identity"
    return None, set_aside(path, reason, FALLBACK)


class IdentityFile:
    """Writes ``IdentityRecord``s in place. A failing write (full disk, I/O error) is logged
    once and returns False: the next run after a crash then takes a new producer id."""

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(state_dir) / IDENTITY_FILE
        self._fd: int | None = None
        self._slot = SLOT_BYTES
        self._sequence = 0
        self._failed = False

    def write(self, record: IdentityRecord, *, sync: bool = False) -> bool:
        record = replace(record, written_ms=int(time.time() * 1000))
        payload = record.encode()
        try:
            fd = self._open()
            self._sequence += 1
            slot = _HEADER.pack(MAGIC, self._sequence, len(payload), zlib.crc32(payload)) + payload
            if len(slot) > self._slot:
                self._grow(slot)
            else:
                os.pwrite(fd, slot, (self._sequence % 2) * self._slot)
                if sync:
                    os.fdatasync(fd)
        except OSError as error:
            if not self._failed:
                log.warning(
                    "cannot write %s (%s): after a crash the forwarder would take a new producer"
                    " id and count the records it sends again as possible duplicates",
                    self._path,
                    error,
                )
            self._failed = True
            return False
        self._failed = False
        return True

    def _grow(self, slot: bytes) -> None:
        """A new file with larger slots, both holding ``slot`` (written through a rename)."""
        size = 1 << max(len(slot) - 1, SLOT_BYTES - 1).bit_length()
        data = bytearray(2 * size)
        data[: len(slot)] = slot
        data[size : size + len(slot)] = slot
        self.close()
        write_atomic(self._path, bytes(data))
        self._slot = size

    def _open(self) -> int:
        if self._fd is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size < 2 * SLOT_BYTES:
                    os.posix_fallocate(fd, 0, 2 * SLOT_BYTES)
                self._slot = max(SLOT_BYTES, size // 2)
                data = os.pread(fd, 2 * self._slot, 0)
                self._sequence = max([self._sequence, *(sequence for sequence, _ in _slots(data))])
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            legacy = self._path.with_name(LEGACY_MARKS_FILE)
            if legacy.exists():
                legacy.unlink()
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
