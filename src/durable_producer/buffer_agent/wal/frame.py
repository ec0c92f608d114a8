"""The on-disk frame: one produce batch as the client sent it, plus where it goes.

Layout (big-endian, like the Kafka protocol)::

    magic        4   b"\\xd7WF1"
    body_length  4   bytes after the 12-byte prefix (offset .. end of payload)
    crc32c       4   over the payload, then over offset .. topic (so the payload's CRC can be
                     computed before the offset is assigned, outside the append lock)
    offset       8   WAL offset (one per frame, strictly increasing)
    partition    4
    record_count 4   records in the payload (for backlog accounting)
    appended_ms  8   wall-clock append time (oldest-unsent-age metric)
    topic_length 2
    topic            UTF-8
    payload          the Kafka record batch bytes, untouched

The magic lets recovery find the next frame after a corrupt one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from crc32c import crc32c

FRAME_MAGIC = b"\xd7WF1"
_PREFIX = struct.Struct(">4sII")
_BODY_HEAD = struct.Struct(">QiIQH")
PREFIX_SIZE = _PREFIX.size
HEADER_SIZE = _PREFIX.size + _BODY_HEAD.size
MAX_TOPIC_BYTES = 249 * 4  # Kafka topic names are at most 249 characters
MAX_BODY_BYTES = 1 << 31


@dataclass(frozen=True, slots=True)
class AppendItem:
    """One frame to append: a record batch for a topic partition."""

    topic: str
    partition: int
    payload: bytes | bytearray | memoryview
    record_count: int = 0


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame read back from the log."""

    offset: int
    topic: str
    partition: int
    payload: bytes
    record_count: int
    appended_ms: int


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
    body_head = _BODY_HEAD.pack(offset, partition, record_count, appended_ms, len(topic)) + topic
    crc = crc32c(body_head, payload_crc)
    return _PREFIX.pack(FRAME_MAGIC, len(body_head) + payload_length, crc) + body_head


def encoded_size(topic: bytes, payload_length: int) -> int:
    return HEADER_SIZE + len(topic) + payload_length


class FrameProblem(Enum):
    """Why no frame could be decoded at a position."""

    INCOMPLETE = "incomplete frame (file ends inside it)"
    BAD_MAGIC = "no frame marker"
    BAD_LENGTH = "impossible frame length"
    BAD_CRC = "CRC32C mismatch"


def decode_frame(buf: memoryview, pos: int) -> tuple[Frame, int] | FrameProblem:
    """Decode the frame at ``pos``: the frame and the position after it, or the problem."""
    end_of_buffer = len(buf)
    if end_of_buffer - pos < HEADER_SIZE:
        if bytes(buf[pos : pos + 4]) != FRAME_MAGIC[: min(4, end_of_buffer - pos)]:
            return FrameProblem.BAD_MAGIC
        return FrameProblem.INCOMPLETE
    magic, body_length, crc = _PREFIX.unpack_from(buf, pos)
    if magic != FRAME_MAGIC:
        return FrameProblem.BAD_MAGIC
    body_start = pos + PREFIX_SIZE
    offset, partition, record_count, appended_ms, topic_length = _BODY_HEAD.unpack_from(
        buf, body_start
    )
    if (
        body_length < _BODY_HEAD.size + topic_length
        or body_length > MAX_BODY_BYTES
        or topic_length > MAX_TOPIC_BYTES
    ):
        return FrameProblem.BAD_LENGTH
    end = body_start + body_length
    if end > end_of_buffer:
        return FrameProblem.INCOMPLETE
    topic_start = body_start + _BODY_HEAD.size
    payload_start = topic_start + topic_length
    if crc32c(buf[body_start:payload_start], crc32c(buf[payload_start:end])) != crc:
        return FrameProblem.BAD_CRC
    try:
        topic = str(buf[topic_start:payload_start], "utf-8")
    except UnicodeDecodeError:
        return FrameProblem.BAD_CRC
    frame = Frame(
        offset, topic, partition, bytes(buf[payload_start:end]), record_count, appended_ms
    )
    return frame, end
