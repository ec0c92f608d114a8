"""Decode stored v2 record batches into records, exactly as the client sent them.

Timestamps stay exact to the millisecond (``baseTimestamp + timestampDelta``; kio's reader
truncates them to seconds), a null key/value stays ``None`` and an empty one stays ``b""``,
headers keep their order and null values. All Kafka codecs are handled (``compression``).
The forwarder sends the stored batches as they are and decodes nothing; ``decode_batch`` and
``iter_decoded`` serve the tools and the tests that read records back.

The ingest validates every batch before acknowledging it with ``check_records``: every
record is walked, keeping nothing. Where aiokafka's compiled (Cython) record reader is
installed, ``_record_scan`` (C, built with the package; about 0.01 us a 200 B record)
accepts exactly what that reader accepts without creating its objects; without the scanner
the reader itself walks the records (about 0.1 us), and without aiokafka a pure-Python loop
with inline varint fast paths does (about 1.5 us). All three accept the same batches; the
tests run each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from durable_producer.buffer_agent.kafka.compression import XERIAL_SNAPPY_MAGIC, decompress
from durable_producer.buffer_agent.kafka.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_NONE,
    HEADER_SIZE,
    BatchHeader,
    InvalidRecordBatch,
    iter_batches,
)

try:
    from aiokafka.errors import CorruptRecordException as _FastDecodeError
    from aiokafka.record._crecords.default_records import DefaultRecordBatch as _FastBatch
except ImportError:  # pure-Python fallback below
    _FastBatch = None
    _FastDecodeError = ValueError

_scan_records: Callable[[bytes | memoryview, int, int, int], None] | None
try:  # built from _record_scan.c by the package's build (optional: needs a C compiler)
    from durable_producer.buffer_agent.kafka._record_scan import check_records as _scan_records
except ImportError:
    _scan_records = None

__all__ = [
    "XERIAL_SNAPPY_MAGIC",
    "DecodedBatch",
    "InvalidRecords",
    "Record",
    "check_records",
    "decode_batch",
    "decompress",
    "iter_decoded",
]

_COMPILED_ERRORS = (_FastDecodeError, IndexError, ValueError, UnicodeDecodeError, OverflowError)
"""What aiokafka's reader raises on malformed records (OverflowError: a length near 2**63)."""

Header = tuple[str, bytes | None]


class InvalidRecords(InvalidRecordBatch):
    """The records section does not hold the records the batch header announces, well formed."""

    reason = "records"


class Record(NamedTuple):
    """One record of a batch. ``offset_delta`` is its position within the batch."""

    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class DecodedBatch(NamedTuple):
    header: BatchHeader
    records: list[Record]


def decode_batch(
    batch: bytes | memoryview, header: BatchHeader | None = None, *, fast: bool = True
) -> DecodedBatch:
    """Decode one v2 batch (header included). The CRC is not checked here: ingest did.

    ``fast=False`` forces the pure-Python record loop.
    """
    if header is None:
        batches = list(iter_batches(batch, check_crc=False))
        if len(batches) != 1:
            raise InvalidRecordBatch(f"expected one record batch, found {len(batches)}")
        header, batch = batches[0]
    view = memoryview(batch)
    records_bytes = decompress(header.compression, view[HEADER_SIZE : header.size])
    if fast and _FastBatch is not None and _compiled_keeps_timestamps(header):
        records = _decode_records_compiled(view[:HEADER_SIZE], records_bytes, header)
    else:
        records = _decode_records(records_bytes, header.record_count, header.base_timestamp)
    if header.timestamp_type == 1:  # log-append time: the batch's max timestamp applies
        records = [record._replace(timestamp_ms=header.max_timestamp) for record in records]
    return DecodedBatch(header, records)


def _decode_records_compiled(
    header_bytes: memoryview, records_bytes: bytes, header: BatchHeader
) -> list[Record]:
    """aiokafka's Cython reader over the header (compression bits cleared) + plain records."""
    plain = bytearray(header_bytes)
    plain[ATTRIBUTES_OFFSET + 1] &= ~0x07 & 0xFF
    plain += records_bytes
    base = header.base_offset
    make = tuple.__new__
    try:
        return [
            make(Record, (r.offset - base, r.timestamp, r.key, r.value, r.headers))
            for r in _FastBatch(bytes(plain))
        ]
    except _COMPILED_ERRORS as error:
        raise InvalidRecords(f"invalid records: {error}") from error


def iter_decoded(payload: bytes | memoryview) -> Iterator[DecodedBatch]:
    """Decode every batch in ``payload`` (a WAL frame holds one or more whole batches)."""
    for header, batch in iter_batches(payload, check_crc=False):
        yield decode_batch(batch, header)


def _compiled_keeps_timestamps(header: BatchHeader) -> bool:
    """The compiled reader turns a timestamp of -1 ("none") into ``None``; Kafka keeps -1.

    Only batches whose base or max timestamp is negative can hold one (short of a
    pathological negative delta); the pure-Python loop decodes those.
    """
    return header.base_timestamp >= 0 and header.max_timestamp >= 0


def _compiled_reader(batch: memoryview, header: BatchHeader, limit: int | None = None) -> Any:
    """aiokafka's reader over an uncompressed batch in place, or over its header (compression
    bits cleared) and its decompressed records."""
    if header.compression == COMPRESSION_NONE:
        return _FastBatch(batch[: header.size])
    plain = bytearray(batch[:HEADER_SIZE])
    plain[ATTRIBUTES_OFFSET + 1] &= ~0x07 & 0xFF
    plain += decompress(header.compression, batch[HEADER_SIZE : header.size], limit)
    return _FastBatch(bytes(plain))


