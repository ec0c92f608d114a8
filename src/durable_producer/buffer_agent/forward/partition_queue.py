"""One partition's stored batches on their way to Kafka: the idempotent producer's rules.

Read Kafka's ``ProducerStateManager``/``ProducerAppendInfo`` (the broker: a batch must start at
the last sequence + 1 of its producer and epoch; one that repeats one of the last five batches
exactly is answered as a duplicate, with the original's offset; a new epoch starts at 0; an
unknown producer may start anywhere), the Java client's ``Sender``/``TransactionManager`` and
librdkafka's idempotence code for where this comes from; this is our own, simpler version:

- Every stored batch (a WAL *frame*) gets its sequence numbers when it is read, in WAL order:
  a partition's records are numbered one after the other under the partition's producer id
  and epoch. So the numbering is a function of the WAL and of the partition's starting point,
  which ``identity`` keeps on the volume: after a crash the same frames get the same numbers.
- Frames go out in *batches*: one frame as it is, or consecutive uncompressed frames merged
  (``kafka/batch_stamp``) within the topic's ``max.message.bytes``. At most
  ``MAX_IN_FLIGHT`` batches are in flight; they are sent in order.
- A success acknowledges the batch and every earlier one (the broker only appends in
  sequence), unless the broker had said it did not append an earlier one: then it does not
  know the producer (a topic created again, a producer expired), only that batch is
  acknowledged and the others go again under a new epoch (``gap``). Any failure *halts* the
  partition: nothing new is sent until every batch in flight has its answer; then the
  unacknowledged batches are sent again, in order, with the same numbers and bounds (so the
  broker recognises a copy it holds), after a backoff; after a batch whose answer never came,
  only once a metadata refresh has shown the topic's id again (``refresh_first``).
- OUT_OF_ORDER_SEQUENCE_NUMBER for the first unacknowledged batch, UNKNOWN_PRODUCER_ID,
  INVALID_PRODUCER_EPOCH: the broker's view differs from ours. The partition is *resolved*:
  its leader says (DescribeProducers) the last sequence it holds of our producer; frames up to
  it are acknowledged, the rest go again from there. When the leader no longer knows the
  producer, or cannot say, the partition moves to a new epoch (KIP-360: sequences start at 0)
  and the frames whose earlier copy's fate is unknown count as possible duplicates.
- A frame refused for good (``failure_policy``) is dead-lettered whole (``Forwarder``) and the
  frames after it are numbered again from its first sequence (the broker never took it;
  ``drop_heads``).

No I/O here: the ``Forwarder`` sends, persists and settles.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Final

from durable_producer.buffer_agent.kafka import batch_stamp
from durable_producer.buffer_agent.kafka.record_batch import HEADER_SIZE, sole_batch
from durable_producer.buffer_agent.wal import Frame

MAX_IN_FLIGHT = 5
"""Batches in flight per partition: the broker keeps the last five of each producer to
recognise copies (``ProducerStateEntry.NUM_BATCHES_TO_RETAIN``)."""
SEQUENCE_LIMIT = 2**31
MAX_EPOCH = 32767


PartitionKey = tuple[str, int]
"""(topic, partition): a queue's key."""

Pending = tuple[int, bytes | memoryview, int, int, int, int, bool, int]
"""One stored batch (WAL frame) of the partition, numbered, not yet acknowledged:
(offset, batch, records, sequence, attributes, index, unknown, appended_ms), read with the
names below.

A plain tuple, not an object: the forwarder holds up to its read-ahead of them (100,000
one-record frames), and Python's garbage collector stops tracking a tuple of ints and bytes
after its first collection, where it scans every object with slots in each full collection
(1.2-1.7 us a frame, measured). Changed by making a new one (``_with``)."""
OFFSET: Final = 0
BATCH: Final = 1
RECORDS: Final = 2
SEQUENCE: Final = 3
ATTRIBUTES: Final = 4
INDEX: Final = 5
UNKNOWN: Final = 6
APPENDED: Final = 7
"""``Pending`` fields: the frame's WAL offset; the stored batch (the frame's payload, or a
view of one batch of an older agent's frame of several); its records; its first sequence
number; the batch header's attributes (codec, timestamp type, transactional, control); its
position in the frame; sent, and no answer said whether Kafka took it (in flight at a crash,
a lost connection, a timeout: a copy may be in Kafka); when the frame was appended to the
WAL (ms since the epoch)."""


