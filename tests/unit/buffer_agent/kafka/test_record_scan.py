"""The C record scanner accepts exactly what aiokafka's compiled reader (the forwarder's
decoder) accepts: on valid batches, mutated ones, random bytes and hand-made edge cases."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.batch_builder import SampleRecord, build_batch
from support.ingest_harness import BATCH_HEADER_SIZE, header_field, mutate, mutation, with_header

scan = pytest.importorskip(
    "durable_producer.buffer_agent.kafka._record_scan",
    reason="the C record scanner is not built (no C compiler when the package was installed)",
)
aiokafka_records = pytest.importorskip("aiokafka.record._crecords.default_records")

TEMPLATE = build_batch([SampleRecord(None, b"x", 1_700_000_000_000)])


def aiokafka_accepts(section: bytes, count: int) -> bool:
    batch = with_header(
        TEMPLATE[:BATCH_HEADER_SIZE] + section, record_count=count, last_offset_delta=count - 1
    )
    try:
        deque(aiokafka_records.DefaultRecordBatch(batch), maxlen=0)
    except Exception:  # whatever it raises, the forwarder would not deliver the batch
        return False
    return True


def scan_accepts(section: bytes, count: int) -> bool:
    padded = b"\xff" * 7 + section + b"\x80" * 11  # bytes around must never be read
    try:
        scan.check_records(padded, 7, 7 + len(section), count)
    except ValueError:
        return False
    return True


def agree(section: bytes, count: int) -> bool:
    accepted = scan_accepts(section, count)
    assert accepted == aiokafka_accepts(section, count), (section.hex(), count)
    return accepted


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)  # zigzag, 64 bits
    raw &= (1 << 64) - 1
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def record(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[bytes, bytes | None]] = (),  # type: ignore[assignment]
    *,
    key_length: int | None = None,
    header_count: int | None = None,
    length_delta: int = 0,
) -> bytes:
    body = b"\x00" + varint(0) + varint(0)
    body += varint(key_length if key_length is not None else -1 if key is None else len(key))
    body += key or b""
    body += varint(-1 if value is None else len(value)) + (value or b"")
    body += varint(len(headers) if header_count is None else header_count)
    for name, data in headers:
        body += varint(len(name)) + name + varint(-1 if data is None else len(data)) + (data or b"")
    return varint(len(body) + length_delta) + body


optional_bytes = st.none() | st.binary(max_size=50)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(
        st.builds(
            SampleRecord,
            key=optional_bytes,
            value=optional_bytes,
            timestamp_ms=st.integers(0, 2**41),
            headers=st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3).map(tuple),
        ),
        min_size=1,
        max_size=10,
    ),
    mutations=st.lists(mutation, max_size=3),
)
def test_valid_and_mutated_batches(records: list[SampleRecord], mutations: list[object]) -> None:
    batch = build_batch(records)
    for kind, a, b in mutations:  # type: ignore[misc]
        if kind not in ("codec", "timestamps"):
            batch = mutate(batch, kind, a, b)
    count = header_field(batch, "record_count")
    accepted = agree(batch[BATCH_HEADER_SIZE:], count)
    if not mutations:
        assert accepted


@settings(max_examples=2000, deadline=None)
@given(section=st.binary(max_size=64), count=st.integers(1, 4))
def test_random_bytes(section: bytes, count: int) -> None:
    agree(section, count)


@settings(max_examples=1000, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1).map(varint),
            st.sampled_from([b"\x80" * 9 + b"\x01", b"\x80" * 10 + b"\x00", b"\xff" * 10]),
            st.binary(max_size=6),
        ),
        max_size=12,
    ),
    count=st.integers(1, 3),
)
def test_varint_soup(parts: list[bytes], count: int) -> None:
    agree(b"".join(parts), count)


@pytest.mark.parametrize(
    ("section", "count", "accepted"),
    [
        (record(b"k", b"v"), 1, True),
        (record(None, None), 1, True),
        (record(b"k", b"v") * 3, 3, True),
        (record(b"k", b"v") * 3, 2, False),  # a record left over
        (record(b"k", b"v") * 2, 3, False),  # one missing
        (record(b"k", b"v") + b"\x00", 1, False),  # a byte left over
        (record(b"k", b"v")[:-1], 1, False),  # cut short
        (record(b"k", b"v", length_delta=1), 1, False),
        (record(b"k", b"v", length_delta=-1), 1, False),
        (record(b"", b"v", key_length=-5), 1, True),  # any negative length is null
        (record(b"", b"v", key_length=2**62), 1, False),
        (record(b"", b"v", key_length=2**63 - 1), 1, False),  # overflows a careless bound
        (record(b"k", b"v", header_count=-1), 1, False),
        (record(b"k", b"v", header_count=2**40), 1, False),
        (record(b"k", b"v", [(b"ascii", b"1"), ("ünï".encode(), None)]), 1, True),
        (record(b"k", b"v", [("😀".encode(), b"")]), 1, True),
        (record(b"k", b"v", [(b"\xed\xa0\x80", b"")]), 1, False),  # a surrogate
        (record(b"k", b"v", [(b"\xc0\xaf", b"")]), 1, False),  # overlong
        (record(b"k", b"v", [(b"\xf4\x90\x80\x80", b"")]), 1, False),  # above U+10FFFF
        (record(b"k", b"v", [(b"\xe2\x82", b"")]), 1, False),  # cut inside a character
        (b"\x80" * 10 + b"\x01", 1, False),  # an 11-byte varint
        (b"", 1, False),
    ],
)
def test_edge_cases(section: bytes, count: int, accepted: bool) -> None:
    assert agree(section, count) is accepted


def test_errors_say_which_record_and_what() -> None:
    section = record(b"k", b"v") + record(b"k", b"v", header_count=-1)
    with pytest.raises(ValueError, match="record 1 of 2: the header count is negative"):
        scan.check_records(section, 0, len(section), 2)
    with pytest.raises(ValueError, match="3 bytes left over after 1 records"):
        scan.check_records(record(b"k", b"v") + b"abc", 0, len(record(b"k", b"v")) + 3, 1)
    with pytest.raises(ValueError, match="outside the buffer"):
        scan.check_records(b"abc", 0, 4, 1)
