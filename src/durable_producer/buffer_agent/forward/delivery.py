"""Producing one WAL frame's records and settling the frame from its delivery reports.

Hot path (issue 4's target: at least 0.9x the rate of a plain Python produce loop; see
``benchmarks/forward_bench.py`` and docs/benchmarks.md): a frame is decoded straight into
the positional arguments of ``produce`` (``decode_produce_calls``: no per-record objects
beyond those, uncompressed batches parsed in place) and produced by ``starmap`` drained in
C. A frame settles in the ``AckTracker`` once Kafka has every record of it.

Two modes (``ForwarderStats`` counts the records each one forwarded):

- **sparse** (the normal mode): only the *last* record of each frame asks for a delivery
  report; confluent-kafka builds a ``Message`` (copying key and value) for every report that
  has a callback, which was the forwarder's largest remaining cost. The producer runs with
  ``enable.gapless.guarantee=true``. The guarantee this relies on (librdkafka
  INTRODUCTION.md, "Idempotent Producer"; ``rd_kafka_handle_Produce_error``): an
  idempotent producer writes the records of a partition in produce order, and with the
  gap-less guarantee a batch that fails for good raises a fatal error
  (``_GAPLESS_GUARANTEE``) instead of letting later records of that partition through
  (the broker would refuse them with OUT_OF_ORDER_SEQUENCE_NUMBER anyway; without gap-less
  librdkafka bumps the epoch and carries on: a silent gap). The guarantee does not cover
  ``message.timeout.ms`` expiry, which is off here (0: never). Failures that are not batch
  failures (a topic that turns out not to exist, or loses authorization) fail *every*
  queued record of the topic, so they reach the last record too. Hence: **a success report
  for a record means every record produced before it to the same partition by the same
  producer was written**. A frame is one partition, so its last record's success settles
  the whole frame; a frame whose last record raised in ``produce()`` (an *orphan*) is
  settled by the next success on its partition. A fatal error stops trusting the
  producer's reports at once (its error callback is served before any later report), so a
  success that a lax broker gave to a batch after the failed one is not believed.
- **careful**: every record asks for its report (as before the sparse mode existed) and the
  producer has no gap-less guarantee, so one bad record is dead-lettered while the rest go
  through. Entered by a producer reset, i.e. on a fatal error, any failed report of a
  sparse frame, or a sparse frame that cannot be settled; it re-forwards from the
  contiguous acknowledged watermark and lasts until every frame that was in flight at the
  reset has been forwarded again and delivered, then the forwarder returns to sparse mode.
  After a batch failed for good (a gap-less fatal error, or a permanent error in careful
  mode, which may have hit innocent records batched with the bad one) the careful producer
  sends one record per request (``batch.num.messages=1``, a few thousand records a second)
  so the broker judges each record on its own.

Reports carry the *generation* of the producer that sent their frame: after a reset (or any
producer change) the ledger's generation moves on and older reports are ignored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import count, starmap
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.replay_accounting import ReplayAccount
from durable_producer.buffer_agent.kafka.record_batch import InvalidRecordBatch
from durable_producer.buffer_agent.kafka.record_decode import (
    Record,
    decode_produce_calls,
    iter_decoded,
)
from durable_producer.buffer_agent.wal import Frame


class DeliveryMode:
    """Sparse or careful (module docstring), and the pending request to reset the producer."""

    __slots__ = ("_isolate_next", "careful", "careful_until", "isolate", "reset_reason")

    def __init__(self) -> None:
        self.careful = False
        self.isolate = False
        """Careful, one record per request."""
        self.careful_until = 0
        """Careful until every frame below this WAL offset is delivered again."""
        self.reset_reason: str | None = None
        """Why the producer must be reset; None: it need not."""
        self._isolate_next = False

    @property
    def isolating(self) -> bool:
        """Each report is about one record alone."""
        return self.careful and self.isolate

    def request_reset(self, reason: str, *, isolate: bool = False) -> None:
        """Ask for a producer reset (the first reason is kept); ``isolate``: the careful
        producer after it sends one record per request."""
        self._isolate_next = self._isolate_next or isolate
        if self.reset_reason is None:
            self.reset_reason = reason

    def enter_careful(self, in_flight_until: int) -> str | None:
        """Take the reset request: careful until the frames below ``in_flight_until`` are
        delivered again (isolating stays on while careful). Returns the request's reason."""
        reason, self.reset_reason = self.reset_reason, None
        self.isolate = self.isolating or self._isolate_next
        self._isolate_next = False
        self.careful = True
        self.careful_until = max(self.careful_until, in_flight_until)
        return reason

    def leave_careful(self) -> None:
        self.careful = False
        self.isolate = False


