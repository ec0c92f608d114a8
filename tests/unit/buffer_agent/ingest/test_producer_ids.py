"""producer_ids: ids unique across restarts and above those found in the WAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest.producer_ids import (
    MAX_PRODUCER_ID,
    PRODUCER_IDS_FILE,
    ProducerIdAllocator,
)
from durable_producer.buffer_agent.volume.state_file import DAMAGED_SUFFIX


def test_producer_ids_are_unique_across_restarts(tmp_path: Path) -> None:
    first = ProducerIdAllocator(tmp_path, block_size=3)
    issued = [first.allocate() for _ in range(5)]
    second = ProducerIdAllocator(tmp_path, block_size=3)  # "restart": unused ids are skipped
    issued += [second.allocate() for _ in range(4)]
    assert len(set(issued)) == len(issued)
    assert issued[:5] == [0, 1, 2, 3, 4]
    assert min(issued[5:]) >= 6


def test_producer_ids_stay_above_ids_seen_in_the_wal(tmp_path: Path) -> None:
    allocator = ProducerIdAllocator(tmp_path)
    allocator.ensure_above(41)
    assert allocator.allocate() == 42


def test_allocator_rejects_empty_blocks(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ProducerIdAllocator(tmp_path, block_size=0)


@pytest.mark.parametrize(
    "value",
    [
        "9223372036854775808",  # MAX_PRODUCER_ID + 1: every InitProducerId failed to encode
        "9223372036854775900",
        "1e400",  # a float (inf): an OverflowError traceback, exit 1
        "12.5",
        "-1",
        "true",
        '"12"',
    ],
)
def test_a_next_unreserved_no_producer_id_can_be_is_damage(tmp_path: Path, value: str) -> None:
    path = tmp_path / PRODUCER_IDS_FILE
    path.write_text(f'{{"next_unreserved": {value}}}')

    ids = ProducerIdAllocator(tmp_path)

    assert ids.damage is not None and "next_unreserved" in ids.damage.reason
    assert (tmp_path / f"{PRODUCER_IDS_FILE}{DAMAGED_SUFFIX}").exists()
    assert 0 < ids.allocate() <= MAX_PRODUCER_ID  # counting from the current time instead


def test_the_largest_producer_id_is_still_one(tmp_path: Path) -> None:
    (tmp_path / PRODUCER_IDS_FILE).write_text(f'{{"next_unreserved": {MAX_PRODUCER_ID}}}')
    ids = ProducerIdAllocator(tmp_path)
    assert ids.damage is None and ids.allocate() == MAX_PRODUCER_ID
