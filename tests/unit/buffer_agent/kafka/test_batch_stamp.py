"""Stamping a client batch (producer fields, CRC) and merging uncompressed batches, checked
against an independent reader (kafka-python's)."""

from __future__ import annotations

import sys

import pytest
from kafka.record.default_records import DefaultRecordBatch

from durable_producer.buffer_agent.kafka import batch_stamp
from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    iter_batches,
    parse_batch_header,
)
from support.batch_builder import SampleRecord, build_batch

pytestmark = pytest.mark.skipif(not batch_stamp.can_merge, reason="_batch_merge not built")


def _read(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list]]:
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers]) for r in reader]


def _records(n: int, start_ts: int, tag: str) -> list[SampleRecord]:
    return [
        SampleRecord(
            key=None if i % 3 == 0 else f"{tag}-k{i}".encode(),
            value=None if i == 2 else f"{tag}-v{i}".encode() * (i + 1),
            timestamp_ms=start_ts + i * 7,
            headers=(("h\x00k", b"v"), ("n", None)) if i % 2 else (),
        )
        for i in range(n)
    ]


def test_stamp_rewrites_only_producer_fields_and_crc() -> None:
    batch = build_batch(
        _records(5, 1_700_000_000_000, "a"), producer_id=9, producer_epoch=1, base_sequence=4
    )
    stamped = b"".join(batch_stamp.stamp(batch, 12345, 7, 1000))
    header = parse_batch_header(stamped)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (12345, 7, 1000)
    assert header.partition_leader_epoch == -1
    list(iter_batches(stamped))  # the CRC holds
    assert stamped[61:] == batch[61:]
    assert stamped[21:43] == batch[21:43]  # attributes, deltas, timestamps
    assert _read(stamped) == _read(batch)


def test_stamp_keeps_a_compressed_batch_compressed() -> None:
    records = [SampleRecord(None, b"x" * 1000, 5)] * 20
    batch = build_batch(records, compression=COMPRESSION_GZIP)
    assert len(batch) < 1000
    stamped = b"".join(batch_stamp.stamp(batch, 1, 0, 0))
    assert stamped[61:] == batch[61:]
    assert not batch_stamp.mergeable(parse_batch_header(stamped).attributes)
    assert [r[3] for r in _read(stamped)] == [b"x" * 1000] * 20


def test_merge_keeps_every_record_and_renumbers_offsets() -> None:
    parts = [
        _records(3, 1_700_000_000_000, "a"),
        _records(1, 1_600_000_000_000, "b"),  # older than the first batch's base: negative delta
        _records(4, 1_800_000_000_000, "c"),
    ]
    batches = [build_batch(p) for p in parts]
    body, taken = batch_stamp.merge(batches, 1 << 20)
    assert taken == 3
    merged = b"".join(batch_stamp.stamp(body, 5, 0, 10))
    header = parse_batch_header(merged)
    assert header.record_count == 8 and header.last_offset_delta == 7
    assert header.base_timestamp == 1_700_000_000_000
    assert header.max_timestamp == 1_800_000_000_000 + 21
    expected = [
        (i, r.timestamp_ms, r.key, r.value, list(r.headers))
        for i, r in enumerate(x for p in parts for x in p)
    ]
    assert _read(merged) == expected


def test_merge_takes_the_batches_that_fit_whole() -> None:
    """Only the merge knows a record's new framing: it takes the first batch, and the next
    while the merged batch stays within the limit (here each record's deltas grow, so the
    lengths of the parts add up to less than the merge makes)."""
    parts = [_records(3, 1_700_000_000_000 + 100_000 * i, str(i)) for i in range(6)]
    batches = [build_batch(p) for p in parts]
    references = [sys.getrefcount(batch) for batch in batches]
    for count in range(1, 7):
        exact, taken = batch_stamp.merge(batches[:count], 1 << 20)
        assert taken == count
        assert batch_stamp.merge(batches, len(exact)) == (exact, count)
        assert batch_stamp.merge(batches, len(exact) + 1) == (exact, count)
        if count > 1:
            assert batch_stamp.merge(batches, len(exact) - 1)[1] == count - 1
    records = sum(len(batch) - 61 for batch in batches[:3]) + 61
    assert len(batch_stamp.merge(batches[:3], 1 << 20)[0]) > records, "the framing grew"
    assert [sys.getrefcount(batch) for batch in batches] == references, "no batch held"
    first, taken = batch_stamp.merge(batches, 0)
    assert taken == 1 and _read(b"".join(batch_stamp.stamp(first, 1, 0, 0)))[0][2:4] == (
        parts[0][0].key,
        parts[0][0].value,
    )


def test_merge_keeps_create_time_zero_and_minus_one() -> None:
    batches = [
        build_batch([SampleRecord(b"k", b"v", 0)]),
        build_batch([SampleRecord(b"k", b"w", 5), SampleRecord(b"k", b"x", 5)]),
    ]
    raw = bytearray(batches[1])
    # second record's timestamp delta -6: 5 - 6 = -1 (NO_TIMESTAMP inside a batch)
    reader = _read(bytes(raw))
    assert [r[1] for r in reader] == [5, 5]
    merged, _ = batch_stamp.merge(batches, 1 << 20)
    assert [r[1] for r in _read(b"".join(batch_stamp.stamp(merged, 1, 0, 0)))] == [0, 5, 5]


def test_merge_refuses_malformed_records() -> None:
    batch = bytearray(build_batch(_records(2, 1, "a")))
    del batch[-3:]
    with pytest.raises(ValueError):
        batch_stamp.merge([bytes(batch)], 1 << 20)


@pytest.mark.parametrize("refusal", ["shorter than its header", "negative record count"])
def test_merge_lets_go_of_a_batch_it_refuses_for_its_header(refusal: str) -> None:
    """The merge asks each batch for its buffer; one it refuses for its header is let go
    like the rest (it held a reference to a bytes batch, and kept a view's buffer exported)."""
    good = build_batch(_records(2, 1, "a"))
    bad = b"\x00" * 60 if refusal.startswith("shorter") else good[:57] + b"\xff" * 4 + good[61:]
    references = sys.getrefcount(bad)
    for _ in range(3):
        with pytest.raises(ValueError, match=refusal):
            batch_stamp.merge([good, bad], 1 << 20)
    assert sys.getrefcount(bad) == references, "the refused batch is still referenced"
    view = memoryview(bytearray(bad))
    with pytest.raises(ValueError, match=refusal):
        batch_stamp.merge([good, view], 1 << 20)
    view.release()  # BufferError if the merge still held its buffer