class FailureHandling(Protocol):
    """Where the ledger hands a frame or record that did not go through (``failures``)."""

    dead_lettered: dict[int, set[int]]
    """Record indexes dead-lettered by this run, by WAL offset: not produced again."""

    def record_failed(
        self, delivery: FrameDelivery, index: int, error: KafkaError, *, synchronous: bool = False
    ) -> None: ...

    def group_failed(self, delivery: FrameDelivery, error: KafkaError) -> None: ...

    def refused_after_reset(self, error: KafkaError) -> None: ...

    def dead_letter_frame(
        self, frame: Frame, reason: str, generation: int, settle: Callable[[], None]
    ) -> None: ...


class FrameDelivery:
    """Delivery reports of one frame's records; the frame settles when ``remaining`` is 0.

    Careful mode: ``remaining`` counts records and every record reports
    (``on_record_report``).
    Sparse mode: ``remaining`` starts at 1 for the group of records produced without a
    callback plus the last one, which reports for all of them (``on_group_report``); a
    record refused by ``produce()`` adds one while it is handled on its own. The success
    path is one decrement: delivery reports are the forwarder's hot loop. The decoded
    records are not kept: thousands of in-flight record tuples would make every garbage
    collection pass scan them (it tripled decoding cost here); on the rare failure the
    frame's payload is decoded again.
    """

    __slots__ = (
        "count",
        "dead",
        "decoded",
        "generation",
        "ledger",
        "offset",
        "partition",
        "payload",
        "remaining",
        "reporter",
        "sparse",
        "topic",
        "unreported",
    )

    def __init__(
        self, ledger: DeliveryLedger, generation: int, frame: Frame, sparse: bool = False
    ) -> None:
        self.ledger = ledger
        self.generation = generation
        self.offset = frame.offset
        self.topic = frame.topic
        self.partition = frame.partition
        self.payload = frame.payload
        self.sparse = sparse
        self.count = 0  # set once the frame is decoded
        self.remaining = 0
        self.unreported = 0  # sparse: records produced without a callback of their own
        self.reporter = -1  # sparse: index of the record whose report speaks for the frame
        self.decoded: list[Record] | None = None
        self.dead = 0

    def on_record_report(self, index: int, error: KafkaError | None, message: Any) -> None:
        """Careful mode: the report of record ``index`` (bound with ``partial``: a failed
        report carries no timestamp, so its content alone cannot tell identical records
        apart)."""
        if error is None:
            self.remaining -= 1
            if not self.remaining:
                self.ledger.frame_settled(self)
        else:
            self.ledger.record_failed(self, index, error)

    def on_group_report(self, error: KafkaError | None, message: Any) -> None:
        """Sparse mode: the report of the frame's last record, which speaks for the frame."""
        if error is None:
            self.ledger.group_delivered(self)
        else:
            self.ledger.group_failed(self, error)

    def on_retry_report(self, index: int, error: KafkaError | None, message: Any) -> None:
        """The report of record ``index`` produced again after its topic was unknown."""
        self.ledger.retry_reported(self, index, error)

    def settle_one(self) -> None:
        """A record is done without a success report (dead-lettered, or re-sent and acked)."""
        self.remaining -= 1
        if not self.remaining:
            self.ledger.frame_settled(self)

    @property
    def records(self) -> list[Record]:
        """Decoded again on first use (only failures need it), then kept for this frame."""
        if self.decoded is None:
            self.decoded = [
                record for batch in iter_decoded(self.payload) for record in batch.records
            ]
        return self.decoded


