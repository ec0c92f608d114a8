"""Full validation of one record batch, as a Kafka broker's LogValidator does before it appends.

The framing checks (magic, lengths, CRC32C) are ``record_batch``'s. On top of them a batch is
refused when

- its compression codec is not one of Kafka's (0-4): :class:`~.compression.UnknownCodec`;
- its record count is below one or disagrees with ``lastOffsetDelta + 1``:
  :class:`RecordCountMismatch` (Kafka: "Inconsistent batch offset range");
- its records section does not decompress, or decompresses to more than the limit:
  :class:`~.compression.UndecompressableRecords`, :class:`~.compression.DecompressedTooLarge`;
- its records are not exactly ``recordCount`` well-formed records filling the section, with
  nothing left over: :class:`~.record_decode.InvalidRecords`.

The records are walked by ``record_decode.check_records``, which accepts what
``record_decode`` decodes. Each exception carries a ``reason`` for
metrics; which Kafka error answers it is the ingest's choice.
"""

from __future__ import annotations

from durable_producer.buffer_agent.kafka.compression import (
    DecompressedTooLarge,
    UndecompressableRecords,
    UnknownCodec,
)
from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_ZSTD,
    BatchHeader,
    InvalidRecordBatch,
)
from durable_producer.buffer_agent.kafka.record_decode import InvalidRecords, check_records

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DecompressedTooLarge",
    "InvalidRecords",
    "RecordCountMismatch",
    "UndecompressableRecords",
    "UnknownCodec",
    "validate_batch",
]

DEFAULT_MAX_DECOMPRESSED_BYTES = 32 << 20
"""Largest records section a compressed batch may expand to. Clients bound a batch by its
uncompressed size (librdkafka's and Java's ``batch.size``, 1 MB and 16 KiB by default)."""


class RecordCountMismatch(InvalidRecordBatch):
    """The header's record count is below one or disagrees with its last offset delta."""

    reason = "record_count"


def validate_batch(
    batch: memoryview,
    header: BatchHeader,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> None:
    """Raise an :class:`InvalidRecordBatch` subclass unless ``batch`` is valid in every record.

    ``batch`` is one whole batch (header included) whose framing and CRC ``iter_batches``
    has checked; ``header`` is its parsed header.
    """
    if header.compression > COMPRESSION_ZSTD:
        raise UnknownCodec(
            f"compression codec {header.compression} is not a Kafka codec (0-4: none, gzip,"
            " snappy, lz4, zstd)"
        )
    count = header.record_count
    if count < 1 or header.last_offset_delta != count - 1:
        raise RecordCountMismatch(
            f"record count {count} does not match lastOffsetDelta {header.last_offset_delta}"
            " (a batch holds lastOffsetDelta + 1 >= 1 records)"
        )
    check_records(batch, header, max_decompressed_bytes)
