"""The records section of a compressed record batch, decompressed the one way both sides use.

Kafka's codecs: gzip (stdlib zlib, several concatenated members allowed), snappy (the raw
blocks librdkafka writes and the xerial framing of Java clients), lz4 (frame format) and zstd,
the last three through ``cramjam``. The ingest's validation and ``record_decode`` (tools and
tests reading records back) call the same :func:`decompress`; the forwarder sends batches
compressed as they were stored.

``limit`` bounds the output: a few kilobytes of zstd or lz4 expand to gigabytes, and a raw
snappy header alone claims up to 4 GiB (cramjam aborts the process when it cannot allocate
that). With a limit, nothing larger is ever allocated: snappy's declared length is checked
before decompressing, gzip decompresses at most ``limit + 1`` bytes, and zstd and lz4 write
into a per-thread scratch mapping of ``limit`` bytes whose pages are committed only as they
are written. ``limit=None`` (``record_decode``, whose input the ingest already bounded)
decodes without the scratch copy.
"""

from __future__ import annotations

import mmap
import struct
import threading
import zlib
from collections.abc import Callable

import cramjam

from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    InvalidRecordBatch,
)

XERIAL_SNAPPY_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic (8) + version (4) + compatible version (4)
_BLOCK_LENGTH = struct.Struct(">i")
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_SCRATCH_KEPT_BYTES = 4 << 20
"""Scratch pages above this are handed back to the kernel after each use."""
_OVERFLOW = "failed to write whole buffer"
"""cramjam's message when the output does not fit the buffer given to ``decompress_into``."""


class UndecompressableRecords(InvalidRecordBatch):
    """The records section does not decompress with the batch's codec."""

    reason = "decompress"


class DecompressedTooLarge(InvalidRecordBatch):
    """The records section decompresses to more than the limit allows."""

    reason = "decompressed_size"


class UnknownCodec(InvalidRecordBatch):
    """Compression bits 5, 6 or 7: no Kafka codec."""

    reason = "codec"


def decompress(compression: int, data: bytes | memoryview, limit: int | None = None) -> bytes:
    """Decompress the records section of a batch compressed with ``compression``.

    Raises :class:`UnknownCodec`, :class:`UndecompressableRecords` or (with ``limit``)
    :class:`DecompressedTooLarge`.
    """
    try:
        if compression == COMPRESSION_NONE:
            return bytes(data)
        if compression == COMPRESSION_GZIP:
            return _gunzip(bytes(data), limit)
        if compression == COMPRESSION_SNAPPY:
            return _unsnappy(bytes(data), limit)
        if compression == COMPRESSION_LZ4:
            if limit is None:
                return bytes(cramjam.lz4.decompress(data))
            return _into_scratch(cramjam.lz4.decompress_into, data, limit)
        if compression == COMPRESSION_ZSTD:
            if limit is None:
                return bytes(cramjam.zstd.decompress(data))
            return _into_scratch(cramjam.zstd.decompress_into, data, limit)
    except (zlib.error, cramjam.DecompressionError, ValueError) as error:
        if isinstance(error, InvalidRecordBatch):
            raise
        raise UndecompressableRecords(
            f"cannot decompress records (codec {compression}): {error}"
        ) from error
    raise UnknownCodec(f"unknown compression codec {compression} (Kafka's are 0-4)")


def _too_large(limit: int) -> DecompressedTooLarge:
    return DecompressedTooLarge(f"records decompress to more than {limit} bytes")


def _gunzip(data: bytes, limit: int | None) -> bytes:
    """Decompress gzip, including several concatenated members."""
    parts = []
    room = limit
    while data:
        decompressor = zlib.decompressobj(_GZIP_WBITS)
        if room is None:
            parts.append(decompressor.decompress(data))
        else:
            part = decompressor.decompress(data, room + 1)
            if len(part) > room:
                raise _too_large(limit or 0)
            room -= len(part)
            parts.append(part)
        if not decompressor.eof:
            raise UndecompressableRecords("gzip records section is truncated")
        data = decompressor.unused_data
    return b"".join(parts)


def _unsnappy(data: bytes, limit: int | None) -> bytes:
    """Raw snappy (librdkafka) or xerial-framed snappy blocks (Java clients)."""
    if not data.startswith(XERIAL_SNAPPY_MAGIC):
        _check_snappy_length(data, limit)
        return bytes(cramjam.snappy.decompress_raw(data))
    parts = []
    room = limit
    pos = _XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if pos + 4 > end:
            raise UndecompressableRecords("xerial snappy block length is truncated")
        (length,) = _BLOCK_LENGTH.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise UndecompressableRecords(f"xerial snappy block of {length} bytes is truncated")
        block = data[pos : pos + length]
        if room is not None:
            room -= _check_snappy_length(block, room)
        parts.append(bytes(cramjam.snappy.decompress_raw(block)))
        pos += length
    return b"".join(parts)


def _check_snappy_length(block: bytes, limit: int | None) -> int:
    """The length a raw snappy block declares, refused above ``limit`` before any allocation."""
    if limit is None:
        return 0
    declared = int(cramjam.snappy.decompress_raw_len(block))
    if declared > limit:
        raise _too_large(limit)
    return declared


# ---------------------------------------------------------------------- bounded zstd and lz4
class _Scratch(threading.local):
    mapping: mmap.mmap | None = None


_scratch = _Scratch()


def _into_scratch(
    decompress_into: Callable[[bytes | memoryview, memoryview], int],
    data: bytes | memoryview,
    limit: int,
) -> bytes:
    """Decompress into this thread's scratch mapping (at most ``limit`` bytes), then copy out."""
    mapping = _scratch.mapping
    if mapping is None or len(mapping) < limit:
        if mapping is not None:
            mapping.close()
        mapping = _scratch.mapping = mmap.mmap(-1, limit)
    view = memoryview(mapping)
    written = 0
    try:
        written = int(decompress_into(data, view[:limit]))
        return bytes(view[:written])
    except cramjam.DecompressionError as error:
        if _OVERFLOW in str(error):
            written = limit
            raise _too_large(limit) from None
        raise
    finally:
        view.release()
        if written > _SCRATCH_KEPT_BYTES and hasattr(mapping, "madvise"):
            mapping.madvise(mmap.MADV_DONTNEED, _SCRATCH_KEPT_BYTES, written - _SCRATCH_KEPT_BYTES)
