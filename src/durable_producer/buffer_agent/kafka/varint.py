"""Kafka's unsigned varints (lengths, counts and tags of flexible versions): read and written."""

from __future__ import annotations


def read_uvarint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (at most 5 bytes, 32 bits) and the position after it;
    ``ValueError`` if it runs past the end of ``data`` or past 5 bytes."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise ValueError(f"a varint at byte {pos} runs past the end or past 5 bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_uvarint(value: int) -> bytes:
    """``value`` (not negative) as an unsigned varint (the flexible versions' lengths; a
    record's fields after the zigzag step)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
