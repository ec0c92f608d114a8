"""The forwarder: WAL -> decoded records -> confluent-kafka producer -> Kafka.

One thread reads frames from the WAL checkpoint onwards, decodes each stored record batch
and produces every record to the partition the client chose, with its key, value, headers
and timestamp, through an idempotent ``acks=all`` producer whose records never expire
(``message.timeout.ms=0``: librdkafka retries for ever and keeps per-partition order).
Delivery reports are served on the same thread (``poll``) and feed an ``AckTracker``; its
contiguous watermark is written as the WAL checkpoint every ``checkpoint_interval_s``, on
stop, and as soon as the frames replayed after a start or reset are delivered; the WAL
deletes whole segments below it.

Hot path (issue 4's target: at least 0.9x the rate of a plain Python produce loop; see
``benchmarks/forward_bench.py`` and docs/benchmarks.md): a frame is decoded straight into
the positional arguments of ``produce`` (``decode_produce_calls``: no per-record objects
beyond those, uncompressed batches parsed in place) and produced by ``starmap`` drained in
C. Delivery reports are served every ``POLL_EVERY_RECORDS`` records and after every WAL read.

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
  the whole frame; a frame whose last record raised in ``produce()`` is settled by the next
  success on its partition. A fatal error stops trusting the producer's reports at once
  (its error callback is served before any later report), so a success that a lax broker
  gave to a batch after the failed one is not believed.
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

Failures:

- non-retriable record errors (too large, authorization, invalid record) and undecodable
  batches go to the dead-letter area with the reason; the forwarder moves on. Never a
  silent drop.
- a record whose topic or partition is unknown is produced again every
  ``retry_backoff_s`` (failed records of one partition are retried in the order they
  failed); still unknown after ``unknown_topic_wait_s``, it is dead-lettered.
- anything else the client reports for a record (a fatal idempotence error, an
  unexpected retriable one), and any failure in sparse mode, resets the producer: a new
  (careful) producer replays from the watermark, in WAL order, so per-partition order is
  kept; re-sent records are counted.

Duplicates are counted conservatively. The forwarder persists a *sent high-water mark*
(one past the last frame handed to the Kafka client) and, for information, the delivered
one in ``state/forwarder.json``, every ``hint_interval_s`` (rename, no fsync) and at every
checkpoint and stop (fsynced). On start, every record of a frame between the checkpoint
and the sent mark is counted as a replayed (possible) duplicate: Kafka may have it even
if the acknowledgement never arrived. A producer reset counts the same way. The count is
an upper bound on the duplicates in Kafka, except for records sent within the last
``hint_interval_s`` before a crash; duplicates themselves are bounded by one checkpoint
interval of traffic plus what was in flight.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from itertools import count, starmap
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.kafka.record_batch import InvalidRecordBatch
from durable_producer.buffer_agent.kafka.record_decode import (
    Record,
    decode_produce_calls,
    iter_decoded,
)
from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.wal import Frame, WalClosedError, WalReader, WriteAheadLog
from durable_producer.buffer_agent.wal.atomic_file import write_atomic

log = logging.getLogger(__name__)

HINT_FILE = "forwarder.json"

# Serve delivery reports after this many produced records (and after every WAL read).
# poll() releases and retakes the GIL: once per frame would mean thousands of hand-overs a
# second to busy ingress threads when clients send small batches.
POLL_EVERY_RECORDS = 1_000

# Errors no retry can fix: the record goes to the dead-letter area.
PERMANENT_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    }
)
# Errors that may clear once metadata catches up: retried for a bounded time.
UNKNOWN_TOPIC_ERRORS = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    }
)




@dataclass(frozen=True, slots=True)
class ForwarderStats:
    forwarded_records: int
    forwarded_bytes: int
    dead_letters: int
    replayed_duplicates: int
    producer_resets: int
    in_flight_records: int
    watermark: int
    checkpoint_offset: int
    sparse_records: int = 0
    """Records forwarded in sparse mode (one delivery report per frame)."""
    careful_records: int = 0
    """Records forwarded in careful mode (one delivery report per record)."""
    careful: bool = False
    """True while the forwarder is in careful mode."""


@dataclass(frozen=True, slots=True)
class DrainSummary:
    """What ``drain`` achieved: ``complete`` when everything up to ``target_offset`` is in Kafka."""

    complete: bool
    target_offset: int
    checkpoint_offset: int
    forwarded_records: int
    dead_letters: int
    replayed_duplicates: int
    elapsed_s: float


def producer_config(
    client_config: Mapping[str, Any],
    config: ForwarderConfig,
    *,
    careful: bool = False,
    isolate: bool = False,
) -> dict[str, Any]:
    """The validated connection settings plus the settings the no-loss promise relies on.

    Sparse mode (the default) needs ``enable.gapless.guarantee``; careful mode must not have
    it (one bad record would stop the producer instead of being dead-lettered), and
    ``isolate`` sends one record per request so the broker judges each record alone.
    """
    settings = {
        "linger.ms": config.linger_ms,
        "message.max.bytes": config.max_message_bytes,
        **client_config,
        "acks": "all",
        "enable.idempotence": True,
        "enable.gapless.guarantee": not careful,
        "message.timeout.ms": 0,
        "queue.buffering.max.messages": config.max_in_flight_records,
        "queue.buffering.max.kbytes": config.max_in_flight_kbytes,
    }
    if careful and isolate:
        settings["batch.num.messages"] = 1
    return settings


class _FrameDelivery:
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
        "forwarder",
        "generation",
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
        self,
        forwarder: Forwarder,
        generation: int,
        frame: Frame,
        sparse: bool = False,
    ) -> None:
        self.forwarder = forwarder
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
                self.forwarder._frame_settled(self)
        else:
            self.forwarder._on_record_failed(self, index, error)

    def on_group_report(self, error: KafkaError | None, message: Any) -> None:
        """Sparse mode: the report of the frame's last record, which speaks for the frame."""
        if error is None:
            self.forwarder._group_delivered(self)
        else:
            self.forwarder._group_failed(self, error)

    def settle_one(self) -> None:
        """A record is done without a success report (dead-lettered, or re-sent and acked)."""
        self.remaining -= 1
        if not self.remaining:
            self.forwarder._frame_settled(self)

    @property
    def records(self) -> list[Record]:
        """Decoded again on first use (only failures need it), then kept for this frame."""
        if self.decoded is None:
            self.decoded = [
                record for batch in iter_decoded(self.payload) for record in batch.records
            ]
        return self.decoded


