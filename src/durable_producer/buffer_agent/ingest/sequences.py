"""Broker-style idempotence for producers writing through the agent: sequence checks.

Like a Kafka broker (whose producer state lives in each partition's log), the agent remembers,
per producer id and partition, the producer's epoch there and the last :data:`TRACKED_BATCHES`
batches (their first and last sequence numbers and WAL offsets). A client retry of a batch
already stored is answered as success without a second WAL append; a gap in sequences is
OUT_OF_ORDER_SEQUENCE_NUMBER; a batch from an older epoch than the partition's is
INVALID_PRODUCER_EPOCH. All of it is per batch, from the batch header only.

As on a broker, a new epoch counts on a partition from its first batch *stored* there: when that
batch's append fails (the WAL is full), ``forget`` puts the partition back as it was before the
batch arrived (its older epoch, or unknown). The Java client bumps its epoch when a batch
expires while the agent refuses, and retries the other partitions' older batches: with one
epoch per producer, or the refused epoch kept, the agent answered those INVALID_PRODUCER_EPOCH
where a broker keeps answering the refusal.

This module is pure bookkeeping (no I/O). How the state survives restarts is
``producer_state``'s job (snapshot + WAL replay, "lenient" partitions after lost history);
producer ids come from ``producer_ids``.

Bounded: producers idle for the ingest's ``producer_expiration_s`` are forgotten at the next
snapshot, and at most :data:`MAX_TRACKED_PARTITIONS` (producer, partition) entries are kept:
past that, the least recently seen producers are forgotten (Spark makes a producer per task).
A forgotten producer's next batch is accepted at any sequence, as a broker accepts an unknown
producer; only a retry of a batch stored before would then be stored again. The snapshot text
is rebuilt only for the producers that changed since the previous one (``to_json_text``).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from durable_producer.buffer_agent.kafka.record_batch import BatchHeader

TRACKED_BATCHES = 5
MAX_TRACKED_PARTITIONS = 50_000
"""(producer, partition) entries kept (~300 B each); past it the least recently seen
producers are forgotten, a tenth of the bound at a time."""
_SEQUENCE_MODULUS = 2**31


class SequenceVerdict(enum.Enum):
    """What a produced batch's sequence numbers say against its producer's state on the
    partition: store it, answer it as the copy already stored, or refuse it."""

    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order_sequence"
    INVALID_EPOCH = "invalid_producer_epoch"


@dataclass(slots=True, eq=False)
class StoredBatch:
    """One batch of a producer on a partition; ``wal_offset`` is None while its append runs."""

    base_sequence: int
    last_sequence: int
    wal_offset: int | None = None


@dataclass(frozen=True, slots=True)
class SequenceCheck:
    verdict: SequenceVerdict
    duplicate_of: StoredBatch | None = None
    reason: str = ""


@dataclass(slots=True)
class _PartitionState:
    epoch: int
    batches: list[StoredBatch] = field(default_factory=list)
    """The last :data:`TRACKED_BATCHES` batches, oldest first (a list: a deque's block costs
    ~600 B, and there is one of these per producer and partition)."""
    lenient: bool = False
    replaced: _PartitionState | None = None
    """While no batch of this epoch is stored here: the state it replaced (:data:`_UNKNOWN`
    when the producer was unknown on the partition), for ``forget`` to put back."""


_UNKNOWN = _PartitionState(-1)
"""``replaced`` of a partition's first state: undoing it forgets the partition."""


@dataclass(slots=True)
class _ProducerState:
    last_seen: float = 0.0
    partitions: dict[tuple[str, int], _PartitionState] = field(default_factory=dict)
    rendered: str | None = None
    """This producer's part of the snapshot text, kept while nothing changes (None: render)."""

    @property
    def epoch(self) -> int:
        """The newest epoch of the producer on any partition (-1: none)."""
        return max((state.epoch for state in self.partitions.values()), default=-1)


