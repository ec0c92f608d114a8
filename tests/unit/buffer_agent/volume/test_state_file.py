"""Damage-tolerant reading of the JSON state files beside the WAL (review finding 14)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest.metadata import METADATA_FILE, MetadataCache
from durable_producer.buffer_agent.ingest.producer_ids import (
    PRODUCER_IDS_FILE,
    ProducerIdAllocator,
)
from durable_producer.buffer_agent.ingest.producer_state import (
    PRODUCER_STATE_FILE,
    ProducerStateStore,
)
from durable_producer.buffer_agent.volume.state_file import DAMAGED_SUFFIX, read_json_state
from durable_producer.buffer_agent.wal.log_id import LogId


def test_an_absent_file_is_no_damage(tmp_path: Path) -> None:
    read = read_json_state(tmp_path / "x.json", fallback="-")
    assert (read.document, read.damage) == (None, None)


DEEPLY_NESTED = b"[" * 100_000
"""JSON nested deeper than the parser goes: a RecursionError, not a ValueError."""


@pytest.mark.parametrize("content", [b"{", b"", b"\xff\xfe", b'{"a": 1', DEEPLY_NESTED])
def test_unparsable_bytes_are_moved_aside_and_reported(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # The level this test reads at, whatever an earlier test left on the root logger
    # (``durable-agent run --log-level ERROR`` in test_startup_errors.py sets it for the process).
    caplog.set_level(logging.WARNING, logger="durable_producer.buffer_agent.volume.state_file")
    path = tmp_path / "x.json"
    path.write_bytes(content)

    read = read_json_state(path, fallback="starting afresh")

    assert read.document is None and read.damage is not None
    assert not path.exists()
    assert (tmp_path / f"x.json{DAMAGED_SUFFIX}").read_bytes() == content
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "starting afresh" in caplog.records[0].getMessage()


def test_a_directory_in_place_of_the_file_is_moved_aside_even_twice(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    for _ in range(2):
        (path / "inside").mkdir(parents=True)
        assert read_json_state(path, fallback="-").damage is not None
        assert not path.exists()
    path.write_text("{}")
    assert read_json_state(path, fallback="-").document == {}


def test_producer_ids_after_a_damaged_file_are_above_any_counted_from_zero(
    tmp_path: Path,
) -> None:
    ids = ProducerIdAllocator(tmp_path, block_size=10)
    handed_out = [ids.allocate() for _ in range(25)]
    (tmp_path / PRODUCER_IDS_FILE).write_text('{"next_unreserved": ')

    restarted = ProducerIdAllocator(tmp_path, block_size=10)

    assert restarted.damage is not None
    fresh = restarted.allocate()
    assert fresh > max(handed_out)
    assert fresh >= (time.time_ns() // 1000) - 10**9  # the current time in microseconds
    again = ProducerIdAllocator(tmp_path, block_size=10)  # the new block was persisted
    assert again.damage is None and again.allocate() > fresh


@pytest.mark.parametrize("document", [[], {"topics": []}, {"topics": {"t": {"partitions": "x"}}}])
def test_a_metadata_cache_of_the_wrong_shape_is_set_aside(tmp_path: Path, document: object) -> None:
    (tmp_path / METADATA_FILE).write_text(json.dumps(document))

    cache = MetadataCache(tmp_path, source=None)

    assert cache.damage is not None and cache.cached_topics() == []
    assert (tmp_path / f"{METADATA_FILE}{DAMAGED_SUFFIX}").exists()


def _producer_state_damage(state_dir: Path) -> object:
    store = ProducerStateStore(state_dir)
    store.load(LogId("0" * 32))
    return store.damage


@pytest.mark.parametrize(
    ("name", "load"),
    [
        (PRODUCER_IDS_FILE, lambda state: ProducerIdAllocator(state).damage),
        (METADATA_FILE, lambda state: MetadataCache(state, source=None).damage),
        (PRODUCER_STATE_FILE, lambda state: _producer_state_damage(state)),
    ],
)
def test_deeply_nested_json_in_any_state_file_is_moved_aside(
    tmp_path: Path, name: str, load: object
) -> None:
    """``"[" * 100000`` stopped the agent's start with a RecursionError traceback, exit 1."""
    (tmp_path / name).write_bytes(DEEPLY_NESTED)

    damage = load(tmp_path)  # type: ignore[operator]

    assert damage is not None
    assert not (tmp_path / name).exists()
    assert (tmp_path / f"{name}{DAMAGED_SUFFIX}").read_bytes() == DEEPLY_NESTED
