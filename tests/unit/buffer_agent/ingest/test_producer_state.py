"""producer_state: the snapshot file, restore by WAL replay, and the offset a snapshot covers."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest import producer_state as producer_state_module
from durable_producer.buffer_agent.ingest.producer_state import (
    PRODUCER_STATE_FILE,
    ProducerState,
    ProducerStateStore,
)
from durable_producer.buffer_agent.ingest.sequences import SequenceTracker, SequenceVerdict
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.log_id import LogId
from support.ingest_harness import record_batch
from support.producer_batches import accept, header
from support.wal_helpers import SMALL

LOG = LogId("0123456789abcdef" * 2)


def test_snapshot_keeps_confirmed_batches_only(tmp_path: Path) -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0, records=4), 20)
    tracker.record("t", 0, header(7, 1, 4))  # append still running
    store = ProducerStateStore(tmp_path)
    store.save(tracker, 21, LOG.value)
    restored, offset = store.load(LOG)
    assert offset == 21
    assert restored.check("t", 0, header(7, 1, 0, records=4)).verdict is SequenceVerdict.DUPLICATE
    assert restored.check("t", 0, header(7, 1, 4)).verdict is SequenceVerdict.ACCEPT
    assert restored.check("t", 0, header(7, 0, 4)).verdict is SequenceVerdict.INVALID_EPOCH


def test_corrupt_snapshot_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "producer_state.json").write_text("{not json")
    tracker, offset = ProducerStateStore(tmp_path).load(LOG)
    assert len(tracker) == 0 and offset == 0


def test_a_snapshot_of_another_wal_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The WAL recreated beside a kept ``state/`` (offsets from 0 again): the old snapshot
    would answer a client's retry of a batch the old log held "stored" while no log holds it,
    and its offset would skip the new log's frames below it in the replay."""
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0, records=4), 20)
    store = ProducerStateStore(tmp_path)
    store.save(tracker, 21, LOG.value)
    other = LogId("f" * 32)
    with caplog.at_level(logging.WARNING):
        restored, offset = store.load(other)
    assert (len(restored), offset) == (0, 0)
    assert "was written for another WAL (id 0123456789abcdef0123456789abcdef; this one is" in (
        caplog.records[0].getMessage()
    )
    assert len(store.load(LOG)[0]) == 1, "kept for the log it names"


def test_a_snapshot_from_before_log_ids_is_used_only_on_an_upgrade(tmp_path: Path) -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 1, 0), 20)
    ProducerStateStore(tmp_path).save(tracker, 21, "")
    document = json.loads((tmp_path / PRODUCER_STATE_FILE).read_bytes())
    del document["wal_id"]  # as an older agent wrote it
    (tmp_path / PRODUCER_STATE_FILE).write_text(json.dumps(document))
    assert ProducerStateStore(tmp_path).load(LogId("a" * 32, adopted=True))[1] == 21
    assert ProducerStateStore(tmp_path).load(LogId("a" * 32))[1] == 0


def test_a_recreated_wal_is_replayed_whole(tmp_path: Path) -> None:
    """Against real logs: the old snapshot's offset (2) lay above the new log's frames."""
    with WriteAheadLog.open(tmp_path / "old", SMALL) as wal:
        state = ProducerState(wal, tmp_path / "state")
        state.restore()
        for sequence in range(2):
            stored_at = wal.append("t", 0, idempotent_batch(sequence), 1)
            accept(state.sequences, header(7, 0, sequence), stored_at)
        asyncio.run(state.snapshot(expire_idle_s=3600))
    with WriteAheadLog.open(tmp_path / "new", SMALL) as wal:
        other = record_batch([b"v"], producer_id=9, producer_epoch=0, base_sequence=0)
        wal.append("t", 0, other, 1)
        restored = ProducerState(wal, tmp_path / "state")
        restored.restore()
    assert restored.sequences.check("t", 0, header(7, 0, 0)).verdict is not (
        SequenceVerdict.DUPLICATE
    ), "the old log's batch is in no log now: never answered stored"
    assert restored.sequences.check("t", 0, header(9, 0, 0)).verdict is SequenceVerdict.DUPLICATE


def test_idle_producers_expire_and_survive_snapshots(tmp_path: Path) -> None:
    tracker = SequenceTracker()
    accept(tracker, header(7, 0, 0), 1)
    accept(tracker, header(8, 0, 0), 2)
    store = ProducerStateStore(tmp_path)
    store.save(tracker, 3, LOG.value)
    restored, _ = store.load(LOG)
    assert restored.expire(idle_s=3600) == 0
    assert restored.expire(idle_s=3600, now=time.time() + 7200) == 2
    assert len(restored) == 0


