"""The C frame scanner (``_frame_scan.c``, the forwarder's reads) decodes exactly the frames
the Python decoder (``decode_frame``, the reference) decodes, to the same values, and stops
where the Python decoder finds no whole valid frame: on valid logs, damaged ones, random bytes
and every limit the reader passes."""

from __future__ import annotations

import gc
import random

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.volume.format import MAX_OFFSET
from durable_producer.buffer_agent.wal.frame import (
    Frame,
    FrameProblem,
    decode_frame,
    decode_frames,
    encode_frame_header,
)

scan = pytest.importorskip(
    "durable_producer.buffer_agent.wal._frame_scan",
    reason="the C frame scanner is not built (no C compiler when the package was installed)",
)


def encode(offset: int, topic: str, partition: int, payload: bytes, count: int, ms: int) -> bytes:
    header = encode_frame_header(
        offset, topic.encode(), partition, len(payload), crc32c(payload), count, ms
    )
    return header + payload


def reference(
    data: bytes, pos: int, max_frames: int, max_bytes: int, wanted: int
) -> tuple[list[Frame], int, int, int]:
    """What the reader's Python loop decodes from ``pos`` until the first problem."""
    frames: list[Frame] = []
    view = memoryview(data)
    while pos < len(data) and len(frames) < max_frames and max_bytes > 0:
        decoded = decode_frame(view, pos)
        if isinstance(decoded, FrameProblem) or decoded[0].offset > MAX_OFFSET:
            break  # the C scan leaves an offset no writer of this log made to decode_frame
        frame, pos = decoded
        if frame.offset >= wanted:
            frames.append(frame)
            max_bytes -= len(frame.payload)
            wanted = frame.offset + 1
    return frames, pos, wanted, max_bytes


def agree(data: bytes, pos: int = 0, max_frames: int = 10**6, max_bytes: int = 2**40,
          wanted: int = 0) -> tuple[list[Frame], int, int, int]:
    expected = reference(data, pos, max_frames, max_bytes, wanted)
    got = decode_frames(data, pos, max_frames, max_bytes, wanted)
    assert got == expected
    assert all(type(frame) is Frame for frame in got[0])
    assert [hash(frame) for frame in got[0]] == [hash(tuple(frame)) for frame in got[0]]
    return got


frame_args = st.tuples(
    st.one_of(st.integers(0, 2**63 - 1), st.integers(2**63 - 2, 2**64 - 1)),
    st.sampled_from(["orders", "t", "événements", "a" * 249, "日志"]),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=300),
    st.integers(0, 2**32 - 1),
    # Often one of a few: frames appended in one millisecond share their time's int.
    st.one_of(st.sampled_from([0, 5, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)),
)


@given(st.lists(frame_args, max_size=12))
def test_valid_frames_decode_as_the_python_decoder_decodes_them(frames: list) -> None:
    data = b"".join(encode(*args) for args in frames)
    decoded, end, _, _ = agree(data)
    if all(args[0] <= MAX_OFFSET for args in frames):
        assert end == len(data)
    assert len(decoded) <= len(frames)  # offsets below a decoded one are skipped as the reader


@settings(max_examples=300)
@given(
    st.lists(frame_args, min_size=1, max_size=6),
    st.data(),
)
def test_damage_anywhere_stops_where_the_python_decoder_stops(
    frames: list, data: st.DataObject
) -> None:
    log = bytearray(b"".join(encode(*args) for args in frames))
    kind = data.draw(st.sampled_from(["flip", "cut", "garbage", "zero"]))
    at = data.draw(st.integers(0, len(log) - 1))
    if kind == "flip":
        log[at] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "cut":
        del log[at:]
    elif kind == "garbage":
        log[at:at] = data.draw(st.binary(min_size=1, max_size=50))
    else:
        log[at : at + 40] = bytes(min(40, len(log) - at))
    agree(bytes(log))


@given(
    st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=100)), min_size=1, max_size=10),
    st.integers(0, 12),
    st.integers(-5, 400),
    st.integers(0, 45),
)
def test_limits_and_skipped_offsets_as_the_reader_sets_them(
    frames: list, max_frames: int, max_bytes: int, wanted: int
) -> None:
    data = b"".join(encode(offset, "t", 0, payload, 1, 5) for offset, payload in frames)
    agree(data, 0, max_frames, max_bytes, wanted)


