"""Carrying out the failure policy: dead-letter a record or frame, produce a record again
later, or ask for a producer reset. ``failure_policy`` decides which.

A dead letter that cannot be written (a full disk) keeps its frame unsettled, so the
watermark, and with it the checkpoint, stays below the frame and the frame stays in the
WAL; the letter is tried again every :data:`LETTER_RETRY_S` (letters after it wait their
turn) until it is written. A crash meanwhile replays the frame and Kafka refuses it again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Producer

from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.delivery import DeliveryMode, FrameDelivery
from durable_producer.buffer_agent.forward.failure_policy import (
    RecordFailurePolicy,
    Verdict,
    batch_failure,
)
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.log_limits import RateLimitedLog
from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.wal import Frame

log = logging.getLogger(__name__)

LETTER_RETRY_S = 1.0
"""Seconds between attempts to write a dead letter the disk had no room for."""


class FailureHandler:
    """Failed records and frames of the current run (``delivery.FailureHandling``). Runs on
    the forwarding thread; ``dead_letter_count`` may be read from any thread."""

    def __init__(
        self,
        dead_letters: DeadLetterStore,
        mode: DeliveryMode,
        metrics: AgentMetrics | None,
        *,
        unknown_topic_wait_s: float,
        retry_backoff_s: float,
        retry_backoff_max_s: float | None = None,
        dead_letter_after_s: float = 0.0,
        health: ForwarderHealth | None = None,
    ) -> None:
        self._dead_letters = dead_letters
        self._mode = mode
        self._metrics = metrics
        self._health = health
        self._retry_backoff_s = retry_backoff_s
        self._retry_backoff_max_s = retry_backoff_max_s or retry_backoff_s
        self._policy = RecordFailurePolicy(
            unknown_topic_wait_s,
            dead_letter_after_s,
            longest_retry_gap_s=2 * self._retry_backoff_max_s,
        )
        # (due time, frame, record index) of records to produce again, in failure order.
        self.retries: deque[tuple[float, FrameDelivery, int]] = deque()
        # Failed attempts of records retried, by (WAL offset, record index); forgotten below
        # the checkpoint.
        self._attempts: dict[tuple[int, int], int] = {}
        # Records dead-lettered by this run, by WAL offset: skipped when a reset re-forwards
        # their frame (no second dead letter, and no endless loop on a broker that fences a
        # producer after a permanent error); forgotten below the checkpoint.
        self.dead_lettered: dict[int, set[int]] = {}
        self.dead_letter_count = 0
        # Dead letters not yet written (generation, write), in failure order.
        self.waiting_letters: deque[tuple[int, Callable[[], None]]] = deque()
        self._letters_due = 0.0
        self._letter_log = RateLimitedLog(log, interval_s=30.0)

    def record_failed(
        self, delivery: FrameDelivery, index: int, error: KafkaError, *, synchronous: bool = False
    ) -> None:
        """Record ``index`` of a current frame failed: raised by ``produce()``
        (``synchronous``) or reported failed."""
        now = time.monotonic()
        self._note(error)
        verdict = self._policy.judge(
            error.code(),
            delivery.topic,
            delivery.partition,
            now,
            synchronous=synchronous,
            isolating=self._mode.isolating,
        )
        if verdict is Verdict.DEAD_LETTER:
            self._dead_letter_record(delivery, index, error)
        elif verdict is Verdict.RETRY:
            attempt = self._attempts.get((delivery.offset, index), 0)
            self._attempts[(delivery.offset, index)] = attempt + 1
            backoff = min(self._retry_backoff_s * 2**attempt, self._retry_backoff_max_s)
            self.retries.append((now + backoff, delivery, index))
        else:
            self._mode.request_reset(
                f"{error.name()}: {error.str()} ({delivery.topic}/{delivery.partition})",
                isolate=verdict is Verdict.ISOLATE,
            )

    def group_failed(self, delivery: FrameDelivery, error: KafkaError) -> None:
        """Sparse mode: the report speaking for a current frame failed; what happened to the
        records produced without a callback is unknown, so they are sent again, carefully."""
        if not delivery.unreported:  # the report was about that one record only
            self.record_failed(delivery, delivery.reporter, error)
            return
        self._note(error)
        self._mode.request_reset(
            f"{error.name()}: {error.str()} (sparse frame {delivery.offset},"
            f" {delivery.topic}/{delivery.partition})",
            isolate=batch_failure(error.code()) is Verdict.ISOLATE,
        )

    def refused_after_reset(self, error: KafkaError) -> None:
        """A report for a record a producer that has since been reset sent: its frame is sent
        again, so nothing is done, but a refusal by Kafka is counted like any other (such a
        record may land after later ones of its partition). The old producer's own purge of
        its queue is not a refusal."""
        if error.code() > 0:  # a broker's error code; librdkafka's local ones are negative
            self._note(error)

    def _note(self, error: KafkaError) -> None:
        if self._health is not None:
            self._health.error("delivery", error.code(), error.name(), error.str())

    # ----------------------------------------------------------------- retries
    def retry_due(self, now: float) -> bool:
        return bool(self.retries) and self.retries[0][0] <= now

    def produce_due_retries(self, producer: Producer, now: float, generation: int) -> None:
        """Produce again records whose topic or partition was unknown or that were refused,
        in failure order; those of frames older than ``generation`` are dropped (their frame
        is replayed). A record ``produce()`` refuses again keeps its place at the head."""
        retries = self.retries
        while retries and retries[0][0] <= now:
            _, delivery, index = retries.popleft()
            if delivery.generation != generation:
                continue
            record = delivery.records[index]
            try:
                producer.produce(
                    delivery.topic,
                    record.value,
                    record.key,
                    partition=delivery.partition,
                    timestamp=record.timestamp_ms,
                    headers=record.headers or None,  # type: ignore[arg-type]  # list invariance
                    on_delivery=partial(delivery.on_retry_report, index),
                )
            except BufferError:
                retries.appendleft((now, delivery, index))
                return
            except KafkaException as exception:
                waiting = len(retries)
                self.record_failed(delivery, index, exception.args[0], synchronous=True)
                if len(retries) > waiting:  # retried later: back to the head, in order
                    retries.appendleft(retries.pop())
                    return

    # ----------------------------------------------------------------- dead letters
    def forget_below(self, checkpoint: int) -> None:
        """Frames below the checkpoint are never forwarded again."""
        if self._attempts:
            self._attempts = {k: n for k, n in self._attempts.items() if k[0] >= checkpoint}
        if self.dead_lettered:
            self.dead_lettered = {
                offset: indexes
                for offset, indexes in self.dead_lettered.items()
                if offset >= checkpoint
            }

    def _write_or_wait(self, generation: int, write: Callable[[], None]) -> None:
        """Write a dead letter now, or queue it if the disk refuses (or others wait)."""
        if not self.waiting_letters:
            try:
                write()
                return
            except OSError as error:
                self._letter_failed(error)
        self.waiting_letters.append((generation, write))

    def write_waiting_letters(self, now: float, generation: int) -> None:
        """Try the dead letters the disk refused again (at most every LETTER_RETRY_S);
        those of frames older than ``generation`` are dropped (their frame is replayed)."""
        letters = self.waiting_letters
        if not letters or now < self._letters_due:
            return
        self._letters_due = now + LETTER_RETRY_S
        while letters:
            letter_generation, write = letters[0]
            if letter_generation == generation:
                try:
                    write()
                except OSError as error:
                    self._letter_failed(error)
                    return
            letters.popleft()

    def _letter_failed(self, error: OSError) -> None:
        self._letter_log.warning(
            "letter",
            "could not write a dead letter (%s); its frame stays in the WAL and is not"
            " checkpointed until the letter is written (retried every %.0f s)",
            error,
            LETTER_RETRY_S,
        )
        if self._metrics is not None:
            self._metrics.write_errors.labels(file="dead_letter").inc()

    def _dead_letter_record(self, delivery: FrameDelivery, index: int, error: KafkaError) -> None:
        self._write_or_wait(
            delivery.generation, partial(self._write_record_letter, delivery, index, error)
        )

    def _write_record_letter(self, delivery: FrameDelivery, index: int, error: KafkaError) -> None:
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
        self.dead_lettered.setdefault(delivery.offset, set()).add(index)
        self._attempts.pop((delivery.offset, index), None)
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

    def dead_letter_frame(
        self, frame: Frame, reason: str, generation: int, settle: Callable[[], None]
    ) -> None:
        """Dead-letter an undecodable frame; ``settle`` once the letter is written."""
        self._write_or_wait(generation, partial(self._write_frame_letter, frame, reason, settle))

    def _write_frame_letter(self, frame: Frame, reason: str, settle: Callable[[], None]) -> None:
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
        settle()

    def _count_dead_letter(self, reason: str) -> None:
        self.dead_letter_count += 1
        if self._metrics is not None:
            self._metrics.dead_letters.labels(reason=reason).inc()