def _with(frame: Pending, sequence: int, unknown: bool) -> Pending:
    offset, batch, records = frame[OFFSET], frame[BATCH], frame[RECORDS]
    attributes, index, appended_ms = frame[ATTRIBUTES], frame[INDEX], frame[APPENDED]
    return (offset, batch, records, sequence, attributes, index, unknown, appended_ms)


Settled = tuple[list[Pending], int, int]
"""Frames that left a queue, in order, from its head (Kafka holds them, or one was
dead-lettered) or, past a gap, one batch from further on (``PartitionQueue.gap``), with the
records and stored bytes they hold (``ack_tracker`` counts them out)."""


def settled_frames(frames: list[Pending]) -> Settled:
    """``frames`` with their records and stored bytes (a batch knows its own: ``Batch``)."""
    return frames, sum(frame[RECORDS] for frame in frames), sum(len(f[BATCH]) for f in frames)


Run = tuple[list[Pending], list[bytes | memoryview], int, int]
"""Frames planned for one batch: (the frames, their batches, the records and stored bytes
they hold): what ``take_run`` returns."""

MERGE_SPARE: Final = HEADER_SIZE - 8
"""``take_run`` plans a batch merged after the first at its length less this: its records
without its header, and framing that may grow (8 bytes). It may grow more: the merge takes
only the batches that fit (``_new_batch``)."""


class Batch:
    """Frames sent together in one record batch."""

    __slots__ = (
        "frames",
        "not_appended",
        "parts",
        "records",
        "sent",
        "size",
        "stored",
    )

    def __init__(
        self, settled: Settled, body: bytes | memoryview, producer_id: int, epoch: int
    ) -> None:
        self.frames, self.records, self.stored = settled
        self.sent = False
        self.not_appended = False
        """The broker's last answer to it said it did not append it."""
        self.size = len(body)
        self.parts = batch_stamp.stamp(body, producer_id, epoch, self.frames[0][SEQUENCE])