def idempotent_batch(sequence: int) -> bytes:
    return record_batch([b"v"], producer_id=7, producer_epoch=0, base_sequence=sequence)


def test_restore_replays_the_wal_after_the_snapshot(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        state = ProducerState(wal, tmp_path / "state")
        accept(state.sequences, header(7, 0, 0), wal.append("t", 0, idempotent_batch(0), 1))
        asyncio.run(state.snapshot(expire_idle_s=3600))
        wal.append("t", 0, idempotent_batch(1), 1)  # stored after the snapshot
        restored = ProducerState(wal, tmp_path / "state")
        restored.restore()
    assert restored.sequences.check("t", 0, header(7, 0, 0)).verdict is SequenceVerdict.DUPLICATE
    assert restored.sequences.check("t", 0, header(7, 0, 1)).verdict is SequenceVerdict.DUPLICATE
    assert restored.sequences.check("t", 0, header(7, 0, 2)).verdict is SequenceVerdict.ACCEPT
    assert restored.sequences.max_producer_id() == 7


def test_snapshot_covers_nothing_from_a_running_append_on(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        wal.append("t", 0, idempotent_batch(0), 1)
        state = ProducerState(wal, state_dir)
        state.restore()
        start = state.append_started()
        wal.append("t", 0, idempotent_batch(1), 1)  # the running append
        asyncio.run(state.snapshot(expire_idle_s=3600))
        assert json.loads((state_dir / PRODUCER_STATE_FILE).read_bytes())["wal_offset"] == start
        state.append_finished(start)
        asyncio.run(state.snapshot(expire_idle_s=3600))
        document = json.loads((state_dir / PRODUCER_STATE_FILE).read_bytes())
        assert document["wal_offset"] == wal.next_offset == 2
    assert not state.dirty


def test_lost_history_makes_restored_partitions_lenient_once(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        tracker = SequenceTracker()
        accept(tracker, header(7, 0, 0), 0)
        ProducerStateStore(tmp_path / "state").save(tracker, 0, wal.log_id.value)
        wal.append("t", 0, idempotent_batch(0), 1)
        wal.append("t", 0, idempotent_batch(1), 1)
        wal.checkpoint(2)  # frames the snapshot does not cover are gone
        restored = ProducerState(wal, tmp_path / "state")
        restored.restore()
    assert restored.sequences.check("t", 0, header(7, 0, 9)).verdict is SequenceVerdict.ACCEPT


def test_a_snapshot_the_disk_has_no_room_for_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = tmp_path / "state"
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        wal.append("t", 0, idempotent_batch(0), 1)
        state = ProducerState(wal, state_dir)
        state.restore()
        asyncio.run(state.snapshot(expire_idle_s=3600))
        before = (state_dir / PRODUCER_STATE_FILE).read_bytes()
        wal.append("t", 0, idempotent_batch(1), 1)
        state.dirty = True
        real_write = os.write

        def full(fd: int, data: bytes | memoryview) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        for _ in range(3):
            asyncio.run(state.snapshot(expire_idle_s=3600))  # no exception
        lines = [r for r in caplog.records if "cannot write the producer state" in r.message]
        assert len(lines) == 1, "one line for the whole full period"
        assert state.dirty, "the next periodic snapshot tries again"
        assert (state_dir / PRODUCER_STATE_FILE).read_bytes() == before
        assert [p.name for p in state_dir.iterdir()] == [PRODUCER_STATE_FILE], "no temp left"
        monkeypatch.setattr(os, "write", real_write)
        asyncio.run(state.snapshot(expire_idle_s=3600))
        assert json.loads((state_dir / PRODUCER_STATE_FILE).read_bytes())["wal_offset"] == 2
        assert not state.dirty


def test_a_snapshot_before_restore_leaves_the_file_restore_reads(tmp_path: Path) -> None:
    """Review finding 12: the forwarder's pre-checkpoint snapshot could run while restore was
    still replaying and save the empty tracker, so a crash soon after lost the sequence state
    (client retries then stored twice)."""
    state_dir = tmp_path / "state"
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        wal.append("t", 0, idempotent_batch(0), 1)
        first = ProducerState(wal, state_dir)
        first.restore()
        asyncio.run(first.snapshot(expire_idle_s=3600))
        saved = (state_dir / PRODUCER_STATE_FILE).read_bytes()
        assert b'"producers"' in saved and len(first.sequences) == 1

        restarted = ProducerState(wal, state_dir)  # restore not run (yet)
        asyncio.run(restarted.snapshot(expire_idle_s=3600))

        assert (state_dir / PRODUCER_STATE_FILE).read_bytes() == saved
        restarted.restore()
        assert len(restarted.sequences) == 1


def test_a_restore_without_snapshot_holds_a_bounded_part_of_the_backlog(tmp_path: Path) -> None:
    """Review finding 4: restore read 4,096 frames at a time; with 1 MiB client batches that
    is 4 GB against a 512 MiB sidecar (a crash loop at start after `durable-agent drain` or a
    lost snapshot). Now a poll returns about DEFAULT_POLL_BYTES of frames."""
    frames = 200
    config = WalConfig(segment_bytes=64 << 20, max_bytes=1 << 30, max_frame_bytes=2 << 20,
                       fsync=FsyncPolicy.NEVER)  # fmt: skip
    with WriteAheadLog.open(tmp_path / "wal", config) as wal:
        for sequence in range(frames):
            batch = record_batch([b"x" * (1 << 20)], producer_id=9, producer_epoch=0,
                                 base_sequence=sequence)  # fmt: skip
            wal.append("t", 0, batch, 1)
        state = ProducerState(wal, tmp_path / "state")
        tracemalloc.start()
        try:
            state.restore()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 48 << 20, f"restore peaked at {peak >> 20} MiB for {frames} MiB of backlog"
    retry = state.sequences.check("t", 0, header(9, 0, frames - 1))
    assert retry.verdict is SequenceVerdict.DUPLICATE


def test_a_restore_reads_client_batches_as_one_and_finds_the_same_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Restore takes a frame of one client batch as one (``sole_batch``), and passes over one
    without sequences (a client without idempotence) without parsing its header (a full
    replay of 2 million such frames took 3.7 s, most of it in the header's parse): the state
    and the count it reports are those of reading every frame as batches (``iter_batches``)."""
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        for index in range(40):
            wal.append("t", index % 2, record_batch([b"plain"]), 1)
            wal.append("t", index % 2, idempotent_batch(index // 2), 1)
            wal.append("u", 0, record_batch([b"v"], producer_id=8, base_sequence=-1), 1)
        pair = record_batch([b"a"]) + record_batch([b"b"], producer_id=9, producer_epoch=0,
                                                   base_sequence=0)  # fmt: skip
        wal.append("u", 1, pair, 2)  # an older agent's frame of two batches
        wal.append("u", 2, b"not a batch", 1)
        caplog.set_level(logging.INFO, logger="durable_producer.buffer_agent.ingest")
        fast = ProducerState(wal, tmp_path / "fast")
        fast.restore()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(producer_state_module, "sole_batch", lambda payload: None)
            full = ProducerState(wal, tmp_path / "full")
            full.restore()
    assert _without_times(fast.sequences) == _without_times(full.sequences)
    assert set(_without_times(fast.sequences)) == {"7", "9"}
    reports = [r.getMessage() for r in caplog.records if "producer state restored" in r.message]
    assert len(reports) == 2 and reports[0] == reports[1], reports
    assert "122 batches replayed" in reports[0], reports


def _without_times(tracker: SequenceTracker) -> dict[str, object]:
    """The producers' state, without when each was last seen (the time of the replay)."""
    producers = json.loads(tracker.to_json_text())["producers"]
    return {pid: {k: v for k, v in p.items() if k != "last_seen"} for pid, p in producers.items()}


@pytest.mark.parametrize(
    ("offset", "producer_id", "epoch"),
    [
        ("1e400", "5", "0"),  # a float (inf): an OverflowError traceback, exit 1
        ("0", "5", "1e400"),
        ("-5", "5", "0"),
        ("0", "99999999999999999999999", "0"),  # beyond int64: InitProducerId failed after it
    ],
    ids=["offset=1e400", "epoch=1e400", "offset=-5", "producer_id>int64"],
)
def test_a_snapshot_with_numbers_out_of_range_is_set_aside(
    tmp_path: Path, offset: str, producer_id: str, epoch: str
) -> None:
    text = (
        f'{{"version":1,"wal_offset":{offset},"wal_id":"{LOG.value}","producers":'
        f'{{"{producer_id}":{{"epoch":{epoch},"last_seen":0,"partitions":[["t",0,[[0,0,0]]]]}}}}}}'
    )
    (tmp_path / PRODUCER_STATE_FILE).write_text(text)
    store = ProducerStateStore(tmp_path)

    tracker, start = store.load(LOG)

    assert store.damage is not None
    assert (start, list(tracker.producers())) == (0, [])
    assert (tmp_path / f"{PRODUCER_STATE_FILE}.damaged").read_text() == text
