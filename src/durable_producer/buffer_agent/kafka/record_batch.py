"""Kafka record batch (magic v2) headers: parse and validate without touching the records.

Layout of a v2 batch (all big-endian)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 |
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 |
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32 |
    recordCount int32 | records...

``batchLength`` counts the bytes after itself; the CRC32C covers ``attributes`` to the end.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

import crc32c

_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
PRODUCER_ID_OFFSET = 43
PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1


class InvalidRecordBatch(ValueError):
    """The bytes are not a well-formed v2 record batch; the message says what is wrong.

    ``reason``: a short label of what is wrong, for metrics (each subclass has its own).
    """

    reason = "malformed"


class UnsupportedMagic(InvalidRecordBatch):
    """The batch uses the legacy message format (magic 0 or 1), which is not accepted."""

    reason = "magic"


class CorruptRecordBatch(InvalidRecordBatch):
    """The CRC32C stored in the batch does not match its content."""

    reason = "crc"


class BatchHeader(NamedTuple):
    """The 61-byte header (a tuple: made once per stored batch on the forwarder's and the
    ingest's hot paths, where a frozen dataclass cost 3x as much to build)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 create time, 1 log-append time."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def is_idempotent(self) -> bool:
        """True when the producer asked for broker-side deduplication of this batch."""
        return self.producer_id >= 0 and self.base_sequence >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; sequences wrap at 2**31 like Kafka's."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % 2**31


def parse_batch_header(data: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Read the batch header starting at ``pos``; checks magic and lengths, not the CRC."""
    available = len(data) - pos
    if available < MAGIC_OFFSET + 1:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} truncated: {available} bytes, header needs {HEADER_SIZE}"
        )
    magic = data[pos + MAGIC_OFFSET]
    if magic != 2:
        raise UnsupportedMagic(
            f"record batch at byte {pos} has magic {magic}; only magic 2 (Kafka >= 0.11) is"
            " supported"
        )
    if available < HEADER_SIZE:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} truncated: {available} bytes, header needs {HEADER_SIZE}"
        )
    header = BatchHeader(*_HEADER.unpack_from(data, pos))
    if header.batch_length < _MIN_BATCH_LENGTH:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} declares batchLength {header.batch_length},"
            f" below the minimum {_MIN_BATCH_LENGTH}"
        )
    if header.batch_length > available - LOG_OVERHEAD:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} declares {header.size} bytes but only {available} remain"
        )
    if header.record_count < 0:
        raise InvalidRecordBatch(
            f"record batch at byte {pos} has a negative record count {header.record_count}"
        )
    return header


_SOLE = struct.Struct(">8xi4xb4xh34xi")  # batchLength, magic, attributes, recordCount


def sole_batch_python(data: bytes | memoryview) -> tuple[int, int] | None:
    """``(record count, attributes)`` when ``data`` is exactly one batch whose header
    ``parse_batch_header`` accepts (what the agent stores of a client batch), else None:
    then ``iter_batches`` says what it holds. The reference for the compiled ``sole_batch``
    (``_batch_merge.c``), used without it."""
    if len(data) < HEADER_SIZE:
        return None
    length, magic, attributes, count = _SOLE.unpack_from(data)
    if magic != 2 or length + LOG_OVERHEAD != len(data) or length < _MIN_BATCH_LENGTH or count < 0:
        return None
    return count, attributes


sole_batch: Callable[[bytes | memoryview], tuple[int, int] | None]
"""``sole_batch_python``, compiled where the package's build could (0.05 instead of 0.5 us a
call; the forwarder's numbering asks the same check of every frame in C, ``sole_batch.h``)."""
try:  # built from _batch_merge.c by the package's build (optional: needs a C compiler)
    from durable_producer.buffer_agent.kafka._batch_merge import sole_batch
except ImportError:
    sole_batch = sole_batch_python


def carries_sequences(batch: bytes | memoryview) -> bool:
    """``BatchHeader.is_idempotent`` of the batch at the start of ``batch``, read without
    making the header (only two fields): for a batch ``sole_batch`` or
    ``parse_batch_header`` accepted."""
    producer_id, _, base_sequence = PRODUCER_FIELDS.unpack_from(batch, PRODUCER_ID_OFFSET)
    return bool(producer_id >= 0 and base_sequence >= 0)


def verify_crc(batch: memoryview, header: BatchHeader) -> None:
    """Raise :class:`CorruptRecordBatch` if the stored CRC32C does not match ``batch``."""
    actual = crc32c.crc32c(batch[ATTRIBUTES_OFFSET : header.size])
    if actual != header.crc:
        raise CorruptRecordBatch(
            f"record batch CRC32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}"
        )


def iter_batches(
    records: bytes | memoryview, *, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Yield ``(header, batch bytes)`` for each batch in a produce request's records field.

    Validates magic, lengths and (unless ``check_crc`` is false) the CRC32C. Trailing bytes
    that do not form a whole batch are an error: producers never send partial batches.
    The yielded views point into ``records`` (no copies).
    """
    view = records if isinstance(records, memoryview) else memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    pos = 0
    end = len(view)
    while pos < end:
        header = parse_batch_header(view, pos)
        batch = view[pos : pos + header.size]
        if check_crc:
            verify_crc(batch, header)
        yield header, batch
        pos += header.size