class PartitionQueue:
    """Frames of one partition from reading to acknowledgement (module docstring)."""

    def __init__(self, key: PartitionKey, producer_id: int, epoch: int, sequence: int):
        self.key = key
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_sequence = sequence
        self.frames: deque[Pending] = deque()
        """Numbered frames not in a batch yet, in order (after every batch's frames)."""
        self.batches: deque[Batch] = deque()
        """Unacknowledged batches in order; those sent come first."""
        self.in_flight = 0
        self.halted = False
        """A batch failed: send nothing until every batch in flight is answered."""
        self.resolve = False
        """Ask the leader what it holds of the producer before sending again."""
        self.resolve_code = 0
        """The answer that asked for it (0: the check of frames a previous run sent)."""
        self.ready_at = 0.0
        self.failing_since: float | None = None
        """When the current spell of refusals began (None: the last answer was a success)."""
        self.last_error = 0
        """The first unacknowledged batch's last refusal (0: none since a success)."""
        self.failures = 0
        self.lettered: tuple[int, float] | None = None
        """(code, when) of the last frame dead-lettered after Kafka refused it."""
        self.isolate = False
        """Send one frame per batch (a merged batch was refused for good)."""
        self.rebatch = False
        """Batch the unacknowledged frames again (a merged batch was too large)."""
        self.confirmed = False
        """The leader took a batch of this identity in this run. Until then one batch at a
        time: a broker takes *any* sequence from a producer it does not know, so a second
        batch could land although the first was refused, and overtake it."""
        self.gap = False
        """The leader does not know this producer (the topic was created again, or the
        producer expired), seen as a batch taken although an earlier one was refused, or as a
        new topic id. The unacknowledged batches go again under a new epoch (``renumber``);
        nothing is sent before. Kept on the volume (a restart takes the new epoch too)."""
        self.gap_why = ""
        """Why ``gap`` was set, where not for the leader's forgetting ("": it was); kept on
        the volume with it."""
        self.copied_before: set[tuple[int, int]] = set()
        """(offset, index) of frames numbered anew while a copy of them may be in Kafka (under
        an earlier identity: not ``UNKNOWN`` any more, counted as possible duplicates), for
        their letters' reason; forgotten once they left the queue (at the next renumbering or
        letter). Not kept on the volume: they were sent, so they lie below ``sent_below``, and
        the next run reads them again as ``UNKNOWN`` (replayed)."""
        self.refresh_first = False
        """A batch's answer never came: nothing is sent until a metadata refresh begun since
        has ended (the topic may have been created again, and its new leader would take the
        batch's copy as new: ``gap`` then counts it). Cleared also once nothing sent is left
        unacknowledged."""
        self.losses = 0
        """Answers that never came, counted: a refresh clears ``refresh_first`` only if none
        came while it ran."""
        self.topic_id = ""
        """The id of the topic this numbering was taken for ("" unknown): the cluster's
        Metadata gives it; another id is the topic deleted and created again."""

    # ----------------------------------------------------------------- numbering
    def add(
        self,
        offset: int,
        batch: bytes | memoryview,
        records: int,
        attributes: int,
        appended_ms: int,
        unknown: bool,
        index: int = 0,
    ) -> None:
        """Number the stored batch at ``offset`` (``Pending`` says what the rest are)."""
        sequence = self.next_sequence
        self.next_sequence = (sequence + records) % SEQUENCE_LIMIT
        self.frames.append(
            (offset, batch, records, sequence, attributes, index, unknown, appended_ms)
        )

    def first_unacknowledged(self) -> Pending | None:
        if self.batches:
            return self.batches[0].frames[0]
        return self.frames[0] if self.frames else None

    def anchor(self, next_offset: int) -> tuple[int, int]:
        """(offset, sequence): this partition's first frame at or after ``offset`` is
        numbered ``sequence``, and its frames below ``offset`` are in Kafka."""
        first = self.first_unacknowledged()
        if first is None:
            return next_offset, self.next_sequence
        return first[OFFSET], first[SEQUENCE]

    @property
    def idle(self) -> bool:
        return not self.batches and not self.frames

    # ----------------------------------------------------------------- sending
    def next_batch(self, now: float, max_bytes: int) -> Batch | None:
        """The next batch to send (marked sent), or None: nothing to send now."""
        if (
            self.halted
            or self.resolve
            or self.gap
            or self.refresh_first
            or now < self.ready_at
            or self.in_flight >= (MAX_IN_FLIGHT if self.confirmed else 1)
            or self.producer_id < 0  # no producer id yet (Kafka unreachable since the start)
        ):
            return None
        if self.rebatch or (self.isolate and any(len(b.frames) > 1 for b in self.batches)):
            if self.in_flight:
                return None
            self.unbatch()  # a merged batch was refused: batched again (smaller, or one by one)
            self.rebatch = False
        if self.in_flight < len(self.batches):  # sent again after a failure, in order
            batch = self.batches[self.in_flight]
        elif self.frames:
            batch = self._new_batch(max_bytes)
            self.batches.append(batch)
        else:
            return None
        batch.sent = True
        self.in_flight += 1
        return batch

    def _new_batch(self, max_bytes: int) -> Batch:
        """The next frames as one batch of at most ``max_bytes`` (or the first frame alone).
        ``take_run`` plans a merge by its parts' lengths, but the merge rewrites every
        record's offset and timestamp deltas, which grow as a record lies further from the
        batch's start (2-4 bytes a record for small records from a backlog): the merge takes
        the frames that fit, and the rest go back to the head of the queue. A merged batch
        above the limit would be refused by Kafka, and merged the same way for ever."""
        frames, batches, records, stored = self._take_run(max_bytes)
        body = batches[0]  # alone: the client's batch as it is
        if len(frames) > 1:
            try:
                merged, taken = batch_stamp.merge(batches, max_bytes)
            except BaseException:  # the frames stay queued, in order, whatever it raised
                self.frames.extendleft(reversed(frames))
                raise
            if taken < len(frames):
                self.frames.extendleft(reversed(frames[taken:]))
                del frames[taken:]
                _, records, stored = settled_frames(frames)
            if taken > 1:
                body = merged
        return Batch((frames, records, stored), body, self.producer_id, self.epoch)

    def _take_run(self, max_bytes: int) -> Run:
        """The frames of the next batch: the first, and those merged with it (``take_run``)."""
        frames = self.frames
        if self.isolate or not batch_stamp.mergeable(frames[0][ATTRIBUTES]):
            first = frames.popleft()
            return [first], [first[BATCH]], first[RECORDS], len(first[BATCH])
        return take_run(frames, max_bytes, MERGE_SPARE)

    # ----------------------------------------------------------------- answers
    def succeeded(self, batch: Batch) -> Settled:
        """The broker holds ``batch``: it and every earlier batch are acknowledged (a broker
        that knows the producer appends its batches in sequence), unless it had said it did
        not append an earlier one: then only ``batch`` is (``gap``)."""
        acked: list[Pending] = []
        records = stored = 0
        if batch not in self.batches:
            return acked, 0, 0  # answered after a resolution already settled it
        if self.batches[0] is not batch and self._past_a_refusal(batch):
            self.batches.remove(batch)
            self.in_flight -= 1
            self.gap = True
            if self.halted and not self.in_flight:
                self._rewind()
            return batch.frames, batch.records, batch.stored
        while self.batches:
            done = self.batches.popleft()
            if done.sent:
                self.in_flight -= 1
            acked.extend(done.frames)
            records += done.records
            stored += done.stored
            if done is batch:
                break
        if self.halted and not self.in_flight:
            self._rewind()
        if not self.batches:
            self.refreshed()  # no batch whose answer never came is left to send
        self.confirmed = True
        self.failing_since = None
        self.failures = 0
        self.last_error = 0
        return acked, records, stored

    def refreshed(self, losses: int | None = None) -> None:
        """A metadata refresh begun after ``losses`` lost answers has ended (None: nothing
        is left to send again): sending goes on, unless another answer was lost meanwhile."""
        if losses is None or losses == self.losses:
            self.refresh_first = False

    def _past_a_refusal(self, batch: Batch) -> bool:
        for earlier in self.batches:
            if earlier is batch:
                return False
            if earlier.not_appended:
                return True
        return False

    def failed(
        self,
        batch: Batch,
        code: int,
        now: float,
        *,
        unknown: bool = False,
        not_appended: bool = False,
        maybe_appended: bool = False,
    ) -> None:
        """``batch`` was not taken (``unknown``: no answer came, it may have been;
        ``not_appended``: the broker said it did not append it; ``maybe_appended``: it said
        it appended it but could not replicate it in time, so a copy may be in Kafka)."""
        if batch not in self.batches or not batch.sent:
            return
        batch.sent = False
        batch.not_appended = not_appended
        self.in_flight -= 1
        if unknown or maybe_appended:
            batch.frames = [_with(frame, frame[SEQUENCE], True) for frame in batch.frames]
        if unknown:
            self.refresh_first = True
            self.losses += 1
        self.halted = True
        if batch is self.batches[0]:  # behind it, OUT_OF_ORDER only says it was not taken
            self.last_error = code
        if self.failing_since is None:
            self.failing_since = now
        self.failures += 1
        if not self.in_flight:
            self._rewind()

    def head_of_line(self, batch: Batch) -> bool:
        """``batch`` is the first unacknowledged one: an out-of-order answer is not caused by
        an earlier batch of ours that failed."""
        return bool(self.batches) and self.batches[0] is batch

    def _rewind(self) -> None:
        """Every batch in flight is answered: send the unacknowledged ones again, in order."""
        self.halted = False
        for batch in self.batches:
            batch.sent = False

    def retry_after(self, now: float, backoff_s: float) -> None:
        self.ready_at = now + backoff_s

    def unbatch(self) -> None:
        """Take every unsent batch apart into frames again (they will be batched afresh)."""
        assert not self.in_flight
        frames = [frame for batch in self.batches for frame in batch.frames]
        self.batches.clear()
        self.frames.extendleft(reversed(frames))

    # ----------------------------------------------------------------- resolution
    def acknowledge_up_to(self, held: int) -> Settled:
        """The leader holds every sequence up to ``held`` of our producer and epoch:
        acknowledge the frames it covers. Only with nothing in flight."""
        self.unbatch()
        acked: list[Pending] = []
        frames = self.frames
        while frames and _not_after(frames[0], held):
            acked.append(frames.popleft())
        if acked:
            self.failing_since = None
        return settled_frames(acked)

    def renumber(self, producer_id: int, epoch: int) -> list[Pending]:
        """Number the unacknowledged frames again from 0 under a new identity (only with
        nothing in flight); returns the frames whose earlier copy may be in Kafka (possible
        duplicates)."""
        self.unbatch()
        self.producer_id, self.epoch = producer_id, epoch
        self.confirmed = False
        self.gap = False
        self.gap_why = ""
        unknown = [frame for frame in self.frames if frame[UNKNOWN]]
        self._forget_copies()
        self.copied_before.update((frame[OFFSET], frame[INDEX]) for frame in unknown)
        self._number_from(0)
        return unknown

    def may_be_in_kafka(self, frame: Pending) -> bool:
        """A copy of the frame may be in Kafka: its answer never came, under this identity
        or an earlier one."""
        return frame[UNKNOWN] or (frame[OFFSET], frame[INDEX]) in self.copied_before

    def _forget_copies(self) -> None:
        """Drop the marks of frames no longer in the queue (they are in WAL order)."""
        if self.copied_before:
            first = self.first_unacknowledged()
            below = float("inf") if first is None else first[OFFSET]
            self.copied_before = {key for key in self.copied_before if key[0] >= below}

    def drop_heads(self, count: int, code: int, now: float) -> list[Pending]:
        """Take the first ``count`` frames out (dead-lettered, refused with ``code``, or
        their topic gone): the frames after them take their numbers, in one pass (only with
        nothing in flight). Unless a copy of one may be in Kafka (``UNKNOWN``): the leader
        would take the next frame, sent under its sequence, for that copy
        (DUPLICATE_SEQUENCE_NUMBER) and never store it. Then the frames after them go under
        a new epoch (``gap``)."""
        self.unbatch()
        frames = self.frames
        dropped = [frames.popleft() for _ in range(min(count, len(frames)))]
        if any(frame[UNKNOWN] for frame in dropped):  # under this identity
            self.gap_why = self.gap_why if self.gap else (
                "a dead-lettered batch may be in Kafka: the frames after it must not take"
                " its sequence numbers"
            )
            self.gap = True
        elif dropped:
            self._number_from(dropped[0][SEQUENCE], keep_unknown=True)
        self.failing_since = None
        self.last_error = 0  # the next frame has not been refused
        self.lettered = (code, now)
        self.ready_at = now  # no backoff: the frames after it were not refused themselves
        self._forget_copies()
        return dropped

    def _number_from(self, sequence: int, *, keep_unknown: bool = False) -> None:
        """Number the unbatched frames again from ``sequence`` (their ``unknown`` cleared
        unless ``keep_unknown``: a new identity's broker holds no earlier copy)."""
        numbered: deque[Pending] = deque()
        for frame in self.frames:
            numbered.append(_with(frame, sequence, keep_unknown and frame[UNKNOWN]))
            sequence = (sequence + frame[RECORDS]) % SEQUENCE_LIMIT
        self.frames = numbered
        self.next_sequence = sequence


