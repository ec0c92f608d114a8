"""producer_ids: ids unique across restarts and above those found in the WAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest.producer_ids import ProducerIdAllocator


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
