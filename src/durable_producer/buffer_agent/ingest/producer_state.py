"""Sequence state across agent restarts: a snapshot file plus a replay of the WAL after it.

Sequence state (``sequences``) is snapshotted to ``DATA/state/producer_state.json`` together
with the WAL offset it covers; on start the snapshot is loaded and the WAL frames at or above
that offset are replayed (the WAL keeps each client batch verbatim, header included). The agent
must snapshot before checkpointing the WAL past the snapshot's offset (the forwarder calls
``IngestServer.snapshot_producer_state`` first); if frames in between were deleted anyway,
restored partitions accept the next in-order-or-not batch once ("lenient") instead of refusing
a producer whose history the agent no longer has.

The offset a snapshot covers is the lowest WAL offset whose batch may be missing from it: the
start of the oldest append still running (its batches are recorded but not yet confirmed, and
snapshots keep confirmed batches only), else the WAL's next offset.

A snapshot the disk has no room for (the file is replaced through a temporary copy, which
needs new blocks) is skipped with one log line; the previous snapshot stays and the next
periodic snapshot tries again. The consequence: if the agent restarts before a snapshot
succeeds and a checkpoint has meanwhile deleted the frames after the old snapshot, sequence
checks are lenient once per partition (a client's retry of a batch stored just before the
restart could then be stored twice: a duplicate, never a loss).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path

from durable_producer.buffer_agent.ingest.producer_ids import MAX_PRODUCER_ID
from durable_producer.buffer_agent.ingest.sequences import SequenceTracker
from durable_producer.buffer_agent.kafka.record_batch import (
    InvalidRecordBatch,
    carries_sequences,
    iter_batches,
    parse_batch_header,
    sole_batch,
)
from durable_producer.buffer_agent.volume.atomic_file import write_atomic
from durable_producer.buffer_agent.volume.format import MAX_OFFSET
from durable_producer.buffer_agent.volume.state_file import StateDamage, read_json_state, set_aside
from durable_producer.buffer_agent.wal import Frame, WriteAheadLog
from durable_producer.buffer_agent.wal.log_id import LogId

log = logging.getLogger(__name__)

PRODUCER_STATE_FILE = "producer_state.json"
_FORMAT_VERSION = 1
_REPLAY_FRAMES = 4096
_FALLBACK = (
    "rebuilding sequence state from the WAL alone (a client's retry of a batch already"
    " delivered to Kafka may then be stored again: a duplicate, never a loss)"
)


class ProducerStateStore:
    """The sequence-state snapshot file: ``{"wal_offset": S, "wal_id": W, "producers": ...}``.

    ``S`` is the lowest WAL offset whose batch may be missing from the snapshot; replaying the
    WAL from ``S`` on start brings the state up to date. ``W`` names the WAL ``S`` is an
    offset of (``wal/log_id.py``): a snapshot of another log (the WAL recreated beside a kept
    ``state/``) is not used, as it would answer a retry of a batch that log lost "stored".
    """

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(state_dir) / PRODUCER_STATE_FILE
        self.damage: StateDamage | None = None
        """The snapshot was unusable at the last load."""

    def load(self, log_id: LogId) -> tuple[SequenceTracker, int]:
        """The snapshot of the log ``log_id`` names and the offset it covers (empty, 0: none)."""
        read = read_json_state(self._path, fallback=_FALLBACK)
        self.damage = read.damage
        if read.document is None:
            return SequenceTracker(), 0
        try:
            kept = str(read.document.get("wal_id", ""))
            tracker = SequenceTracker.from_json(read.document)
            offset = int(read.document["wal_offset"])
            if not 0 <= offset <= MAX_OFFSET:
                raise ValueError(f"wal_offset {offset} is no WAL offset")
            if tracker.max_producer_id() > MAX_PRODUCER_ID:  # ids above it were handed out
                raise ValueError(f"producer id {tracker.max_producer_id()} is beyond 64 bits")
        # OverflowError: a number such as 1e400 (a float, inf) where a whole one belongs
        except (
            ValueError, KeyError, TypeError, AttributeError, AssertionError, OverflowError
        ) as error:
            self.damage = set_aside(self._path, f"not a producer state ({error!r})", _FALLBACK)
            return SequenceTracker(), 0
        if not log_id.named_by(kept):
            log.warning(
                "producer state snapshot %s was %s: %s",
                self._path,
                log_id.other_than(kept),
                _FALLBACK,
            )
            return SequenceTracker(), 0
        return tracker, offset

    def save(self, tracker: SequenceTracker, wal_offset: int, wal_id: str) -> None:
        self.save_text(tracker.to_json_text(), wal_offset, wal_id)

    def save_text(self, state: str, wal_offset: int, wal_id: str) -> None:
        """Write a :meth:`SequenceTracker.to_json_text` result (safe to call from a worker
        thread). Raises ``OSError`` (e.g. ENOSPC) with the previous file left as it was."""
        assert state.startswith("{") and state.endswith("}")
        head = f'"version":{_FORMAT_VERSION},"wal_offset":{int(wal_offset)},"wal_id":"{wal_id}"'
        document = f"{{{head},{state[1:]}"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self._path, document.encode())


class ProducerState:
    """The listener's live sequence state and its durability.

    The produce path checks batches against :attr:`sequences`, brackets each WAL append with
    :meth:`append_started`/:meth:`append_finished` and sets :attr:`dirty` after one succeeded.
    """

    def __init__(self, wal: WriteAheadLog, state_dir: Path) -> None:
        self._wal = wal
        self._store = ProducerStateStore(state_dir)
        self.sequences = SequenceTracker()
        self.dirty = False
        """Batches were stored since the last snapshot."""
        self._inflight_starts: collections.Counter[int] = collections.Counter()
        self._snapshot_lock = asyncio.Lock()
        self._save_failing = False
        self.restored = False
        """:meth:`restore` finished: until then a snapshot would save the empty tracker over
        the file restore reads, so :meth:`snapshot` does nothing."""

    @property
    def damage(self) -> StateDamage | None:
        """The snapshot file was unusable when restore read it."""
        return self._store.damage

    def restore(self) -> None:
        """Load the snapshot and replay the WAL after it (blocking: run in a worker thread)."""
        tracker, snapshot_offset = self._store.load(self._wal.log_id)
        start = max(snapshot_offset, self._wal.checkpoint_offset)
        if snapshot_offset < self._wal.checkpoint_offset and len(tracker):
            log.warning(
                "producer state snapshot covers WAL offsets below %d but the WAL starts at %d:"
                " sequence checks are lenient once per partition",
                snapshot_offset,
                self._wal.checkpoint_offset,
            )
            tracker.mark_lenient()  # a replayed batch makes its partition strict again
        replayed = 0
        with self._wal.reader(start) as reader:
            while frames := reader.poll(max_frames=_REPLAY_FRAMES):
                for frame in frames:
                    replayed += _replay(tracker, frame)
        self.sequences = tracker
        self.restored = True
        log.info(
            "producer state restored: %d producers, %d batches replayed from WAL offset %d",
            len(tracker),
            replayed,
            start,
        )

    def append_started(self) -> int:
        """An append is about to run: snapshots cover nothing from here on until it finishes.

        Returns the token to hand to :meth:`append_finished`.
        """
        start = self._wal.next_offset
        self._inflight_starts[start] += 1
        return start

    def append_finished(self, start: int) -> None:
        self._inflight_starts[start] -= 1
        if not self._inflight_starts[start]:
            del self._inflight_starts[start]

    async def snapshot(self, expire_idle_s: float) -> None:
        """Persist sequence state with the WAL offset from which a restart must replay.

        Producers idle for ``expire_idle_s`` are forgotten first. Snapshots run one at a time
        (the forwarder's pre-checkpoint snapshot can meet the periodic or the shutdown one):
        they share a temp file, and each one's document is taken after the previous one was
        saved, so a newer snapshot is never replaced by an older one.
        """
        if not self.restored:
            return  # never replace the file restore has not read yet with the empty tracker
        async with self._snapshot_lock:
            covered_below = min(self._inflight_starts, default=self._wal.next_offset)
            expired = self.sequences.expire(expire_idle_s)
            if expired:
                log.info("forgot the sequence state of %d idle producers", expired)
            # Taken in the loop (a consistent view); only changed producers are rendered.
            document = self.sequences.to_json_text()
            self.dirty = False
            try:
                await asyncio.to_thread(
                    self._store.save_text, document, covered_below, self._wal.log_id.value
                )
            except OSError as error:
                self.dirty = True  # the next periodic snapshot tries again
                if not self._save_failing:
                    self._save_failing = True
                    log.warning(
                        "cannot write the producer state snapshot (%s); keeping the previous"
                        " one and retrying every snapshot interval. Until one is written, a"
                        " restart may check sequences leniently once per partition",
                        error,
                    )
                return
            if self._save_failing:
                self._save_failing = False
                log.info("producer state snapshot written again")


def _replay(tracker: SequenceTracker, frame: Frame) -> int:
    """Apply a WAL frame's batches to ``tracker`` (restore): how many batches it holds."""
    payload = frame.payload
    if sole_batch(payload) is not None:  # one client batch, as the agent stores them
        if carries_sequences(payload):  # (else nothing to restore: no idempotence)
            tracker.replay(frame.topic, frame.partition, parse_batch_header(payload), frame.offset)
        return 1
    replayed = 0
    try:  # an older agent's frame of several batches, or no batch
        for header, _ in iter_batches(payload, check_crc=False):
            tracker.replay(frame.topic, frame.partition, header, frame.offset)
            replayed += 1
    except InvalidRecordBatch as exc:
        log.warning("WAL frame %d is not a record batch: %s", frame.offset, exc)
    return replayed