def number_all(
    frames: list[Frame],
    queues: dict[tuple[str, int], PartitionQueue],
    plain_from: int,
    take: Callable[[Frame], None],
) -> tuple[int, int]:
    """Number every frame: the main line's runs with ``number_frames``, each frame that
    stops a run with ``take`` (which may add its partition's queue to ``queues``). (records,
    bytes) of the frames numbered on the main line."""
    records = size = index = 0
    while index < len(frames):
        index, run_records, run_size = number_frames(frames, index, queues, plain_from)
        records += run_records
        size += run_size
        if index < len(frames):
            take(frames[index])
            index += 1
    return records, size


def number_frames(
    frames: list[Frame], start: int, queues: dict[tuple[str, int], PartitionQueue], plain_from: int
) -> tuple[int, int, int]:
    """Number ``frames`` from ``start`` into their partitions' queues while they are on the
    main line: at or above ``plain_from`` (no earlier run may have sent it), one client
    batch (``sole_batch``), of a partition that has its queue. (stop, records, bytes): the
    first frame that is not (``len(frames)`` if none), the records and payload bytes of those
    numbered. Compiled (``_number_frames.c``) where the package's build could: for a
    one-record frame this loop was a third of the forwarder's own work (docs/benchmarks.md)."""
    if _compiled_number_frames is None:
        return number_frames_python(frames, start, queues, plain_from)
    return _compiled_number_frames(frames, start, queues, plain_from, SEQUENCE_LIMIT)


