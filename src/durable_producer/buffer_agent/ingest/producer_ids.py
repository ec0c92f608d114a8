"""Producer ids for idempotent producers, unique across agent restarts.

Ids are allocated in blocks whose upper bound is persisted to ``DATA/state/producer_ids.json``
*before* any id of the block is handed out, so an id never repeats, whatever the crash.

A damaged file (``volume/state_file.py``) never stops the agent: counting restarts from the current
time in microseconds, above every id an allocator that counted from 0 can have handed out (ids
found in the WAL are respected as well, ``ensure_above``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from durable_producer.buffer_agent.volume.atomic_file import write_atomic
from durable_producer.buffer_agent.volume.state_file import StateDamage, read_json_state, set_aside

PRODUCER_IDS_FILE = "producer_ids.json"
MAX_PRODUCER_ID = (1 << 63) - 1
"""Kafka's producer ids are 64-bit signed: a ``next_unreserved`` above it (or not a whole
number) is damage, not a place to count from (every InitProducerId answer failed to encode)."""


class ProducerIdAllocator:
    """Producer ids unique across restarts: a block's end is persisted before it is used."""

    def __init__(self, state_dir: Path, block_size: int = 1000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self._path = Path(state_dir) / PRODUCER_IDS_FILE
        self._block_size = block_size
        self.damage: StateDamage | None = None
        """The file was unusable at start (and counting restarted above the old ids)."""
        self._next = self._load()
        self._reserved_until = self._next

    def _load(self) -> int:
        fallback = "producer ids continue from the current time in microseconds"
        read = read_json_state(self._path, fallback=fallback)
        self.damage = read.damage
        if read.damage is not None:
            return _ids_above_any_counted()
        if read.document is None:
            return 0
        try:
            next_unreserved = read.document["next_unreserved"]
            if type(next_unreserved) is not int:  # 1e400 is a float (inf), True a bool
                raise TypeError(f"next_unreserved is {next_unreserved!r}, not a whole number")
            if not 0 <= next_unreserved <= MAX_PRODUCER_ID:
                raise ValueError(
                    f"next_unreserved is {next_unreserved}, outside 0..{MAX_PRODUCER_ID}"
                )
        except (KeyError, TypeError, ValueError) as error:
            self.damage = set_aside(self._path, f"no usable next_unreserved ({error})", fallback)
            return _ids_above_any_counted()
        return next_unreserved

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


def _ids_above_any_counted() -> int:
    """Where counting restarts when the file is lost: above any count from 0 (1.7e15 now)."""
    return time.time_ns() // 1000
