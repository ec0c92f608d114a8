"""Batch validation against the decoder: whatever validation accepts decodes into the records
the client sent; whatever it refuses gets a broker's error.

Batches come from an independent encoder (kafka-python) and independent compressors (stdlib
gzip, python-snappy, lz4, zstandard), then are mutated with the CRC recomputed, so only the
content is wrong: the case a CRC check alone lets through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.produce import invalid_batch_error
from durable_producer.buffer_agent.kafka import record_decode
from durable_producer.buffer_agent.kafka.record_batch import (
    InvalidRecordBatch,
    iter_batches,
)
from durable_producer.buffer_agent.kafka.record_decode import iter_decoded
from durable_producer.buffer_agent.kafka.record_validate import (
    DecompressedTooLarge,
    InvalidRecords,
    RecordCountMismatch,
    UndecompressableRecords,
    UnknownCodec,
    validate_batch,
)
from support.batch_builder import SampleRecord, build_batch
from support.ingest_harness import (
    BATCH_HEADER_SIZE,
    header_field,
    mutate,
    mutation,
    recompress,
    reframe,
    with_header,
)

CODECS = [0, 1, 2, 3, 4]
LIMIT = 1 << 20

optional_bytes = st.none() | st.binary(max_size=200)
record_strategy = st.builds(
    SampleRecord,
    key=optional_bytes,
    value=optional_bytes,
    timestamp_ms=st.integers(min_value=0, max_value=2**41),
    headers=st.lists(st.tuples(st.text(max_size=10), optional_bytes), max_size=3).map(tuple),
)


READERS = ["scan", "aiokafka", "pure-python"]
"""How validation walks the records: the C scanner (when built), aiokafka's compiled reader,
or the pure-Python loop (the decoder uses the reader of the last two that applies)."""


@contextlib.contextmanager
def reader(name: str) -> Iterator[None]:
    if name == "scan":
        if record_decode._scan_records is None:
            pytest.skip("the C record scanner is not built (no C compiler at install)")
        yield
    elif name == "aiokafka":
        with mock.patch.object(record_decode, "_scan_records", None):
            yield
    else:
        with mock.patch.object(record_decode, "_FastBatch", None):
            yield


def validate(batch: bytes) -> None:
    ((header, view),) = list(iter_batches(batch))  # framing and CRC hold
    validate_batch(view, header, LIMIT)


def decoded(batch: bytes) -> list[tuple[Any, ...]]:
    """The records of ``batch`` as (value, key, timestamp, headers or None)."""
    records = [record for batch_ in iter_decoded(batch) for record in batch_.records]
    return [(r.value, r.key, r.timestamp_ms, r.headers or None) for r in records]


def expected(records: list[SampleRecord]) -> list[tuple[Any, ...]]:
    return [(r.value, r.key, r.timestamp_ms, list(r.headers) or None) for r in records]


@pytest.mark.parametrize("walk", READERS)
@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, min_size=1, max_size=20))
def test_valid_batches_are_accepted_and_decoded_as_sent(
    codec: int, walk: str, records: list[SampleRecord]
) -> None:
    batch = recompress(build_batch(records), codec)
    with reader(walk):
        validate(batch)
        assert decoded(batch) == expected(records)


@pytest.mark.parametrize("walk", READERS)
@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_strategy, min_size=1, max_size=8),
    mutations=st.lists(mutation, min_size=1, max_size=3),
)
def test_accepted_means_decodable_and_refused_means_a_broker_error(
    codec: int, walk: str, records: list[SampleRecord], mutations: list[Any]
) -> None:
    batch = recompress(build_batch(records), codec)
    for kind, a, b in mutations:
        batch = mutate(batch, kind, a, b)
    with reader(walk):
        try:
            validate(batch)
        except InvalidRecordBatch as error:
            assert invalid_batch_error(error) in (
                ErrorCode.corrupt_message,
                ErrorCode.invalid_record,
                ErrorCode.message_too_large,
            )
            return
        calls = decoded(batch)  # never raises for an accepted batch
    assert len(calls) == header_field(batch, "record_count")


@pytest.mark.parametrize("walk", READERS)
@settings(max_examples=300, deadline=None)
@given(codec=st.sampled_from(CODECS), count=st.integers(1, 5), body=st.binary(max_size=300))
def test_random_records_sections_are_refused_or_decodable(
    walk: str, codec: int, count: int, body: bytes
) -> None:
    base = build_batch([SampleRecord(None, b"x", 1_700_000_000_000)])
    batch = with_header(
        base[:BATCH_HEADER_SIZE] + body,
        record_count=count,
        last_offset_delta=count - 1,
        attributes=codec,
    )
    with reader(walk):
        try:
            validate(batch)
        except InvalidRecordBatch:
            return
        assert len(decoded(batch)) == count


# ---------------------------------------------------------------------- each case, its error
def good_batch(count: int = 3) -> bytes:
    return build_batch(
        [SampleRecord(b"k%d" % i, b"value-%d" % i, 1_700_000_000_000 + i) for i in range(count)]
    )


def refusal(batch: bytes) -> tuple[type[InvalidRecordBatch], ErrorCode]:
    with pytest.raises(InvalidRecordBatch) as caught:
        validate(batch)
    return type(caught.value), invalid_batch_error(caught.value)


def test_a_record_count_above_the_records_present_is_invalid_record() -> None:
    batch = with_header(good_batch(3), record_count=5, last_offset_delta=4)
    assert refusal(batch) == (InvalidRecords, ErrorCode.invalid_record)


def test_a_record_count_below_the_records_present_is_invalid_record() -> None:
    batch = with_header(good_batch(3), record_count=2, last_offset_delta=1)
    assert refusal(batch) == (InvalidRecords, ErrorCode.invalid_record)


def test_a_record_count_disagreeing_with_the_last_offset_delta_is_invalid_record() -> None:
    batch = with_header(good_batch(3), record_count=5)
    assert refusal(batch) == (RecordCountMismatch, ErrorCode.invalid_record)
    assert refusal(with_header(good_batch(1), record_count=0, last_offset_delta=-1))[0] is (
        RecordCountMismatch
    )


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_codecs_5_6_7_are_corrupt_message(codec: int) -> None:
    batch = with_header(good_batch(), attributes=codec)
    assert refusal(batch) == (UnknownCodec, ErrorCode.corrupt_message)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_codec_flag_on_an_uncompressed_body_is_corrupt_message(codec: int) -> None:
    batch = with_header(good_batch(), attributes=codec)
    assert refusal(batch) == (UndecompressableRecords, ErrorCode.corrupt_message)


@pytest.mark.parametrize("codec", CODECS)
def test_a_truncated_record_is_invalid_record(codec: int) -> None:
    plain = good_batch()
    batch = recompress(reframe(plain[:-3]), codec)
    assert refusal(batch) == (InvalidRecords, ErrorCode.invalid_record)


@pytest.mark.parametrize("codec", CODECS)
def test_bytes_after_the_last_record_are_invalid_record(codec: int) -> None:
    batch = recompress(reframe(good_batch() + b"\x00\x00"), codec)
    assert refusal(batch) == (InvalidRecords, ErrorCode.invalid_record)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_records_decompressing_beyond_the_limit_are_message_too_large(codec: int) -> None:
    records = [SampleRecord(None, b"\x00" * 100_000, 1_700_000_000_000 + i) for i in range(20)]
    batch = recompress(build_batch(records), codec)
    ((header, view),) = list(iter_batches(batch))
    with pytest.raises(DecompressedTooLarge) as caught:
        validate_batch(view, header, 1 << 20)
    assert invalid_batch_error(caught.value) == ErrorCode.message_too_large
    validate_batch(view, header, 4 << 20)  # within a limit above its size
