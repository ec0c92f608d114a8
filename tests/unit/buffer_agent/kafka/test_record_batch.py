"""record_batch: v2 batch headers parsed and validated without decoding records."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    CRC_OFFSET,
    HEADER_SIZE,
    MAGIC_OFFSET,
    CorruptRecordBatch,
    InvalidRecordBatch,
    UnsupportedMagic,
    carries_sequences,
    iter_batches,
    parse_batch_header,
    sole_batch,
    sole_batch_python,
)
from support.ingest_harness import record_batch


def build_batch(
    values: list[bytes],
    *,
    compression: int = COMPRESSION_NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    first_timestamp_ms: int = 1_700_000_000_123,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for index, value in enumerate(values):
        builder.append(index, first_timestamp_ms + index, b"k%d" % index, value, [])
    return bytes(builder.build())


def test_header_fields_match_what_the_builder_wrote() -> None:
    batch = build_batch([b"a", b"bb", b"ccc"], producer_id=42, producer_epoch=3, base_sequence=17)
    header = parse_batch_header(batch)
    reference = DefaultRecordBatch(batch)
    assert header.magic == 2
    assert header.size == len(batch)
    assert header.record_count == 3
    assert header.last_offset_delta == 2
    assert header.base_timestamp == 1_700_000_000_123
    assert header.max_timestamp == 1_700_000_000_125
    assert header.producer_id == 42
    assert header.producer_epoch == 3
    assert header.base_sequence == 17
    assert header.last_sequence == 19
    assert header.crc == reference.crc
    assert header.compression == COMPRESSION_NONE
    assert header.is_idempotent
    assert not header.is_transactional
    assert not header.is_control
    assert header.timestamp_type == 0


def test_attribute_properties() -> None:
    batch = build_batch(
        [b"x" * 500],
        compression=COMPRESSION_GZIP,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    header = parse_batch_header(batch)
    assert header.compression == COMPRESSION_GZIP
    assert header.is_transactional


def test_last_sequence_wraps_like_kafka() -> None:
    batch = build_batch([b"a", b"b"], producer_id=1, producer_epoch=0, base_sequence=2**31 - 1)
    assert parse_batch_header(batch).last_sequence == 0


def test_non_idempotent_batch_has_no_sequence() -> None:
    header = parse_batch_header(build_batch([b"a"]))
    assert not header.is_idempotent
    assert header.last_sequence == -1


def test_iter_batches_splits_concatenated_batches_without_copying() -> None:
    first = build_batch([b"one"])
    second = build_batch([b"two" * 100, b"three"], compression=COMPRESSION_GZIP)
    records = bytearray(first + second)
    found = list(iter_batches(records))
    assert [h.record_count for h, _ in found] == [1, 2]
    assert bytes(found[0][1]) == first
    assert bytes(found[1][1]) == second
    records[0] = 0x7F  # the views share memory with the input
    assert found[0][1][0] == 0x7F


def test_parse_at_position() -> None:
    first = build_batch([b"one"])
    second = build_batch([b"two", b"three"])
    assert parse_batch_header(first + second, len(first)).record_count == 2


def test_empty_records_yield_nothing() -> None:
    assert list(iter_batches(b"")) == []


def test_corrupt_crc_is_detected() -> None:
    batch = bytearray(build_batch([b"payload"]))
    batch[-1] ^= 0xFF
    with pytest.raises(CorruptRecordBatch, match="CRC32C mismatch"):
        list(iter_batches(batch))
    assert len(list(iter_batches(batch, check_crc=False))) == 1


def test_flipped_stored_crc_is_detected() -> None:
    batch = bytearray(build_batch([b"payload"]))
    batch[CRC_OFFSET] ^= 0x01
    with pytest.raises(CorruptRecordBatch):
        list(iter_batches(batch))


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_other_magic_is_refused(magic: int) -> None:
    batch = bytearray(build_batch([b"payload"]))
    batch[MAGIC_OFFSET] = magic
    with pytest.raises(UnsupportedMagic, match=f"magic {magic}"):
        parse_batch_header(batch)


@pytest.mark.parametrize("cut", [1, 10, MAGIC_OFFSET + 1, HEADER_SIZE - 1, HEADER_SIZE + 1])
def test_truncated_batch_is_refused(cut: int) -> None:
    batch = build_batch([b"payload-that-is-long-enough"])
    with pytest.raises(InvalidRecordBatch, match=r"truncated|remain"):
        list(iter_batches(batch[:cut]))


def test_trailing_garbage_is_refused() -> None:
    batch = build_batch([b"payload"])
    with pytest.raises(InvalidRecordBatch):
        list(iter_batches(batch + b"\x00\x01\x02"))


def test_batch_length_below_header_is_refused() -> None:
    batch = bytearray(build_batch([b"payload"]))
    struct.pack_into(">i", batch, 8, 10)
    with pytest.raises(InvalidRecordBatch, match="below the minimum"):
        parse_batch_header(batch)


def test_negative_record_count_is_refused() -> None:
    batch = bytearray(build_batch([b"payload"]))
    struct.pack_into(">i", batch, 57, -5)
    with pytest.raises(InvalidRecordBatch, match="negative record count"):
        parse_batch_header(batch)


def iter_batches_says(data: bytes) -> tuple[int, int] | None:
    try:
        batches = list(iter_batches(data, check_crc=False))
    except InvalidRecordBatch:
        return None
    if len(batches) != 1:
        return None
    header = batches[0][0]
    return header.record_count, header.attributes


SOLE_BATCH_READERS = [sole_batch_python] + [sole_batch] * (sole_batch is not sole_batch_python)
"""The Python reference and the compiled reader (where the build made it)."""


@pytest.mark.parametrize("read", SOLE_BATCH_READERS, ids=lambda read: read.__module__)
@given(data=st.data())
def test_sole_batch_says_what_iter_batches_says_of_one_batch(
    read: Callable[[bytes | memoryview], tuple[int, int] | None], data: st.DataObject
) -> None:
    """The forwarder's per-frame shortcut: one whole batch as iter_batches reads it, or None
    (then the forwarder asks iter_batches), on valid, joined, cut and altered batches."""
    one = build_batch([b"v" * data.draw(st.integers(0, 40))] * data.draw(st.integers(1, 3)))
    raw = bytearray(
        data.draw(st.sampled_from([one, one + one, one[:-1], one + b"\0", one[:60], b""]))
    )
    for _ in range(data.draw(st.integers(0, 2))):
        if raw:
            raw[data.draw(st.integers(0, min(len(raw), 70) - 1))] = data.draw(st.integers(0, 255))
    assert read(bytes(raw)) == iter_batches_says(bytes(raw))
    assert read(memoryview(bytes(raw))) == iter_batches_says(bytes(raw))


@pytest.mark.parametrize("read", SOLE_BATCH_READERS, ids=lambda read: read.__module__)
def test_sole_batch_reads_the_count_and_attributes(
    read: Callable[[bytes | memoryview], tuple[int, int] | None],
) -> None:
    batch = build_batch([b"a", b"b", b"c"], transactional=True)
    assert read(batch) == (3, 0x10) == iter_batches_says(batch)
    assert read(memoryview(batch)) == (3, 0x10)
    assert read(bytearray(batch)) == (3, 0x10)
    negative = bytearray(batch)
    negative[21:23] = b"\xff\xfe"  # attributes are a signed int16, as the broker reads them
    assert read(bytes(negative)) == (3, -2)
    negative[57:61] = struct.pack(">i", -3)  # a negative record count: no batch to forward
    assert read(bytes(negative)) is None is iter_batches_says(bytes(negative))
    assert read(batch[:-1]) is None and read(batch + b"\0") is None
    assert read(b"\0" * (HEADER_SIZE - 1)) is None


def test_the_agent_reads_frames_with_the_compiled_sole_batch_where_built() -> None:
    compiled = pytest.importorskip("durable_producer.buffer_agent.kafka._batch_merge")
    assert sole_batch is compiled.sole_batch


@given(st.integers(-5, 2**40), st.integers(-1, 5), st.integers(-3, 2**31 - 1))
def test_carries_sequences_reads_what_the_header_says(
    producer_id: int, epoch: int, base_sequence: int
) -> None:
    batch = record_batch(
        [b"v"], producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence
    )
    assert carries_sequences(batch) == parse_batch_header(batch).is_idempotent
