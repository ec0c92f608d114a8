"""Bounded decompression: compression bombs cost nothing, and the bound never changes a result."""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.kafka.compression import (
    DecompressedTooLarge,
    UndecompressableRecords,
    UnknownCodec,
    decompress,
)
from durable_producer.buffer_agent.kafka.record_batch import InvalidRecordBatch

COMPRESSORS = {
    1: gzip.compress,
    2: lambda data: bytes(cramjam.snappy.compress_raw(data)),
    3: lambda data: bytes(cramjam.lz4.compress(data)),
    4: lambda data: bytes(cramjam.zstd.compress(data)),
}


def outcome(codec: int, data: bytes, limit: int | None) -> bytes | type[Exception]:
    try:
        return decompress(codec, data, limit)
    except InvalidRecordBatch as error:
        return type(error)


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
@settings(max_examples=60, deadline=None)
@given(
    content=st.binary(max_size=5000),
    damage=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    cut=st.none() | st.integers(0, 10_000),
    tail=st.binary(max_size=8),
)
def test_a_limit_above_the_size_never_changes_the_result(
    codec: int, content: bytes, damage: list[tuple[int, int]], cut: int | None, tail: bytes
) -> None:
    """Valid, damaged, cut or extended input: bounded and unbounded decompress accept the
    same input and give the same bytes (a refusal may name another reason: a damaged
    snappy header can claim more than the limit)."""
    data = bytearray(COMPRESSORS[codec](content))
    for position, value in damage:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut % (len(data) + 1) :]
    data += tail
    unbounded = outcome(codec, bytes(data), None)
    bounded = outcome(codec, bytes(data), 1 << 20)
    if isinstance(unbounded, bytes):
        assert bounded == unbounded
    else:
        assert isinstance(bounded, type) and issubclass(bounded, InvalidRecordBatch)
    if data == COMPRESSORS[codec](content):
        assert unbounded == content


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
def test_output_one_byte_over_the_limit_is_too_large(codec: int) -> None:
    content = bytes(range(256)) * 40
    data = COMPRESSORS[codec](content)
    assert decompress(codec, data, len(content)) == content
    with pytest.raises(DecompressedTooLarge):
        decompress(codec, data, len(content) - 1)


def test_unknown_codecs_and_garbage() -> None:
    with pytest.raises(UnknownCodec):
        decompress(5, b"anything", 1 << 20)
    with pytest.raises(UndecompressableRecords):
        decompress(1, b"not gzip", 1 << 20)


BOMBS = """
import resource, sys, gzip, cramjam
from durable_producer.buffer_agent.kafka.compression import DecompressedTooLarge, decompress
zeros = bytes(256 << 20)
bombs = {
    "gzip": (1, gzip.compress(zeros, 1)),
    "lz4": (3, bytes(cramjam.lz4.compress(zeros))),
    "zstd": (4, bytes(cramjam.zstd.compress(zeros))),
    # a raw snappy header claiming 4 GiB: cramjam alone aborts the process allocating it
    "snappy": (2, b"\\xff\\xff\\xff\\xff\\x0f" + bytes(10)),
}
del zeros
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name, (codec, bomb) in bombs.items():
    try:
        decompress(codec, bomb, 1 << 20)
    except DecompressedTooLarge:
        print(name, "refused")
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print("grown KiB", grown)
"""


def test_compression_bombs_are_refused_without_allocating_their_size() -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BOMBS)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[:4] == ["gzip refused", "lz4 refused", "zstd refused", "snappy refused"]
    grown_kib = int(lines[4].split()[-1])
    assert grown_kib < 16 * 1024, f"max RSS grew by {grown_kib} KiB for 1 MiB limits"