class SequenceTracker:
    """Sequence bookkeeping for every idempotent producer seen (pure, no I/O)."""

    def __init__(self, max_partitions: int = MAX_TRACKED_PARTITIONS) -> None:
        self._producers: dict[int, _ProducerState] = {}
        self._max_partitions = max_partitions
        self._partitions = 0
        """(producer, partition) entries held."""
        self.forgotten = 0
        """Producers forgotten to stay within ``max_partitions`` (not idle ones)."""

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, topic: str, partition: int, header: BatchHeader) -> SequenceCheck:
        """Decide what to do with a batch, without changing any state."""
        if not header.is_idempotent:
            return SequenceCheck(SequenceVerdict.ACCEPT)
        producer = self._producers.get(header.producer_id)
        state = None if producer is None else producer.partitions.get((topic, partition))
        if state is None:
            return SequenceCheck(SequenceVerdict.ACCEPT)
        if header.producer_epoch < state.epoch:
            return SequenceCheck(
                SequenceVerdict.INVALID_EPOCH,
                reason=f"producer {header.producer_id} epoch {header.producer_epoch} is older"
                f" than the current epoch {state.epoch} on {topic}-{partition}",
            )
        if header.producer_epoch > state.epoch:
            if header.base_sequence == 0:
                return SequenceCheck(SequenceVerdict.ACCEPT)
            return SequenceCheck(
                SequenceVerdict.OUT_OF_ORDER,
                reason=f"producer {header.producer_id} new epoch {header.producer_epoch} must"
                f" start at sequence 0, got {header.base_sequence}",
            )
        if not state.batches:
            return SequenceCheck(SequenceVerdict.ACCEPT)
        base_sequence, last_sequence = header.base_sequence, header.last_sequence
        for stored in state.batches:
            if stored.base_sequence == base_sequence and stored.last_sequence == last_sequence:
                return SequenceCheck(SequenceVerdict.DUPLICATE, duplicate_of=stored)
        expected = (state.batches[-1].last_sequence + 1) % _SEQUENCE_MODULUS
        if header.base_sequence == expected or state.lenient:
            return SequenceCheck(SequenceVerdict.ACCEPT)
        return SequenceCheck(
            SequenceVerdict.OUT_OF_ORDER,
            reason=f"producer {header.producer_id} epoch {header.producer_epoch} on"
            f" {topic}-{partition}: expected sequence {expected}, got {header.base_sequence}",
        )

    def record(
        self, topic: str, partition: int, header: BatchHeader, wal_offset: int | None = None
    ) -> StoredBatch | None:
        """Remember an accepted batch (``wal_offset`` None: its append is still running)."""
        if not header.is_idempotent:
            return None
        producer = self._producers.get(header.producer_id)
        if producer is None:
            producer = self._producers[header.producer_id] = _ProducerState()
        producer.last_seen = time.time()
        producer.rendered = None
        key = (topic, partition)
        state = producer.partitions.get(key)
        if state is None:
            state = producer.partitions[key] = _PartitionState(header.producer_epoch)
            state.replaced = _UNKNOWN
            self._partitions += 1
            if self._partitions > self._max_partitions:
                self._forget_least_recent(keep=header.producer_id)
        elif header.producer_epoch > state.epoch:
            previous = state
            if previous.replaced is not None and not previous.batches:
                previous = previous.replaced  # that epoch holds no batch here, stored or not
            state = producer.partitions[key] = _PartitionState(header.producer_epoch)
            state.replaced = previous
        elif state.replaced is not None and any(b.wal_offset is not None for b in state.batches):
            state.replaced = None
        if wal_offset is not None:
            state.replaced = None
        stored = StoredBatch(header.base_sequence, header.last_sequence, wal_offset)
        batches = state.batches
        batches.append(stored)
        if len(batches) > TRACKED_BATCHES:
            del batches[0]
        state.lenient = False
        return stored

    def _forget_least_recent(self, keep: int) -> None:
        """Forget the least recently seen producers until a tenth of the bound is free."""
        target = self._max_partitions - max(1, self._max_partitions // 10)
        by_age = sorted(self._producers.items(), key=lambda item: item[1].last_seen)
        for producer_id, producer in by_age:
            if self._partitions <= target:
                break
            if producer_id == keep:
                continue
            del self._producers[producer_id]
            self._partitions -= len(producer.partitions)
            self.forgotten += 1

    def forget(self, topic: str, partition: int, producer_id: int, stored: StoredBatch) -> None:
        """Undo :meth:`record` for a batch whose WAL append failed: the partition is put back
        as it was before, when the batch was the first of a new epoch there (or the producer's
        first there) and no other batch of that epoch is stored or being appended there."""
        producer = self._producers.get(producer_id)
        key = (topic, partition)
        state = None if producer is None else producer.partitions.get(key)
        if producer is None or state is None:
            return
        if stored in state.batches:
            state.batches.remove(stored)
            producer.rendered = None
        if state.batches or state.replaced is None:
            return
        producer.rendered = None
        if state.replaced is _UNKNOWN:
            del producer.partitions[key]
            self._partitions -= 1
            if not producer.partitions:
                del self._producers[producer_id]
        else:
            producer.partitions[key] = state.replaced

    def replay(self, topic: str, partition: int, header: BatchHeader, wal_offset: int) -> None:
        """Apply a batch found in the WAL on start; batches already known are skipped."""
        if not header.is_idempotent:
            return
        producer = self._producers.get(header.producer_id)
        state = None if producer is None else producer.partitions.get((topic, partition))
        if state is not None:
            if header.producer_epoch < state.epoch:
                return
            if header.producer_epoch == state.epoch and any(
                stored.base_sequence == header.base_sequence for stored in state.batches
            ):
                return
        self.record(topic, partition, header, wal_offset)

    def mark_lenient(self) -> None:
        """History may be incomplete: accept the next non-duplicate batch of every partition."""
        for producer in self._producers.values():
            for state in producer.partitions.values():
                state.lenient = True

    def expire(self, idle_s: float, now: float | None = None) -> int:
        """Forget producers not seen for ``idle_s`` seconds (Kafka: producer.id.expiration.ms).

        Returns how many were forgotten.
        """
        cutoff = (time.time() if now is None else now) - idle_s
        idle = [pid for pid, producer in self._producers.items() if producer.last_seen < cutoff]
        for producer_id in idle:
            self._partitions -= len(self._producers.pop(producer_id).partitions)
        return len(idle)

    def max_producer_id(self) -> int:
        return max(self._producers, default=-1)

    def to_json(self) -> dict[str, object]:
        """The snapshot document (``json.loads`` of :meth:`to_json_text`)."""
        document: dict[str, object] = json.loads(self.to_json_text())
        return document

    def to_json_text(self) -> str:
        """``{"producers": {...}}`` as JSON text: confirmed batches only (a batch whose append
        is still running is not yet stored). Only producers changed since the last call are
        rendered again; the others' text is reused."""
        parts = []
        for producer_id, producer in self._producers.items():
            text = producer.rendered
            if text is None:
                text, confirmed = _render(producer_id, producer)
                if confirmed:
                    producer.rendered = text
            parts.append(text)
        return '{"producers":{' + ",".join(parts) + "}}"

    @classmethod
    def from_json(cls, document: dict[str, object]) -> SequenceTracker:
        tracker = cls()
        producers = document["producers"]
        assert isinstance(producers, dict)
        for producer_id, entry in producers.items():
            producer = _ProducerState(float(entry.get("last_seen", 0.0)))
            for topic, partition, batches, *epoch in entry["partitions"]:
                # snapshots before per-partition epochs had only the producer's
                state = _PartitionState(int(epoch[0]) if epoch else int(entry["epoch"]))
                for base_sequence, last_sequence, wal_offset in batches[-TRACKED_BATCHES:]:
                    state.batches.append(StoredBatch(base_sequence, last_sequence, wal_offset))
                producer.partitions[(str(topic), int(partition))] = state
            tracker._producers[int(producer_id)] = producer
            tracker._partitions += len(producer.partitions)
        return tracker

    def producers(self) -> Iterator[tuple[int, int]]:
        """``(producer_id, epoch)`` pairs, for tests and diagnostics."""
        for producer_id, producer in self._producers.items():
            yield producer_id, producer.epoch


def _render(producer_id: int, producer: _ProducerState) -> tuple[str, bool]:
    """``"ID": {...}`` of one producer, and whether every batch in it is confirmed."""
    confirmed = True
    partitions = []
    for (topic, partition), state in producer.partitions.items():
        batches = []
        for stored in state.batches:
            if stored.wal_offset is None:
                confirmed = False
            else:
                batches.append([stored.base_sequence, stored.last_sequence, stored.wal_offset])
        if batches:
            partitions.append([topic, partition, batches, state.epoch])
    entry = {"epoch": producer.epoch, "last_seen": producer.last_seen, "partitions": partitions}
    return f'"{producer_id}":' + json.dumps(entry, separators=(",", ":")), confirmed
