"""Frames: encoding one produce batch for an append, decoding it when read back.

The byte layout (magic, length, CRC32C, offset, partition, record count, append time, topic,
payload) is documented in ``volume/format.py``; this module only applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import NamedTuple

from crc32c import crc32c

from durable_producer.buffer_agent.volume.format import (
    FRAME_BODY_HEAD,
    FRAME_MAGIC,
    FRAME_PREFIX,
    HEADER_SIZE,
    MAX_BODY_BYTES,
    MAX_OFFSET,
    MAX_TOPIC_BYTES,
    PREFIX_SIZE,
)

from .errors import FrameTooLargeError


@dataclass(frozen=True, slots=True)
class AppendItem:
    """One frame to append: a record batch for a topic partition."""

    topic: str
    partition: int
    payload: bytes | bytearray | memoryview
    record_count: int = 0


class Frame(NamedTuple):
    """A frame read back from the log (a tuple: one is made per frame read, on the
    forwarder's hot path, where a frozen dataclass cost 4x as much to build)."""

    offset: int
    topic: str
    partition: int
    payload: bytes
    record_count: int
    appended_ms: int


_scan: Callable[..., tuple[list[Frame], int, int, int]] | None
_scan_spans: Callable[[memoryview, int, int, int, bool], tuple[bytes, bytes, int, int, int]] | None
_compiled: ModuleType | None
try:  # built from _frame_scan.c by the package's build (optional: needs a C compiler)
    from . import _frame_scan as _compiled
except ImportError:
    _compiled = None
# Each entry on its own: a module built from an older _frame_scan.c keeps the reader's scan.
_scan = getattr(_compiled, "scan_frames", None)
_scan_spans = getattr(_compiled, "scan_spans", None)


def decode_frames(
    data: bytes | memoryview, pos: int, max_frames: int, max_bytes: int, wanted: int
) -> tuple[list[Frame], int, int, int]:
    """The frames from ``pos`` on, many in one call (C, ``_frame_scan.c``): ``(frames, end,
    wanted, max_bytes left)``. Frames below offset ``wanted`` are skipped; it stops at
    ``max_frames``, once ``max_bytes`` of payload are taken, or at ``end``, the first position
    that holds no whole valid frame (or one whose offset is above ``MAX_OFFSET``, which no
    writer of this log made), without saying why: ``decode_frame`` there says what is there.
    Without the compiled module it decodes nothing (``end`` is ``pos``)."""
    if _scan is None:
        return [], pos, wanted, max_bytes
    return _scan(data, pos, max_frames, max_bytes, wanted, Frame)


def scan_spans(
    view: memoryview, pos: int, last_offset: int, max_frames: int, keep_spans: bool
) -> tuple[bytes, bytes, int, int, int]:
    """Recovery's scan (C, ``_frame_scan.c``): the valid frames from ``pos`` on, each offset
    above the one before (the first above ``last_offset``), as numbers: ``(spans, runs,
    frame_bytes, end, last_offset)``; ``spans`` holds four native int64s a frame (offset,
    start, end, record count; empty unless ``keep_spans``), ``runs`` three a run of
    consecutive offsets with one record count (first offset, frames, record count:
    ``stats.RecordRuns``), ``frame_bytes`` the frames' bytes together. It stops after
    ``max_frames`` or at ``end``, the first position that holds no whole valid frame that
    follows, without saying why: ``decode_frame`` there says what is there. Without the
    compiled module it scans nothing (``end`` is ``pos``)."""
    if _scan_spans is None:
        return b"", b"", 0, pos, last_offset
    return _scan_spans(view, pos, last_offset, max_frames, keep_spans)


PreparedFrame = tuple[AppendItem, bytes, int, int]
"""A frame ready to write: the item, its topic as UTF-8, its payload's CRC32C, its size."""


def prepare_frames(items: Sequence[AppendItem], max_frame_bytes: int) -> list[PreparedFrame]:
    """Check each item's size and do the work that needs no offset yet (outside the log's lock).

    Raises :class:`FrameTooLargeError` for a payload over ``max_frame_bytes``.
    """
    prepared: list[PreparedFrame] = []
    for item in items:
        payload_length = len(item.payload)
        if payload_length > max_frame_bytes:
            raise FrameTooLargeError(
                f"batch of {payload_length} bytes for {item.topic}-{item.partition} exceeds "
                f"the WAL's max frame size of {max_frame_bytes} bytes; lower the "
                "client's batch.size/message.max.bytes or raise the agent's max frame size"
            )
        topic = item.topic.encode()
        prepared.append((item, topic, crc32c(item.payload), encoded_size(topic, payload_length)))
    return prepared


def encode_frame_header(
    offset: int,
    topic: bytes,
    partition: int,
    payload_length: int,
    payload_crc: int,
    record_count: int,
    appended_ms: int,
) -> bytes:
    """Header and topic of a frame; the payload is written after it without being copied."""
    body_head = (
        FRAME_BODY_HEAD.pack(offset, partition, record_count, appended_ms, len(topic)) + topic
    )
    crc = crc32c(body_head, payload_crc)
    return FRAME_PREFIX.pack(FRAME_MAGIC, len(body_head) + payload_length, crc) + body_head


def encoded_size(topic: bytes, payload_length: int) -> int:
    return HEADER_SIZE + len(topic) + payload_length


class FrameProblem(Enum):
    """Why no frame could be decoded at a position."""

    INCOMPLETE = "incomplete frame (file ends inside it)"
    BAD_MAGIC = "no frame marker"
    BAD_LENGTH = "impossible frame length"
    BAD_CRC = "CRC32C mismatch"
    BAD_OFFSET = f"offset above {MAX_OFFSET}, which no writer of this log makes"


def decode_frame(buf: memoryview, pos: int) -> tuple[Frame, int] | FrameProblem:
    """Decode the frame at ``pos``: the frame and the position after it, or the problem."""
    end_of_buffer = len(buf)
    if end_of_buffer - pos < HEADER_SIZE:
        if bytes(buf[pos : pos + 4]) != FRAME_MAGIC[: min(4, end_of_buffer - pos)]:
            return FrameProblem.BAD_MAGIC
        return FrameProblem.INCOMPLETE
    magic, body_length, crc = FRAME_PREFIX.unpack_from(buf, pos)
    if magic != FRAME_MAGIC:
        return FrameProblem.BAD_MAGIC
    body_start = pos + PREFIX_SIZE
    offset, partition, record_count, appended_ms, topic_length = FRAME_BODY_HEAD.unpack_from(
        buf, body_start
    )
    if (
        body_length < FRAME_BODY_HEAD.size + topic_length
        or body_length > MAX_BODY_BYTES
        or topic_length > MAX_TOPIC_BYTES
    ):
        return FrameProblem.BAD_LENGTH
    end = body_start + body_length
    if end > end_of_buffer:
        return FrameProblem.INCOMPLETE
    topic_start = body_start + FRAME_BODY_HEAD.size
    payload_start = topic_start + topic_length
    if crc32c(buf[body_start:payload_start], crc32c(buf[payload_start:end])) != crc:
        return FrameProblem.BAD_CRC
    if offset > MAX_OFFSET:  # as the compiled scans judge it (its CRC may hold: a crafted file)
        return FrameProblem.BAD_OFFSET
    try:
        topic = str(buf[topic_start:payload_start], "utf-8")
    except UnicodeDecodeError:
        return FrameProblem.BAD_CRC
    frame = Frame(
        offset, topic, partition, bytes(buf[payload_start:end]), record_count, appended_ms
    )
    return frame, end


def complete_frame_at(buf: memoryview, pos: int) -> int | None:
    """End of the frame at ``pos`` if it is *complete*, whether or not its CRC holds; else None.

    Complete: its magic is there and its declared length fits in the buffer, or (a damaged
    magic or length field) its CRC holds over everything from ``pos`` to the end of the buffer.
    Recovery uses it on the damaged tail of the newest segment to tell a frame that was fully
    written (under ``fsync=always``: acknowledged, so its damage is corruption) from a torn write.
    """
    end_of_buffer = len(buf)
    if end_of_buffer - pos < HEADER_SIZE:
        return None
    magic, body_length, crc = FRAME_PREFIX.unpack_from(buf, pos)
    body_start = pos + PREFIX_SIZE
    declared_end: int = body_start + body_length
    if (
        magic == FRAME_MAGIC
        and FRAME_BODY_HEAD.size <= body_length <= MAX_BODY_BYTES
        and declared_end <= end_of_buffer
    ):
        return declared_end
    topic_length: int = FRAME_BODY_HEAD.unpack_from(buf, body_start)[4]
    payload_start = body_start + FRAME_BODY_HEAD.size + topic_length
    if topic_length > MAX_TOPIC_BYTES or payload_start > end_of_buffer:
        return None
    body_crc = crc32c(buf[body_start:payload_start], crc32c(buf[payload_start:end_of_buffer]))
    return end_of_buffer if body_crc == crc else None