class Forwarder:
    """Forward a WAL to Kafka on a background thread: ``start()``, ``drain()``, ``stop()``.

    One-shot: once stopped it cannot be started again (make a new one; it resumes from the
    checkpoint). Stop it before closing the WAL. ``stats()`` may be called from any thread.
    """

    def __init__(
        self,
        wal: WriteAheadLog,
        client_config: Mapping[str, Any],
        *,
        dead_letters: DeadLetterStore,
        state_dir: Path | None = None,
        metrics: AgentMetrics | None = None,
        config: ForwarderConfig | None = None,
        before_checkpoint: Callable[[], None] | None = None,
    ) -> None:
        """``before_checkpoint`` runs before every WAL checkpoint that deletes data (the agent
        persists the ingress's producer-sequence state there, which the deleted frames would
        otherwise be needed to rebuild). If it fails, the checkpoint still happens: freeing
        space matters more than exact duplicate detection after a restart."""
        self._wal = wal
        self._before_checkpoint = before_checkpoint
        self._config = config or ForwarderConfig()
        self._client_config = dict(client_config)
        self._producer_config = producer_config(client_config, self._config)
        self._dead_letters = dead_letters
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

        self._generation = 0
        self._tracker = AckTracker(wal.checkpoint_offset)
        self._reader: WalReader | None = None
        self._producer: Producer | None = None
        self._reset_reason: str | None = None
        self._unknown_since: dict[tuple[str, int], tuple[float, float]] = {}
        self._retries: deque[tuple[float, _FrameDelivery, int]] = deque()
        self._unpolled_records = 0
        # Mode (see the module docstring): careful until every frame below
        # ``_careful_until`` is delivered again; ``_isolate``: one record per request.
        self._careful = False
        self._isolate = False
        self._isolate_next = False
        self._careful_until = 0
        # Sparse frames whose last record was refused by produce(): settled by the next
        # success on their partition.
        self._orphans: dict[tuple[str, int], list[_FrameDelivery]] = {}
        # Records dead-lettered by this run, by WAL offset: skipped when a reset re-forwards
        # their frame (no second dead letter, and no endless loop on a broker that fences a
        # producer after a permanent error); forgotten below the checkpoint.
        self._dead_lettered: dict[int, set[int]] = {}
        hint = self._read_hint()
        self._replay_until = max(wal.checkpoint_offset, hint.get("sent_high", 0))
        self._delivered_before = hint.get("delivered_high", 0)

        self._forwarded_records = 0
        self._forwarded_bytes = 0
        self._dead_letter_count = 0
        self._replayed_duplicates = 0
        self._producer_resets = 0
        self._sparse_records = 0
        self._careful_records = 0
        self._published_watermark = wal.checkpoint_offset
        self._published_in_flight = 0
        self._reported = (0, 0, 0)
        self._next_checkpoint = 0.0
        self._next_hint = 0.0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Forwarder:
        if self._thread is not None:
            raise RuntimeError("forwarder already started")
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped the forwarding thread, if one did."""
        return self._failure

    def stop(self, flush_timeout_s: float | None = None) -> None:
        """Stop forwarding: wait up to ``flush_timeout_s`` for in-flight records, checkpoint.

        Records still in flight after that stay in the WAL (above the checkpoint) and are
        replayed by the next run.
        """
        if flush_timeout_s is not None:
            self._config = replace(self._config, stop_flush_timeout_s=flush_timeout_s)
        self._stop.set()
        self._wal.wake_waiters()  # the thread may be waiting for appends
        if self._thread is not None:
            self._thread.join()

    def drain(self, timeout_s: float) -> DrainSummary:
        """Forward everything in the WAL now, then checkpoint and stop; at most ``timeout_s``.

        Starts the forwarder if it is not running (drain mode for an orphaned volume).
        """
        started = time.monotonic()
        target = self._wal.next_offset
        if self._thread is None:
            self.start()
        deadline = started + timeout_s
        while time.monotonic() < deadline and self.running:
            if self._published_watermark >= target:
                break
            time.sleep(0.005)
        self.stop(flush_timeout_s=max(0.0, min(1.0, deadline - time.monotonic())))
        return DrainSummary(
            complete=self._published_watermark >= target,
            target_offset=target,
            checkpoint_offset=self._wal.checkpoint_offset,
            forwarded_records=self._forwarded_records,
            dead_letters=self._dead_letter_count,
            replayed_duplicates=self._replayed_duplicates,
            elapsed_s=time.monotonic() - started,
        )

    def stats(self) -> ForwarderStats:
        return ForwarderStats(
            forwarded_records=self._forwarded_records,
            forwarded_bytes=self._forwarded_bytes,
            dead_letters=self._dead_letter_count,
            replayed_duplicates=self._replayed_duplicates,
            producer_resets=self._producer_resets,
            in_flight_records=self._published_in_flight,
            watermark=self._published_watermark,
            checkpoint_offset=self._wal.checkpoint_offset,
            sparse_records=self._sparse_records,
            careful_records=self._careful_records,
            careful=self._careful,
        )

    # ----------------------------------------------------------------- the forwarding thread
    def _run(self) -> None:
        try:
            self._reader = self._wal.reader(self._tracker.watermark)
            self._producer = self._new_producer()
            self._loop()
            self._finish()
        except Exception as error:  # kept for failure, logged once; the agent decides
            self._failure = error
            log.exception("forwarder stopped by an unexpected error")
        finally:
            if self._reader is not None:
                self._reader.close()
            if self._producer is not None:
                self._generation += 1  # reports after this point belong to nobody
                _discard(self._producer)
                self._producer = None

    def _loop(self) -> None:
        config = self._config
        self._next_checkpoint = time.monotonic() + config.checkpoint_interval_s
        self._next_hint = time.monotonic() + config.hint_interval_s
        while not self._stop.is_set():
            if self._reset_reason is not None:
                self._reset_producer()
                continue
            if self._wal.closed:
                raise WalClosedError("the WAL was closed under the running forwarder")
            assert self._reader is not None and self._producer is not None
            in_flight = not self._tracker.idle
            if self._careful and self._careful_pass_done():
                if not in_flight:
                    self._return_to_sparse()
                    continue
                # Read nothing more until the careful producer has delivered everything:
                # the sparse producer must not overtake it on any partition.
                self._poll(0.02)
                self._housekeeping(time.monotonic())
                continue
            appended_before = self._wal.next_offset
            frames = self._reader.poll(config.read_batch_frames)
            if not frames and not in_flight:
                self._wait_for_appends(appended_before, 0.05)
            for frame in frames:
                if self._stop.is_set() or self._reset_reason is not None:
                    break
                self._forward_frame(frame)
            self._poll(0.0 if frames else (0.02 if in_flight else 0.0))
            if self._orphans and not frames and len(self._producer) == 0:
                # Nothing left in the client that could speak for these frames' records.
                self._request_reset(
                    "a frame's last record was refused and no later record"
                    " of its partition was delivered to vouch for the rest"
                )
            now = time.monotonic()
            if self._retries and self._retries[0][0] <= now:
                self._produce_due_retries(now)
            self._housekeeping(now)

    def _wait_for_appends(self, appended_before: int, timeout: float) -> None:
        """Sleep until the WAL grows past ``appended_before`` or ``stop()`` is called."""
        if not self._stop.is_set():
            self._wal.wait_for_append(appended_before, timeout)

    def _housekeeping(self, now: float) -> None:
        """Publish figures; write the checkpoint and the delivered hint when they are due.

        Besides every ``checkpoint_interval_s``, a checkpoint is written as soon as the frames
        replayed after a start or a reset are all delivered: an agent killed again within
        one interval would otherwise send its whole backlog once more at every restart.
        """
        self._publish()
        config = self._config
        if now >= self._next_checkpoint or self._replay_delivered_unrecorded():
            self._checkpoint(durable_hint=True)
            self._next_checkpoint = now + config.checkpoint_interval_s
            self._next_hint = now + config.hint_interval_s
        elif now >= self._next_hint:
            self._write_hint(durable=False)
            self._next_hint = now + config.hint_interval_s

    def _replay_delivered_unrecorded(self) -> bool:
        return self._wal.checkpoint_offset < self._replay_until <= self._tracker.watermark

    def _finish(self) -> None:
        """Give in-flight records a last chance, then checkpoint what Kafka acknowledged."""
        assert self._producer is not None
        deadline = time.monotonic() + self._config.stop_flush_timeout_s
        while not self._tracker.idle and self._reset_reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._poll(min(0.05, remaining))
        self._publish()
        if not self._wal.closed:
            self._checkpoint(durable_hint=True)

    def _forward_frame(self, frame: Frame) -> None:
        sparse = not self._careful
        delivery = _FrameDelivery(self, self._generation, frame, sparse)
        try:
            calls = decode_produce_calls(frame.payload, frame.topic, frame.partition, None)
        except InvalidRecordBatch as error:
            self._tracker.register(frame.offset, 0)
            self._dead_letter_frame(frame, str(error))
            return
        total = delivery.count = len(calls)
        # Record index of each call; None: the identity (nothing skipped).
        indexes: list[int] | None = None
        skipped = self._dead_lettered.get(frame.offset) if self._dead_lettered else None
        if skipped:  # re-forwarded after a reset: do not send nor dead-letter these again
            indexes = [index for index in range(total) if index not in skipped]
            calls = [calls[index] for index in indexes]
            delivery.dead = total - len(calls)
        produced = len(calls)
        if not produced:
            self._tracker.register(frame.offset, 0)
            return
        if frame.offset < self._replay_until:
            self._replayed_duplicates += produced
        self._tracker.register(frame.offset, total, frame.appended_ms)
        if sparse:
            # One report for the frame: the last record's (see the module docstring).
            last = calls[-1]
            calls[-1] = (*last[:4], delivery.on_group_report, *last[5:])  # type: ignore[assignment]
            delivery.reporter = produced - 1 if indexes is None else indexes[-1]
            delivery.remaining = 1 + delivery.dead
        else:
            report = delivery.on_record_report
            calls = [
                (*call[:4], partial(report, index), *call[5:])  # type: ignore[misc]
                for call, index in zip(calls, indexes or range(total), strict=True)
            ]
            delivery.remaining = total
        for _ in range(delivery.dead):
            delivery.settle_one()
        producer = self._producer
        assert producer is not None
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
                self._poll(0.05)
                self._housekeeping(time.monotonic())
                if self._stop.is_set() or self._reset_reason is not None:
                    return  # the frame stays above the watermark and is replayed
            except KafkaException as exception:
                position = next(counter) - 1
                index = position if indexes is None else indexes[position]
                if sparse:
                    refused += 1
                    last_refused = position == produced - 1
                    delivery.remaining += 1  # this record settles on its own
                self._on_record_failed(delivery, index, exception.args[0], synchronous=True)
                position += 1
        if sparse:
            delivery.unreported = produced - 1 - (refused - 1 if last_refused else refused)
            if last_refused:
                if delivery.unreported:
                    key = (delivery.topic, delivery.partition)
                    self._orphans.setdefault(key, []).append(delivery)
                else:
                    delivery.settle_one()  # every record was refused and handled alone
        self._unpolled_records += produced
        if self._unpolled_records >= POLL_EVERY_RECORDS:
            self._unpolled_records = 0
            self._poll(0)

    def _careful_pass_done(self) -> bool:
        """Every frame in flight at the last reset has been forwarded again (not yet
        necessarily delivered) and no record waits for a retry."""
        return self._tracker.next_offset >= self._careful_until and not self._retries

    def _return_to_sparse(self) -> None:
        """The careful producer delivered everything: continue with a sparse one."""
        log.info(
            "careful re-forwarding done up to WAL offset %d; back to sparse delivery reports",
            self._careful_until,
        )
        old = self._producer
        self._generation += 1
        if old is not None:
            _discard(old)
        self._careful = False
        self._isolate = False
        self._producer = self._new_producer()

    # ----------------------------------------------------------------- failures
    def _frame_settled(self, delivery: _FrameDelivery) -> None:
        if delivery.generation != self._generation:
            return  # reports from a producer that was reset; the frame is being replayed
        self._tracker.ack(delivery.offset, delivery.count)
        forwarded = delivery.count - delivery.dead
        self._forwarded_records += forwarded
        if delivery.sparse:
            self._sparse_records += forwarded
        else:
            self._careful_records += forwarded
        self._forwarded_bytes += len(delivery.payload)

    def _group_delivered(self, delivery: _FrameDelivery) -> None:
        """Sparse mode: the frame's last record was written, hence every record before it on
        its partition (module docstring), including frames whose last record was refused."""
        if delivery.generation != self._generation:
            return
        if self._orphans:
            orphans = self._orphans.get((delivery.topic, delivery.partition))
            if orphans:
                vouched = [orphan for orphan in orphans if orphan.offset < delivery.offset]
                if vouched:
                    orphans[:] = [o for o in orphans if o.offset > delivery.offset]
                    if not orphans:
                        del self._orphans[(delivery.topic, delivery.partition)]
                    for orphan in vouched:
                        orphan.settle_one()
        delivery.settle_one()

    def _group_failed(self, delivery: _FrameDelivery, error: KafkaError) -> None:
        """Sparse mode: the report speaking for a frame failed; what happened to the records
        produced without a callback is unknown, so they are sent again, carefully."""
        if delivery.generation != self._generation:
            return
        if not delivery.unreported:  # the report was about that one record only
            self._on_record_failed(delivery, delivery.reporter, error)
            return
        self._request_reset(
            f"{error.name()}: {error.str()} (sparse frame {delivery.offset},"
            f" {delivery.topic}/{delivery.partition})",
            isolate=error.code() in PERMANENT_ERRORS,
        )

    def _on_record_failed(
        self,
        delivery: _FrameDelivery,
        index: int,
        error: KafkaError,
        *,
        synchronous: bool = False,
    ) -> None:
        """One record failed: raised by ``produce()`` (``synchronous``) or reported failed."""
        if delivery.generation != self._generation:
            return
        code = error.code()
        if code in PERMANENT_ERRORS:
            if synchronous or (self._careful and self._isolate):
                self._dead_letter_record(delivery, index, error)
            else:
                # The broker refused a whole batch: which of its records is at fault is
                # unknown. Send again one record per request and let the broker tell.
                self._request_reset(
                    f"{error.name()}: {error.str()} ({delivery.topic}/{delivery.partition})",
                    isolate=True,
                )
            return
        if code in UNKNOWN_TOPIC_ERRORS:
            key = (delivery.topic, delivery.partition)
            now = time.monotonic()
            first, last = self._unknown_since.get(key, (now, now))
            if now - last > self._config.unknown_topic_wait_s:
                first = now
            self._unknown_since[key] = (first, now)
            if now - first >= self._config.unknown_topic_wait_s:
                self._dead_letter_record(delivery, index, error)
            else:
                self._retries.append((now + self._config.retry_backoff_s, delivery, index))
            return
        self._request_reset(
            f"{error.name()}: {error.str()} ({delivery.topic}/{delivery.partition})"
        )

    def _produce_due_retries(self, now: float) -> None:
        """Produce again records whose topic or partition was unknown, in failure order."""
        while self._retries and self._retries[0][0] <= now:
            _, delivery, index = self._retries.popleft()
            if delivery.generation != self._generation:
                continue
            record = delivery.records[index]
            try:
                self._producer.produce(  # type: ignore[union-attr]
                    delivery.topic,
                    record.value,
                    record.key,
                    partition=delivery.partition,
                    timestamp=record.timestamp_ms,
                    headers=record.headers or None,
                    on_delivery=partial(self._on_retry_delivery, delivery, index),
                )
            except BufferError:
                self._retries.appendleft((now, delivery, index))
                return
            except KafkaException as exception:
                self._on_record_failed(delivery, index, exception.args[0], synchronous=True)

    def _on_retry_delivery(
        self, delivery: _FrameDelivery, index: int, error: KafkaError | None, message: Any
    ) -> None:
        if delivery.generation != self._generation:
            return
        if error is None:
            delivery.settle_one()
        else:
            self._on_record_failed(delivery, index, error)

    def _request_reset(self, reason: str, *, isolate: bool = False) -> None:
        self._isolate_next = self._isolate_next or isolate
        if self._reset_reason is None:
            self._reset_reason = reason

    def _dead_letter_record(self, delivery: _FrameDelivery, index: int, error: KafkaError) -> None:
        record = delivery.records[index]
        self._dead_letters.add_record(
            wal_offset=delivery.offset,
            topic=delivery.topic,
            partition=delivery.partition,
            record_index=index,
            timestamp_ms=record.timestamp_ms,
            key=record.key,
            value=record.value,
            headers=record.headers,
            reason=error.str(),
            error_code=error.name(),
        )
        self._dead_lettered.setdefault(delivery.offset, set()).add(index)
        self._count_dead_letter(error.name())
        delivery.dead += 1
        log.error(
            "record %d of WAL frame %d (%s/%d) moved to the dead-letter area: %s",
            index,
            delivery.offset,
            delivery.topic,
            delivery.partition,
            error.str(),
        )
        delivery.settle_one()

    def _dead_letter_frame(self, frame: Frame, reason: str) -> None:
        self._dead_letters.add_frame(
            wal_offset=frame.offset,
            topic=frame.topic,
            partition=frame.partition,
            payload=frame.payload,
            reason=reason,
            error_code="INVALID_RECORD_BATCH",
        )
        self._count_dead_letter("INVALID_RECORD_BATCH")
        log.error(
            "WAL frame %d cannot be decoded; moved to the dead-letter area: %s",
            frame.offset,
            reason,
        )

    def _count_dead_letter(self, reason: str) -> None:
        self._dead_letter_count += 1
        if self._metrics is not None:
            self._metrics.dead_letters.labels(reason=reason).inc()

    def _poll(self, timeout: float) -> None:
        """Serve delivery reports. A fatal producer error surfaces here: confluent-kafka
        (2.16) raises it from ``poll()`` rather than calling ``error_cb``."""
        assert self._producer is not None
        try:
            self._producer.poll(timeout)
        except KafkaException as exception:
            error = exception.args[0] if exception.args else None
            if not isinstance(error, KafkaError) or not error.fatal():
                raise
            self._on_fatal_error(error)

    def _error_cb(self, error: KafkaError) -> None:
        if error.fatal():
            self._on_fatal_error(error)
        else:
            log.debug("Kafka client: %s", error)

    def _on_fatal_error(self, error: KafkaError) -> None:
        """The producer is dead: reset it. Raised or called back in order with the delivery
        reports, before any report the dying producer queued after the failure: stop
        believing its reports now (a lax broker may accept a batch after the failed one, and
        a sparse report would then vouch for the gap)."""
        self._generation += 1
        self._request_reset(
            f"fatal producer error {error.name()}: {error.str()}",
            isolate=error.code() == KafkaError._GAPLESS_GUARANTEE,
        )

    def _new_producer(self) -> Producer:
        settings = self._producer_config
        if self._careful:
            settings = producer_config(
                self._client_config, self._config, careful=True, isolate=self._isolate
            )
        return Producer({**settings, "error_cb": self._error_cb})

    def _reset_producer(self) -> None:
        """Throw the producer away and replay from the watermark with a new, careful one, in
        order, until the frames in flight now have been forwarded again."""
        reason, self._reset_reason = self._reset_reason, None
        self._isolate = (self._careful and self._isolate) or self._isolate_next
        self._isolate_next = False
        self._careful = True
        self._careful_until = max(self._careful_until, self._tracker.next_offset)
        log.warning(
            "resetting the Kafka producer and replaying from the watermark carefully (one"
            " report per record%s) up to WAL offset %d: %s",
            ", one record per request" if self._isolate else "",
            self._careful_until,
            reason,
        )
        self._generation += 1
        self._producer_resets += 1
        self._retries.clear()
        self._orphans.clear()
        if self._metrics is not None:
            self._metrics.producer_resets.inc()
        old = self._producer
        if old is not None:
            _discard(old)
        self._replay_until = max(self._replay_until, self._tracker.next_offset)
        watermark = self._tracker.watermark
        self._checkpoint(durable_hint=True)
        self._tracker = AckTracker(watermark)
        assert self._reader is not None
        self._reader.close()
        self._reader = self._wal.reader(watermark)
        self._stop.wait(self._config.reset_backoff_s)
        self._producer = self._new_producer()

    # ----------------------------------------------------------------- checkpoint and hint
    def _checkpoint(self, *, durable_hint: bool) -> None:
        watermark = self._tracker.watermark
        if watermark > self._wal.checkpoint_offset:
            if self._before_checkpoint is not None:
                try:
                    self._before_checkpoint()
                except Exception as error:  # logged: the checkpoint must go on
                    log.warning("before-checkpoint hook failed (%s); checkpointing anyway", error)
            self._wal.checkpoint(watermark)
            if self._dead_lettered:
                self._dead_lettered = {
                    offset: indexes
                    for offset, indexes in self._dead_lettered.items()
                    if offset >= watermark
                }
        self._write_hint(durable=durable_hint)
        if self._metrics is not None:
            self._metrics.checkpoint_offset.set(self._wal.checkpoint_offset)

    def _write_hint(self, *, durable: bool) -> None:
        if self._state_dir is None:
            return
        hint = {
            "sent_high": max(self._tracker.next_offset, self._replay_until),
            "delivered_high": max(self._tracker.delivered_high, self._delivered_before),
        }
        data = json.dumps(hint).encode()
        self._state_dir.mkdir(parents=True, exist_ok=True)
        path = self._state_dir / HINT_FILE
        if durable:
            write_atomic(path, data)
        else:
            temporary = path.with_name(f".{path.name}.fast")
            temporary.write_bytes(data)
            temporary.replace(path)

    def _read_hint(self) -> dict[str, int]:
        if self._state_dir is None:
            return {}
        try:
            hint = json.loads((self._state_dir / HINT_FILE).read_bytes())
            return {key: int(hint[key]) for key in ("sent_high", "delivered_high")}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    # ----------------------------------------------------------------- observability
    def _publish(self) -> None:
        """Copy counters for other threads and push increments to the metrics."""
        tracker = self._tracker
        self._published_watermark = tracker.watermark
        self._published_in_flight = tracker.pending_records
        metrics = self._metrics
        if metrics is None:
            return
        records, size, duplicates = self._reported
        if self._forwarded_records != records:
            metrics.forwarded_records.inc(self._forwarded_records - records)
            metrics.forwarded_bytes.inc(self._forwarded_bytes - size)
        if self._replayed_duplicates != duplicates:
            metrics.replayed_duplicates.inc(self._replayed_duplicates - duplicates)
        self._reported = (self._forwarded_records, self._forwarded_bytes, self._replayed_duplicates)
        metrics.in_flight_records.set(tracker.pending_records)
        oldest = tracker.oldest_pending_appended_ms
        age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000.0)
        metrics.oldest_unsent_age_seconds.set(age)


def _discard(producer: Producer) -> None:
    """Drop whatever a producer still holds; its reports belong to nobody any more."""
    producer.purge(in_queue=True, in_flight=True)
    try:
        producer.poll(0)
    except KafkaException as exception:  # a fatal error it had not reported yet
        log.debug("discarded producer: %s", exception)
