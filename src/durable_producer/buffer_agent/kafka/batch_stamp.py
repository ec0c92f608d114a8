"""A stored client batch made ready to forward: the forwarder's producer id, epoch and base
sequence stamped into its header, its CRC32C computed again; nothing else changes.

``stamp`` returns the batch as two parts, a new 61-byte header and a view of the client's
records (not copied): the CRC covers the header from ``attributes`` on and the records, so it
is computed over the new header's tail and continued over the records. ``merge`` joins
consecutive uncompressed batches of one partition into one, as many as fit a size
(``_batch_merge.c``); without the compiled module ``can_merge`` is False and batches go one by
one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import crc32c

from durable_producer.buffer_agent.kafka.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_NONE,
    HEADER_SIZE,
    PRODUCER_FIELDS,
    PRODUCER_ID_OFFSET,
)

_merge: Callable[[Sequence[bytes | memoryview], int], tuple[bytes, int]] | None
try:  # built from _batch_merge.c by the package's build (optional: needs a C compiler)
    from durable_producer.buffer_agent.kafka._batch_merge import merge_fitting as _merge
except ImportError:  # none, or one built before the merge took a limit: batches go one by one
    _merge = None

_LEADER_EPOCH = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch
_CRC = struct.Struct(">I")
_CRC_OFFSET = 17
_MERGEABLE_ATTRIBUTES = 0x08  # only the timestamp type may be set: no codec, no transaction

can_merge = _merge is not None


def stamp(
    batch: bytes | memoryview, producer_id: int, epoch: int, base_sequence: int
) -> list[bytes | memoryview]:
    """``batch`` (one whole v2 batch) with the producer fields and CRC rewritten, as parts."""
    view = memoryview(batch)
    header = bytearray(view[:HEADER_SIZE])
    _LEADER_EPOCH.pack_into(header, 0, 0, len(view) - 12, -1)
    PRODUCER_FIELDS.pack_into(header, PRODUCER_ID_OFFSET, producer_id, epoch, base_sequence)
    records = view[HEADER_SIZE:]
    crc = crc32c.crc32c(records, value=crc32c.crc32c(header[ATTRIBUTES_OFFSET:]))
    _CRC.pack_into(header, _CRC_OFFSET, crc)
    return [bytes(header), records]


def mergeable(attributes: int) -> bool:
    """A batch with these header ``attributes`` (uncompressed, non-transactional, not a
    control batch) may have its records merged with others of the same attributes."""
    return can_merge and attributes & ~_MERGEABLE_ATTRIBUTES == COMPRESSION_NONE


def merge(batches: Sequence[bytes | memoryview], max_bytes: int) -> tuple[bytes, int]:
    """One batch holding the records of the first of ``batches`` (all ``mergeable``, same
    attributes) and of as many of the next as fit in ``max_bytes`` (whole batches; only the
    merge knows a merged record's new framing), and how many it holds."""
    assert _merge is not None
    return _merge(batches, max_bytes)