class DeliveryLedger:
    """The frames in flight with the current producer: produces them, settles them in the
    tracker from their reports, counts what was forwarded. Single-threaded (the forwarding
    thread); the counters may be read from any thread."""

    def __init__(
        self,
        tracker: AckTracker,
        failures: FailureHandling,
        replay: ReplayAccount | None = None,
    ) -> None:
        """``replay`` counts the duplicates of frames sent again (``replay_accounting``)."""
        self.tracker = tracker
        self.failures = failures
        self.replay = replay or ReplayAccount(checkpoint=tracker.watermark)
        self.generation = 0
        # Sparse frames whose last record was refused by produce(): settled by the next
        # success on their partition.
        self.orphans: dict[tuple[str, int], list[FrameDelivery]] = {}
        self.forwarded_records = 0
        self.forwarded_bytes = 0
        self.sparse_records = 0
        self.careful_records = 0

    def disown_reports(self) -> None:
        """Reports still to come for the frames produced so far are ignored (their producer
        failed or is being discarded)."""
        self.generation += 1

    def start_over(self, watermark: int) -> None:
        """After a reset: everything from ``watermark`` on is forwarded again."""
        self.orphans.clear()
        self.tracker = AckTracker(watermark)

    # ----------------------------------------------------------------- reports
    def frame_settled(self, delivery: FrameDelivery) -> None:
        if delivery.generation != self.generation:
            return  # reports from a producer that was reset; the frame is being replayed
        self.tracker.ack(delivery.offset, delivery.count)
        forwarded = delivery.count - delivery.dead
        if delivery.offset < self.replay.until:
            self.replay.settled_again(
                delivery.offset, delivery.topic, delivery.partition, forwarded
            )
        self.forwarded_records += forwarded
        if delivery.sparse:
            self.sparse_records += forwarded
        else:
            self.careful_records += forwarded
        self.forwarded_bytes += len(delivery.payload)

    def group_delivered(self, delivery: FrameDelivery) -> None:
        """Sparse mode: the frame's last record was written, hence every record before it on
        its partition (module docstring), including frames whose last record was refused."""
        if delivery.generation != self.generation:
            return
        if self.orphans:
            orphans = self.orphans.get((delivery.topic, delivery.partition))
            if orphans:
                vouched = [orphan for orphan in orphans if orphan.offset < delivery.offset]
                if vouched:
                    orphans[:] = [o for o in orphans if o.offset > delivery.offset]
                    if not orphans:
                        del self.orphans[(delivery.topic, delivery.partition)]
                    for orphan in vouched:
                        orphan.settle_one()
        delivery.settle_one()

    def group_failed(self, delivery: FrameDelivery, error: KafkaError) -> None:
        if delivery.generation == self.generation:
            self.failures.group_failed(delivery, error)
        else:
            self.failures.refused_after_reset(error)

    def record_failed(
        self, delivery: FrameDelivery, index: int, error: KafkaError, *, synchronous: bool = False
    ) -> None:
        """One record failed: raised by ``produce()`` (``synchronous``) or reported failed."""
        if delivery.generation == self.generation:
            self.failures.record_failed(delivery, index, error, synchronous=synchronous)
        else:
            self.failures.refused_after_reset(error)

    def retry_reported(self, delivery: FrameDelivery, index: int, error: KafkaError | None) -> None:
        if delivery.generation != self.generation:
            if error is not None:
                self.failures.refused_after_reset(error)
            return
        if error is None:
            delivery.settle_one()
        else:
            self.failures.record_failed(delivery, index, error)

    # ----------------------------------------------------------------- producing
    def produce_frame(
        self,
        frame: Frame,
        producer: Producer,
        *,
        sparse: bool,
        wait_for_room: Callable[[], bool],
    ) -> int:
        """Hand every record of ``frame`` to ``producer``; returns how many were handed over
        (0 if none, or if the frame was given up). When the client's queue is full,
        ``wait_for_room`` serves reports; if it returns False the frame is given up: it
        stays above the watermark and is replayed. Records of frames sent before (below
        ``replay.until``) are counted as certain or possible duplicates."""
        delivery = FrameDelivery(self, self.generation, frame, sparse)
        try:
            # None: no callback (record_decode's signature does not say it may be None yet).
            calls = decode_produce_calls(
                frame.payload,
                frame.topic,
                frame.partition,
                None,  # type: ignore[arg-type]
            )
        except InvalidRecordBatch as error:
            tracker = self.tracker  # settled once the dead letter is written
            tracker.register(frame.offset, 1)
            settle = partial(tracker.ack, frame.offset)
            self.failures.dead_letter_frame(frame, str(error), self.generation, settle)
            return 0
        total = delivery.count = len(calls)
        # Record index of each call; None: the identity (nothing skipped).
        indexes: list[int] | None = None
        dead_lettered = self.failures.dead_lettered
        skipped = dead_lettered.get(frame.offset) if dead_lettered else None
        if skipped:  # re-forwarded after a reset: do not send nor dead-letter these again
            indexes = [index for index in range(total) if index not in skipped]
            calls = [calls[index] for index in indexes]
            delivery.dead = total - len(calls)
        produced = len(calls)
        if not produced:
            self.tracker.register(frame.offset, 0)
            return 0
        if frame.offset < self.replay.until:
            self.replay.sent_again(frame.offset, frame.topic, frame.partition, produced)
        self.tracker.register(
            frame.offset, total, frame.appended_ms, (frame.topic, frame.partition)
        )
        if sparse:
            # One report for the frame: the last record's (see the module docstring).
            last = calls[-1]
            calls[-1] = (*last[:4], delivery.on_group_report, *last[5:])
            delivery.reporter = produced - 1 if indexes is None else indexes[-1]
            delivery.remaining = 1 + delivery.dead
        else:
            report = delivery.on_record_report
            calls = [
                (*call[:4], partial(report, index), *call[5:])
                for call, index in zip(calls, indexes or range(total), strict=True)
            ]
            delivery.remaining = total
        for _ in range(delivery.dead):
            delivery.settle_one()
        refused = 0
        last_refused = False
        position = 0
        while position < produced:
            # The produce loop runs in C (starmap drained by a zero-length deque); the counter
            # zipped in front tells which call raised: it has already moved one past it.
            counter = count(position)
            pending = calls[position:] if position else calls
            try:
                deque(zip(counter, starmap(producer.produce, pending), strict=False), maxlen=0)
                position = produced
            except BufferError:  # the client's queue is full: wait for reports
                position = next(counter) - 1
                if not wait_for_room():
                    return 0  # the frame stays above the watermark and is replayed
            except KafkaException as exception:
                position = next(counter) - 1
                index = position if indexes is None else indexes[position]
                if sparse:
                    refused += 1
                    last_refused = position == produced - 1
                    delivery.remaining += 1  # this record settles on its own
                self.record_failed(delivery, index, exception.args[0], synchronous=True)
                position += 1
        if sparse:
            delivery.unreported = produced - 1 - (refused - 1 if last_refused else refused)
            if last_refused:
                if delivery.unreported:
                    key = (delivery.topic, delivery.partition)
                    self.orphans.setdefault(key, []).append(delivery)
                else:
                    delivery.settle_one()  # every record was refused and handled alone
        return produced