def number_frames_python(
    frames: list[Frame], start: int, queues: dict[tuple[str, int], PartitionQueue], plain_from: int
) -> tuple[int, int, int]:
    """``number_frames`` in Python: the reference for the compiled one."""
    records = size = 0
    for index in range(start, len(frames)):
        offset, topic, partition, payload, _, appended_ms = frames[index]
        sole = sole_batch(payload)
        queue = queues.get((topic, partition))
        if queue is None or sole is None or offset < plain_from:
            return index, records, size
        queue.add(offset, payload, sole[0], sole[1], appended_ms, False)
        records += sole[0]
        size += len(payload)
    return len(frames), records, size


def take_run_python(frames: deque[Pending], max_bytes: int, spare: int) -> Run:
    """``take_run`` in Python: the reference for the compiled one."""
    first = frames.popleft()
    taken = [first]
    attributes = first[ATTRIBUTES]
    size = len(first[BATCH])
    while frames:
        candidate = frames[0]
        size += len(candidate[BATCH]) - spare
        if size > max_bytes or candidate[ATTRIBUTES] != attributes:
            break
        taken.append(frames.popleft())
    batches = [frame[BATCH] for frame in taken]
    return taken, batches, sum(frame[RECORDS] for frame in taken), sum(map(len, batches))


