"""The forwarder's checkpoint and hint on a full or failing disk: nothing raises, the hint is
rewritten in place, a failed write is retried, the pre-checkpoint hook gets a second chance."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.progress import (
    HINT_FILE,
    LEGACY_HINT_FILES,
    Progress,
    read_hint,
)
from durable_producer.buffer_agent.volume.slot_file import SlotFile
from durable_producer.buffer_agent.wal import WalError, WriteAheadLog
from support.wal_helpers import SMALL, payload_for


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as log:
        for offset in range(10):
            log.append("t", 0, payload_for(offset), 1)
        yield log


def delivered_up_to(offset: int) -> AckTracker:
    """Every frame below ``offset`` read and delivered."""
    tracker = AckTracker(0, {})
    for frame in range(offset):
        tracker.passed(frame)
    return tracker


def test_the_hint_is_kept_in_place_and_replaces_a_legacy_one(
    wal: WriteAheadLog, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / LEGACY_HINT_FILES[0]).write_text(json.dumps({"sent_high": 6, "delivered_high": 4}))
    progress = Progress(wal, state, None, None)
    assert progress.replay_until == 6, "an older agent's hint is still read"
    assert progress.checkpoint(delivered_up_to(8), 8)
    progress.write_hint(delivered_up_to(9), 9, durable=False)
    progress.close()
    assert read_hint(state) == {"sent_high": 9, "delivered_high": 9}
    assert not (state / LEGACY_HINT_FILES[0]).exists()
    assert (state / HINT_FILE).stat().st_size == 1024
    assert wal.checkpoint_offset == 8


def test_failed_writes_are_counted_and_retried_never_raised(
    wal: WriteAheadLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = AgentMetrics()
    progress = Progress(wal, tmp_path / "state", metrics, None)

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def broken_checkpoint(offset: int) -> None:
        raise WalError("could not write checkpoint")

    monkeypatch.setattr(SlotFile, "__init__", full)
    assert progress.checkpoint(delivered_up_to(5), 5), "the WAL checkpoint moved"
    monkeypatch.undo()
    monkeypatch.setattr(wal, "checkpoint", broken_checkpoint)
    assert not progress.checkpoint(delivered_up_to(7), 7)
    monkeypatch.undo()
    errors = metrics.write_errors
    assert errors.labels(file="hint")._value.get() == 1
    assert errors.labels(file="checkpoint")._value.get() == 1
    assert progress.checkpoint(delivered_up_to(7), 7)
    assert read_hint(tmp_path / "state")["delivered_high"] == 7
    progress.close()


def test_a_failed_hook_runs_again_once_the_checkpoint_freed_space(
    wal: WriteAheadLog, tmp_path: Path
) -> None:
    calls: list[int] = []

    def snapshot() -> None:
        calls.append(wal.checkpoint_offset)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")

    progress = Progress(wal, tmp_path / "state", None, snapshot)
    assert progress.checkpoint(delivered_up_to(6), 6)
    assert calls == [0, 6], "before the checkpoint, and again after it deleted segments"
    progress.close()


def test_a_forgotten_hint_counts_nothing_as_sent_and_is_written_over(
    wal: WriteAheadLog, tmp_path: Path
) -> None:
    """Another log's hint (its identity named another WAL): none of this log's frames is a
    possible duplicate, and no early checkpoint waits for a replay."""
    state = tmp_path / "state"
    state.mkdir()
    (state / LEGACY_HINT_FILES[0]).write_text(json.dumps({"sent_high": 500, "delivered_high": 9}))
    progress = Progress(wal, state, None, None)
    assert progress.replay_until == 500
    progress.forget_hint()
    assert progress.replay_until == wal.checkpoint_offset == 0
    assert not progress.replay_delivered_unrecorded(delivered_up_to(10))
    progress.write_hint(delivered_up_to(3), 3, durable=False)
    progress.close()
    assert read_hint(state) == {"sent_high": 3, "delivered_high": 3}


def test_a_deeply_nested_legacy_hint_is_no_hint(tmp_path: Path) -> None:
    """A RecursionError, not a ValueError: it ended the forwarder's start before."""
    (tmp_path / LEGACY_HINT_FILES[0]).write_bytes(b"[" * 100_000)
    assert read_hint(tmp_path) == {}
