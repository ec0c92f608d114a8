"""Producer ids for idempotent producers, unique across agent restarts.

Ids are allocated in blocks whose upper bound is persisted to ``DATA/state/producer_ids.json``
*before* any id of the block is handed out, so an id never repeats, whatever the crash.
"""

from __future__ import annotations

import json
from pathlib import Path

from durable_producer.buffer_agent.wal.atomic_file import write_atomic

PRODUCER_IDS_FILE = "producer_ids.json"


class ProducerIdAllocator:
    """Producer ids unique across restarts: a block's end is persisted before it is used."""

    def __init__(self, state_dir: Path, block_size: int = 1000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self._path = Path(state_dir) / PRODUCER_IDS_FILE
        self._block_size = block_size
        self._next = self._load()
        self._reserved_until = self._next

    def _load(self) -> int:
        try:
            return int(json.loads(self._path.read_bytes())["next_unreserved"])
        except FileNotFoundError:
            return 0

    def ensure_above(self, producer_id: int) -> None:
        """Never hand out ``producer_id`` or below (ids found in the WAL on start)."""
        if producer_id >= self._next:
            self._next = producer_id + 1

    def allocate(self) -> int:
        if self._next >= self._reserved_until:
            self._reserved_until = self._next + self._block_size
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._path, json.dumps({"next_unreserved": self._reserved_until}).encode())
        producer_id = self._next
        self._next += 1
        return producer_id
