"""Build v2 record batches with an independent encoder (kafka-python), for tests."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

HEADER_SIZE = 61
ATTRIBUTES_OFFSET = 21
CRC_OFFSET = 17
CODEC_SNAPPY = 2


@dataclass(frozen=True, slots=True)
class SampleRecord:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = field(default_factory=tuple)


def build_batch(
    records: Sequence[SampleRecord],
    *,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One v2 batch of ``records``; kafka-python stores it uncompressed if that is smaller."""
    builder = DefaultRecordBatchBuilder(
        2, compression, False, producer_id, producer_epoch, base_sequence, batch_size=2**31 - 1
    )
    for offset, record in enumerate(records):
        builder.append(offset, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


def with_raw_snappy(batch: bytes) -> bytes:
    """Re-compress an uncompressed batch with raw (unframed) snappy, as librdkafka does."""
    body = batch[HEADER_SIZE:]
    compressed = bytes(cramjam.snappy.compress_raw(body))
    out = bytearray(batch[:HEADER_SIZE] + compressed)
    struct.pack_into(">i", out, 8, len(out) - 12)
    (attributes,) = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, (attributes & ~0x07) | CODEC_SNAPPY)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(bytes(out[ATTRIBUTES_OFFSET:])))
    return bytes(out)
