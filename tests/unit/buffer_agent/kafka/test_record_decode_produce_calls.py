"""decode_produce_calls: the forwarder's lean decode gives the same records as iter_decoded."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    InvalidRecordBatch,
)
from durable_producer.buffer_agent.kafka.record_decode import (
    decode_batch,
    decode_produce_calls,
    iter_decoded,
)
from support.batch_builder import SampleRecord, build_batch, with_raw_snappy

ALL_CODECS = [
    COMPRESSION_NONE,
    COMPRESSION_GZIP,
    COMPRESSION_SNAPPY,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
]
ATTRIBUTES_LOW_BYTE = 22
TIMESTAMP_TYPE_BIT = 0x08
BASE_TIMESTAMP_OFFSET = 27

optional_bytes = st.none() | st.binary(max_size=200)
record_strategy = st.builds(
    SampleRecord,
    key=optional_bytes,
    value=optional_bytes,
    timestamp_ms=st.integers(min_value=0, max_value=2**41),
    headers=st.lists(st.tuples(st.text(max_size=10), optional_bytes), max_size=3).map(tuple),
)


Varying = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]] | None]


def _on_delivery(error: object, message: object) -> None:
    """Only its identity matters: every call must carry it."""


def decode_produce_args(payload: bytes | memoryview, *, fast: bool = True) -> list[Varying]:
    """The per-record part of each produce call: (value, key, timestamp, headers)."""
    calls = decode_produce_calls(payload, "the-topic", 3, _on_delivery, fast=fast)
    for call in calls:
        assert call[0] == "the-topic" and call[3] == 3
        assert call[4] is _on_delivery and call[5] is None, "callback, then its unused alias"
    return [
        (value, key, timestamp, headers) for _, value, key, _, _, _, timestamp, headers in calls
    ]


def _expected(payload: bytes) -> list[Varying]:
    """What ``iter_decoded`` says, in the produce-argument shape."""
    return [
        (record.value, record.key, record.timestamp_ms, record.headers or None)
        for batch in iter_decoded(payload)
        for record in batch.records
    ]


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
@pytest.mark.parametrize("codec", ALL_CODECS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, min_size=1, max_size=20))
def test_same_records_as_the_sample_encoder_wrote(
    codec: int, fast: bool, records: list[SampleRecord]
) -> None:
    payload = build_batch(records, compression=codec)

    produce_args = decode_produce_args(payload, fast=fast)

    assert produce_args == [
        (record.value, record.key, record.timestamp_ms, list(record.headers) or None)
        for record in records
    ]
    assert produce_args == _expected(payload)


def test_several_batches_keep_the_frame_record_order() -> None:
    """The list index is the record's index in the frame: failures are attributed by it."""
    first = build_batch([SampleRecord(b"a", b"1", 10, ())], compression=COMPRESSION_GZIP)
    second = build_batch(
        [SampleRecord(b"b", b"2", 20, (("h", b"x"),)), SampleRecord(None, b"3", 21)]
    )
    third = with_raw_snappy(build_batch([SampleRecord(b"c", None, 30)]))

    produce_args = decode_produce_args(first + second + third)

    assert produce_args == [
        (b"1", b"a", 10, None),
        (b"2", b"b", 20, [("h", b"x")]),
        (b"3", None, 21, None),
        (None, b"c", 30, None),
    ]


def test_empty_headers_are_none_and_present_ones_keep_order_and_nulls() -> None:
    payload = build_batch(
        [SampleRecord(b"k", b"v", 1, ()), SampleRecord(b"k", b"v", 2, (("b", None), ("a", b"")))]
    )

    assert [headers for *_, headers in decode_produce_args(payload)] == [
        None,
        [("b", None), ("a", b"")],
    ]


def test_log_append_time_uses_the_batch_max_timestamp() -> None:
    batch = bytearray(build_batch([SampleRecord(b"k", b"v", 100), SampleRecord(b"k", b"w", 250)]))
    batch[ATTRIBUTES_LOW_BYTE] |= TIMESTAMP_TYPE_BIT  # the CRC is not checked when decoding

    timestamps = [timestamp for _, _, timestamp, _ in decode_produce_args(bytes(batch))]

    assert timestamps == [250, 250]
    assert timestamps == [record.timestamp_ms for record in decode_batch(bytes(batch)).records]


def test_a_batch_without_timestamps_keeps_minus_one() -> None:
    """The compiled reader would turn -1 into None, which produce() cannot take."""
    batch = bytearray(build_batch([SampleRecord(b"k", b"v", 0)]))
    batch[BASE_TIMESTAMP_OFFSET : BASE_TIMESTAMP_OFFSET + 8] = (-1).to_bytes(8, "big", signed=True)
    batch[BASE_TIMESTAMP_OFFSET + 8 : BASE_TIMESTAMP_OFFSET + 16] = (-1).to_bytes(
        8, "big", signed=True
    )

    assert decode_produce_args(bytes(batch)) == [(b"v", b"k", -1, None)]
    assert decode_batch(bytes(batch)).records[0].timestamp_ms == -1


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
@pytest.mark.parametrize("claimed", [2, 4], ids=["bytes-left-over", "truncated"])
def test_inconsistent_record_counts_are_invalid_batches(fast: bool, claimed: int) -> None:
    batch = bytearray(build_batch([SampleRecord(b"key", b"value" * 10, 1)] * 3))
    batch[57:61] = claimed.to_bytes(4, "big")

    with pytest.raises(InvalidRecordBatch):
        decode_produce_args(bytes(batch), fast=fast)


def test_a_large_uncompressed_frame_is_read_in_place() -> None:
    records = [SampleRecord(b"key-%d" % i, b"%08d" % i * 25, 1_000 + i) for i in range(500)]
    payload = build_batch(records)

    produce_args = decode_produce_args(memoryview(payload))

    assert len(produce_args) == 500
    assert produce_args[499] == (b"%08d" % 499 * 25, b"key-499", 1_499, None)
