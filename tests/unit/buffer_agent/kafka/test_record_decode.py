"""record_decode against an independent encoder (kafka-python) for every codec."""

from __future__ import annotations

import gzip

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
    parse_batch_header,
)
from durable_producer.buffer_agent.kafka.record_decode import (
    XERIAL_SNAPPY_MAGIC,
    decode_batch,
    decompress,
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

optional_bytes = st.none() | st.binary(max_size=300)
header_strategy = st.tuples(st.text(max_size=20), optional_bytes)
record_strategy = st.builds(
    SampleRecord,
    key=optional_bytes,
    value=optional_bytes,
    timestamp_ms=st.integers(min_value=0, max_value=2**41),
    headers=st.lists(header_strategy, max_size=4).map(tuple),
)


def _as_samples(batch: bytes, *, fast: bool = True) -> list[SampleRecord]:
    decoded = decode_batch(batch, fast=fast)
    assert decoded == decode_batch(batch, fast=not fast), "both decoders agree"
    assert [record.offset_delta for record in decoded.records] == list(range(len(decoded.records)))
    return [
        SampleRecord(record.key, record.value, record.timestamp_ms, tuple(record.headers))
        for record in decoded.records
    ]


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
@pytest.mark.parametrize("codec", ALL_CODECS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, min_size=1, max_size=30))
def test_decode_matches_kafka_python_encoder(
    codec: int, fast: bool, records: list[SampleRecord]
) -> None:
    batch = build_batch(records, compression=codec)

    assert _as_samples(batch, fast=fast) == records


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_compressed_batches_really_use_the_codec(codec: int) -> None:
    records = [
        SampleRecord(
            key=b"key-%d" % (i % 7) if i % 3 else None,
            value=b"payload " * 40 + b"%d" % i if i % 5 else b"",
            timestamp_ms=1_732_240_000_000 + i * 1_337,
            headers=(("trace", b"abc" * 10), ("null", None)) if i % 2 else (),
        )
        for i in range(500)
    ]
    batch = build_batch(records, compression=codec)

    assert parse_batch_header(batch).compression == codec
    assert _as_samples(batch) == records


def test_xerial_snappy_framing_is_what_kafka_python_writes() -> None:
    records = [SampleRecord(None, b"x" * 100_000, 1, ())]
    batch = build_batch(records, compression=COMPRESSION_SNAPPY)

    assert batch[61:].startswith(XERIAL_SNAPPY_MAGIC)
    assert _as_samples(batch) == records


@settings(max_examples=40, deadline=None)
@given(records=st.lists(record_strategy, min_size=1, max_size=30))
def test_raw_snappy_as_librdkafka_writes_it(records: list[SampleRecord]) -> None:
    batch = with_raw_snappy(build_batch(records, compression=COMPRESSION_NONE))

    assert parse_batch_header(batch).compression == COMPRESSION_SNAPPY
    assert not batch[61:].startswith(XERIAL_SNAPPY_MAGIC)
    assert _as_samples(batch) == records


def test_timestamps_before_the_base_and_large_deltas_stay_exact() -> None:
    records = [
        SampleRecord(b"k", b"v", 1_700_000_000_999, ()),
        SampleRecord(b"k", b"v", 1_699_999_999_001, ()),
        SampleRecord(b"k", b"v", 1_800_000_000_123, ()),
    ]
    assert [r.timestamp_ms for r in _as_samples(build_batch(records))] == [
        1_700_000_000_999,
        1_699_999_999_001,
        1_800_000_000_123,
    ]


def test_null_and_empty_are_distinguished() -> None:
    records = [
        SampleRecord(None, None, 5, (("h", None),)),
        SampleRecord(b"", b"", 5, (("", b""),)),
    ]
    decoded = decode_batch(build_batch(records)).records

    assert decoded[0].key is None and decoded[0].value is None
    assert decoded[0].headers == [("h", None)]
    assert decoded[1].key == b"" and decoded[1].value == b""
    assert decoded[1].headers == [("", b"")]


def test_several_batches_in_one_payload() -> None:
    first = build_batch([SampleRecord(b"a", b"1", 10, ())], compression=COMPRESSION_GZIP)
    second = build_batch([SampleRecord(b"b", b"2", 20, ()), SampleRecord(None, b"3", 21, ())])

    batches = list(iter_decoded(first + second))

    assert [len(batch.records) for batch in batches] == [1, 2]
    assert batches[1].records[1].value == b"3"


def test_multi_member_gzip_is_fully_decompressed() -> None:
    data = gzip.compress(b"first-") + gzip.compress(b"second")
    assert decompress(COMPRESSION_GZIP, data) == b"first-second"


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
def test_truncated_records_section_is_an_invalid_batch(fast: bool) -> None:
    batch = bytearray(build_batch([SampleRecord(b"key", b"value" * 10, 1, ())] * 3))
    batch[57:61] = (4).to_bytes(4, "big")  # claims 4 records, holds 3

    with pytest.raises(InvalidRecordBatch):
        decode_batch(bytes(batch), fast=fast)


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
def test_bytes_left_over_are_an_invalid_batch(fast: bool) -> None:
    batch = bytearray(build_batch([SampleRecord(b"key", b"value" * 10, 1, ())] * 3))
    batch[57:61] = (2).to_bytes(4, "big")  # claims 2 records, holds 3

    with pytest.raises(InvalidRecordBatch):
        decode_batch(bytes(batch), fast=fast)


def test_corrupt_compressed_data_is_an_invalid_batch() -> None:
    with pytest.raises(InvalidRecordBatch, match="decompress"):
        decompress(COMPRESSION_ZSTD, b"definitely not zstd")


ATTRIBUTES_LOW_BYTE = 22
TIMESTAMP_TYPE_BIT = 0x08
BASE_TIMESTAMP_OFFSET = 27


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
def test_log_append_time_uses_the_batch_max_timestamp(fast: bool) -> None:
    batch = bytearray(build_batch([SampleRecord(b"k", b"v", 100), SampleRecord(b"k", b"w", 250)]))
    batch[ATTRIBUTES_LOW_BYTE] |= TIMESTAMP_TYPE_BIT  # the CRC is not checked when decoding

    records = decode_batch(bytes(batch), fast=fast).records

    assert [record.timestamp_ms for record in records] == [250, 250]


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "pure-python"])
def test_a_batch_without_timestamps_keeps_minus_one(fast: bool) -> None:
    """aiokafka's compiled reader would turn -1 into None; Kafka keeps -1."""
    batch = bytearray(build_batch([SampleRecord(b"k", b"v", 0)]))
    minus_one = (-1).to_bytes(8, "big", signed=True)
    batch[BASE_TIMESTAMP_OFFSET : BASE_TIMESTAMP_OFFSET + 16] = minus_one + minus_one

    assert decode_batch(bytes(batch), fast=fast).records[0].timestamp_ms == -1