def check_records(batch: memoryview, header: BatchHeader, max_decompressed_bytes: int) -> None:
    """Walk every record of one batch, keeping none.

    What this accepts, ``decode_batch`` decodes (same choice of reader); it raises
    :class:`InvalidRecords` for malformed records and
    :class:`~.compression.DecompressedTooLarge` for records that decompress to more than
    ``max_decompressed_bytes``.
    """
    if _FastBatch is not None and _compiled_keeps_timestamps(header):
        if _scan_records is not None:  # what aiokafka's reader accepts, without its objects
            if header.compression == COMPRESSION_NONE:
                records: bytes | memoryview = batch
                start, end = HEADER_SIZE, header.size
            else:
                records = decompress(
                    header.compression,
                    batch[HEADER_SIZE : header.size],
                    max_decompressed_bytes,
                )
                start, end = 0, len(records)
            try:
                _scan_records(records, start, end, header.record_count)
            except ValueError as error:
                raise InvalidRecords(f"invalid records: {error}") from error
            return
        reader = _compiled_reader(batch, header, max_decompressed_bytes)
        try:
            deque(reader, maxlen=0)  # reads every record, in C
        except (*_COMPILED_ERRORS, MemoryError) as error:  # MemoryError: a length near 2**63
            raise InvalidRecords(f"invalid records: {error}") from error
    else:
        records = decompress(
            header.compression, batch[HEADER_SIZE : header.size], max_decompressed_bytes
        )
        _decode_records(records, header.record_count, header.base_timestamp)


def _decode_records(buf: bytes, count: int, base_timestamp: int) -> list[Record]:
    """The record loop. Varints are zigzag-encoded; one- and two-byte values are read inline.

    A record is: length, attributes (int8), timestampDelta, offsetDelta, keyLength, key,
    valueLength, value, headerCount, headers (varints signed, lengths -1 for null).
    """
    records: list[Record] = []
    append = records.append
    make = tuple.__new__
    varint = _varint
    pos = 0
    end = len(buf)
    try:
        for _ in range(count):
            raw = buf[pos]
            if raw < 0x80:
                pos += 1
            else:
                second = buf[pos + 1]
                if second < 0x80:
                    raw = (raw & 0x7F) | (second << 7)
                    pos += 2
                else:
                    raw, pos = varint(buf, pos)
            length = (raw >> 1) ^ -(raw & 1)
            start = pos
            # attributes (1 byte, unused in v2 records), then the timestamp delta
            raw = buf[pos + 1]
            if raw < 0x80:
                pos += 2
            else:
                second = buf[pos + 2]
                if second < 0x80:
                    raw = (raw & 0x7F) | (second << 7)
                    pos += 3
                else:
                    raw, pos = varint(buf, pos + 1)
            timestamp = base_timestamp + ((raw >> 1) ^ -(raw & 1))
            raw = buf[pos]
            if raw < 0x80:
                pos += 1
            else:
                second = buf[pos + 1]
                if second < 0x80:
                    raw = (raw & 0x7F) | (second << 7)
                    pos += 2
                else:
                    raw, pos = varint(buf, pos)
            offset_delta = (raw >> 1) ^ -(raw & 1)
            raw = buf[pos]
            if raw < 0x80:
                pos += 1
            else:
                second = buf[pos + 1]
                if second < 0x80:
                    raw = (raw & 0x7F) | (second << 7)
                    pos += 2
                else:
                    raw, pos = varint(buf, pos)
            if raw == 1:  # zigzag -1: null
                key: bytes | None = None
            else:
                size = (raw >> 1) ^ -(raw & 1)
                key = buf[pos : pos + size]
                pos += size
            raw = buf[pos]
            if raw < 0x80:
                pos += 1
            else:
                second = buf[pos + 1]
                if second < 0x80:
                    raw = (raw & 0x7F) | (second << 7)
                    pos += 2
                else:
                    raw, pos = varint(buf, pos)
            if raw == 1:
                value: bytes | None = None
            else:
                size = (raw >> 1) ^ -(raw & 1)
                value = buf[pos : pos + size]
                pos += size
            if buf[pos] == 0:
                headers: list[Header] = []
                pos += 1
            else:
                raw, pos = varint(buf, pos)
                headers, pos = _decode_headers(buf, pos, (raw >> 1) ^ -(raw & 1))
            if pos - start != length or pos > end:
                raise InvalidRecords(
                    f"record {len(records)} declares {length} bytes but spans {pos - start}"
                )
            append(make(Record, (offset_delta, timestamp, key, value, headers)))
    except IndexError:
        raise InvalidRecords(
            f"records section truncated after {len(records)} of {count} records"
        ) from None
    except (UnicodeDecodeError, OverflowError) as error:
        raise InvalidRecords(f"record {len(records)}: {error}") from None
    if pos != end:
        raise InvalidRecords(f"{end - pos} bytes left over after {count} records")
    return records


def _decode_headers(buf: bytes, pos: int, count: int) -> tuple[list[Header], int]:
    if count < 0:
        raise InvalidRecords(f"negative header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        size, pos = _signed_varint(buf, pos)
        if size < 0:
            raise InvalidRecords(f"negative header key length {size}")
        key = buf[pos : pos + size].decode("utf-8")
        pos += size
        size, pos = _signed_varint(buf, pos)
        if size >= 0:
            value: bytes | None = buf[pos : pos + size]
            pos += size
        else:
            value = None
        headers.append((key, value))
    return headers, pos


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read an unsigned varint (up to 64 bits) at ``pos``: ``(raw value, next position)``.

    Callers apply the zigzag step ``(raw >> 1) ^ -(raw & 1)`` themselves.
    """
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidRecords(f"varint longer than 10 bytes at {pos}")


def _signed_varint(buf: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _varint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos
