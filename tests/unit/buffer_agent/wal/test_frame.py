from __future__ import annotations

from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from durable_producer.buffer_agent.volume.format import HEADER_SIZE
from durable_producer.buffer_agent.wal.frame import (
    FrameProblem,
    decode_frame,
    encode_frame_header,
)


def encode(offset: int, topic: str, partition: int, payload: bytes, count: int = 3) -> bytes:
    header = encode_frame_header(
        offset, topic.encode(), partition, len(payload), crc32c(payload), count, 1234567890123
    )
    return header + payload


@given(
    offset=st.integers(0, 2**63 - 1),
    topic=st.text(min_size=1, max_size=60),
    partition=st.integers(0, 2**31 - 1),
    payload=st.binary(max_size=2000),
)
def test_frames_round_trip_exactly(offset: int, topic: str, partition: int, payload: bytes) -> None:
    data = encode(offset, topic, partition, payload)
    decoded = decode_frame(memoryview(data), 0)
    assert not isinstance(decoded, FrameProblem)
    frame, end = decoded
    assert end == len(data)
    assert (frame.offset, frame.topic, frame.partition, frame.payload) == (
        offset,
        topic,
        partition,
        payload,
    )
    assert frame.record_count == 3
    assert frame.appended_ms == 1234567890123


def test_every_truncation_is_reported_incomplete() -> None:
    data = encode(7, "orders", 2, b"x" * 50)
    for cut in range(1, len(data)):
        assert decode_frame(memoryview(data[:cut]), 0) is FrameProblem.INCOMPLETE, cut


def test_every_single_bit_flip_is_detected() -> None:
    data = encode(7, "orders", 2, b"payload-bytes")
    for position in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            result = decode_frame(memoryview(bytes(damaged)), 0)
            assert isinstance(result, FrameProblem), (position, bit)


def test_zero_fill_is_not_a_frame() -> None:
    assert decode_frame(memoryview(bytes(HEADER_SIZE + 10)), 0) is FrameProblem.BAD_MAGIC
    assert decode_frame(memoryview(bytes(5)), 0) is FrameProblem.BAD_MAGIC