def test_it_starts_at_the_position_given_and_frames_of_one_topic_share_their_topic() -> None:
    first = encode(1, "orders", 0, b"a" * 10, 1, 5)
    data = b"junk" + first + encode(2, "orders", 1, b"b", 1, 6) + encode(3, "other", 0, b"", 0, 7)
    frames, end, wanted, _ = agree(data, pos=4)
    assert [frame.offset for frame in frames] == [1, 2, 3]
    assert end == len(data) and wanted == 4
    assert frames[0].topic is frames[1].topic
    assert agree(data, pos=0)[0] == []  # "junk" is no frame: nothing, end stays at 0


def test_frames_of_one_millisecond_share_its_int_and_others_keep_their_own() -> None:
    times = [1_700_000_000_000, 1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_000, 2**64 - 1]
    data = b"".join(encode(offset, "t", 0, b"x", 1, ms) for offset, ms in enumerate(times))
    frames = agree(data)[0]
    assert [frame.appended_ms for frame in frames] == times
    assert frames[0].appended_ms is frames[1].appended_ms
    assert frames[2].appended_ms is not frames[3].appended_ms


def test_a_topic_that_is_not_utf8_stops_the_scan_where_python_says_why() -> None:
    good = encode(1, "t", 0, b"x", 1, 5)
    payload_crc = crc32c(b"y")
    header = encode_frame_header(2, b"\xff\xfe", 0, 1, payload_crc, 1, 5)
    bad_topic = bytearray(header + b"y")
    frames, end, _, _ = agree(good + bytes(bad_topic))
    assert len(frames) == 1 and end == len(good)
    assert decode_frame(memoryview(good + bytes(bad_topic)), end) is FrameProblem.BAD_CRC


@pytest.mark.parametrize("software", [False, True])
def test_its_crc32c_is_the_crc32c_package(software: bool) -> None:
    rng = random.Random(7)
    for _ in range(300):
        data = rng.randbytes(rng.randint(0, 300))
        start = rng.randint(0, 8)  # unaligned starts
        value = rng.getrandbits(32)
        view = memoryview(data)[start:]  # unaligned starts in memory too
        assert scan.crc32c(view, value, software) == crc32c(view, value)


def test_a_topic_longer_than_kafka_allows_stops_the_scan_as_python_stops() -> None:
    """The C scanner's own copy of the format's limits (MAX_TOPIC_BYTES) holds."""
    from durable_producer.buffer_agent.volume.format import MAX_TOPIC_BYTES

    good = encode(1, "t", 0, b"x", 1, 5)
    for length in (MAX_TOPIC_BYTES, MAX_TOPIC_BYTES + 1):
        topic = b"a" * length
        header = encode_frame_header(2, topic, 0, 1, crc32c(b"y"), 1, 5)
        frames = agree(good + header + b"y")[0]
        assert len(frames) == (2 if length == MAX_TOPIC_BYTES else 1)


def test_the_frames_it_makes_are_left_untracked_by_the_collector() -> None:
    """A Frame holds ints, a str and bytes: no cycle can pass it. CPython's collector never
    untracks a tuple subclass's instance itself, and traversed every frame read ahead in each
    collection it lived through (a tenth of the forwarder's own work a one-record frame,
    docs/benchmarks.md)."""
    data = b"".join(encode(offset, "orders", 3, b"v" * offset, 1, 5) for offset in range(50))
    frames = decode_frames(data, 0, 100, 2**40, 0)[0]
    assert len(frames) == 50
    assert not any(gc.is_tracked(frame) for frame in frames)
    assert frames == reference(data, 0, 100, 2**40, 0)[0]


@pytest.mark.parametrize("entry", ["scan_frames", "scan_spans"])
def test_a_position_before_the_buffer_is_refused_not_read_from_its_start(entry: str) -> None:
    """The scans took a negative ``pos`` as 0 without a word: a caller's arithmetic gone
    wrong would have read frames from the wrong place (found by a review's fuzzing)."""
    data = encode(0, "orders", 0, b"v", 1, 5)
    args = {
        "scan_frames": (data, -1, 10, 2**40, 0, Frame),
        "scan_spans": (memoryview(data), -1, -1, 10, True),
    }[entry]
    with pytest.raises(ValueError, match="pos -1 is before the buffer's start"):
        getattr(scan, entry)(*args)
    assert getattr(scan, entry)(args[0], 0, *args[2:])[0]  # from 0 it reads the frame


def test_a_frame_type_with_an_instance_dict_stays_tracked() -> None:
    """Such an instance could be in a cycle through its dict: the collector keeps it."""

    class WithDict(tuple):
        pass

    data = encode(0, "orders", 0, b"v", 1, 5)
    [frame] = scan.scan_frames(data, 0, 10, 2**40, 0, WithDict)[0]
    assert gc.is_tracked(frame)
    frame.cycle = frame  # what untracking would have leaked