_compiled_number_frames: Callable[..., tuple[int, int, int]] | None
_compiled: ModuleType | None
try:  # built from _number_frames.c by the package's build (optional: needs a C compiler)
    from durable_producer.buffer_agent.forward import _number_frames as _compiled
except ImportError:
    _compiled = None
# Each entry on its own (an older build's ``number_frames`` took other arguments).
_compiled_number_frames = getattr(_compiled, "number_sole_batches", None)
take_run: Callable[[deque[Pending], int, int], Run] = getattr(
    _compiled, "take_run", take_run_python
)
"""The first of ``frames`` and those after it merged with it into one batch (their attributes
the first's, the merged size within ``max_bytes``: the first's length and each next one's less
``spare``), popped from ``frames``; compiled where the package's build could (taking a
one-record frame in Python was a tenth of the forwarder's own work a frame)."""


def _not_after(frame: Pending, held: int) -> bool:
    """The frame's sequences are at or before ``held`` (wrapping at 2**31 as Kafka's
    sequences do: a distance of less than half the space counts as "before")."""
    half, first = SEQUENCE_LIMIT // 2, frame[SEQUENCE]
    last = first + frame[RECORDS] - 1
    return (held - last) % SEQUENCE_LIMIT < half and (held - first) % SEQUENCE_LIMIT < half
