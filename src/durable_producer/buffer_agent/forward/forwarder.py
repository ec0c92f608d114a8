"""The forwarder: WAL -> decoded records -> confluent-kafka producer -> Kafka.

One thread reads frames from the WAL checkpoint onwards, decodes each stored record batch
and produces every record to the partition the client chose, with its key, value, headers
and timestamp, through an idempotent ``acks=all`` producer whose records never expire
(``producer``). Delivery reports are served on the same thread (``poll``) every
``POLL_EVERY_RECORDS`` records and after every WAL read; they settle frames in an
``AckTracker`` (``delivery``: the hot path, and the sparse and careful modes), whose
contiguous watermark becomes the WAL checkpoint (``progress``: the checkpoint, and the
sent/delivered hint that counts duplicates). Records Kafka refuses are dead-lettered,
retried or make the forwarder reset its producer (``failure_policy`` decides, ``failures``
acts); a reset re-forwards from the watermark carefully, then the forwarder returns to
sparse mode. What is sent again is counted as certain or possible duplicates
(``replay_accounting``); ``health`` says which fault the forwarder is in and ``publisher``
shows both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.delivery import DeliveryLedger, DeliveryMode
from durable_producer.buffer_agent.forward.failure_policy import Verdict, fatal_error
from durable_producer.buffer_agent.forward.failures import FailureHandler
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.forward.producer import ProducerFactory, discard, serve_reports
from durable_producer.buffer_agent.forward.progress import Progress
from durable_producer.buffer_agent.forward.publisher import DrainSummary, ForwarderStats, Publisher
from durable_producer.buffer_agent.forward.replay_accounting import ReplayAccount
from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.wal import WalClosedError, WalReader, WriteAheadLog

log = logging.getLogger(__name__)

# Serve delivery reports after this many produced records (and after every WAL read).
# poll() releases and retakes the GIL: once per frame would mean thousands of hand-overs a
# second to busy ingress threads when clients send small batches.
POLL_EVERY_RECORDS = 1_000


__all__ = ["DrainSummary", "Forwarder", "ForwarderStats"]


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
        """``before_checkpoint``: see ``progress.Progress``."""
        self._wal = wal
        self._config = config or ForwarderConfig()
        self._metrics = metrics
        self.health = ForwarderHealth(
            stall_after_s=self._config.stall_after_s,
            on_error=metrics.count_kafka_error if metrics is not None else None,
        )
        self._producers = ProducerFactory(
            client_config, self._config, self._on_fatal_error, health=self.health
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

        self._mode = DeliveryMode()
        self._failures = FailureHandler(
            dead_letters,
            self._mode,
            metrics,
            unknown_topic_wait_s=self._config.unknown_topic_wait_s,
            retry_backoff_s=self._config.retry_backoff_s,
            retry_backoff_max_s=self._config.retry_backoff_max_s,
            dead_letter_after_s=self._config.dead_letter_after_s,
            health=self.health,
        )
        self._progress = Progress(wal, state_dir, metrics, before_checkpoint)
        self._replay = ReplayAccount.of_volume(state_dir, wal.checkpoint_offset, self._progress)
        self._ledger = DeliveryLedger(
            AckTracker(wal.checkpoint_offset), self._failures, self._replay
        )
        self._publisher = Publisher(wal, metrics, self.health, self._producers.client_log)
        self._reader: WalReader | None = None
        self._producer: Producer | None = None
        self._unpolled_records = 0

        self._producer_resets = 0
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
        target = self._wal.frames_end  # lost offsets at the end settle nothing
        if self._thread is None:
            self.start()
        deadline = started + timeout_s
        while time.monotonic() < deadline and self.running:
            if self._publisher.watermark >= target:
                break
            time.sleep(0.005)
        self.stop(flush_timeout_s=max(0.0, min(1.0, deadline - time.monotonic())))
        return DrainSummary(
            complete=self._publisher.watermark >= target,
            target_offset=target,
            checkpoint_offset=self._wal.checkpoint_offset,
            forwarded_records=self._ledger.forwarded_records,
            dead_letters=self._failures.dead_letter_count,
            replayed_duplicates=self._replay.certain_duplicates,
            elapsed_s=time.monotonic() - started,
            possible_duplicates=self._replay.possible_duplicates,
        )

    def stats(self) -> ForwarderStats:
        ledger = self._ledger
        return ForwarderStats(
            forwarded_records=ledger.forwarded_records,
            forwarded_bytes=ledger.forwarded_bytes,
            dead_letters=self._failures.dead_letter_count,
            replayed_duplicates=self._replay.certain_duplicates,
            producer_resets=self._producer_resets,
            in_flight_records=self._publisher.in_flight,
            watermark=self._publisher.watermark,
            checkpoint_offset=self._wal.checkpoint_offset,
            sparse_records=ledger.sparse_records,
            careful_records=ledger.careful_records,
            careful=self._mode.careful,
            possible_duplicates=self._replay.possible_duplicates,
            state=self.health.state().value,
        )

    # ----------------------------------------------------------------- the forwarding thread
    def _run(self) -> None:
        try:
            self._reader = self._wal.reader(self._ledger.tracker.watermark)
            self._producer = self._new_producer()
            self._loop()
            self._finish()
        except Exception as error:  # kept for failure, logged once; the agent decides
            self._failure = error
            log.exception("forwarder stopped by an unexpected error")
        finally:
            self._progress.close()
            if self._reader is not None:
                self._reader.close()
            if self._producer is not None:
                self._ledger.disown_reports()  # reports after this point belong to nobody
                discard(self._producer)
                self._producer = None

    def _loop(self) -> None:
        config = self._config
        mode, ledger, failures = self._mode, self._ledger, self._failures
        self._next_checkpoint = time.monotonic() + config.checkpoint_interval_s
        self._next_hint = time.monotonic() + config.hint_interval_s
        while not self._stop.is_set():
            if mode.reset_reason is not None:
                self._reset_producer()
                continue
            if self._wal.closed:
                raise WalClosedError("the WAL was closed under the running forwarder")
            producer, reader = self._producer, self._reader
            assert reader is not None and producer is not None
            in_flight = not ledger.tracker.idle
            if failures.retries:
                # Refused records wait for a retry: send nothing newer until they are
                # through or dead-lettered, so they keep their place in their partition.
                self._poll(0.02)
                failures.produce_due_retries(producer, time.monotonic(), ledger.generation)
                self._housekeeping(time.monotonic())
                continue
            if mode.careful and self._careful_pass_done():
                if not in_flight:
                    self._return_to_sparse()
                    continue
                # Read nothing more until the careful producer has delivered everything:
                # the sparse producer must not overtake it on any partition.
                self._poll(0.02)
                self._housekeeping(time.monotonic())
                continue
            appended_before = self._wal.next_offset
            frames = reader.poll(config.read_batch_frames)
            if not frames and not in_flight:
                self._wait_for_appends(appended_before, 0.05)
            sparse = not mode.careful
            wait_for_room = self._wait_for_room
            if frames:  # recorded before sending: a crash can never hide a send
                self._replay.before_sending(
                    frames[-1].offset + 1, ledger.tracker, self._wal.checkpoint_offset
                )
            for frame in frames:
                if self._stop.is_set() or mode.reset_reason is not None:
                    break
                produced = ledger.produce_frame(
                    frame,
                    producer,
                    sparse=sparse,
                    wait_for_room=wait_for_room,
                )
                if produced:
                    self._unpolled_records += produced
                    if self._unpolled_records >= POLL_EVERY_RECORDS:
                        self._unpolled_records = 0
                        self._poll(0)
            self._poll(0.0 if frames else (0.02 if in_flight else 0.0))
            if ledger.orphans and not frames and len(producer) == 0:
                # Nothing left in the client that could speak for these frames' records.
                mode.request_reset(
                    "a frame's last record was refused and no later record"
                    " of its partition was delivered to vouch for the rest"
                )
            now = time.monotonic()
            if failures.retry_due(now):
                failures.produce_due_retries(producer, now, ledger.generation)
            self._housekeeping(now)

    def _wait_for_appends(self, appended_before: int, timeout: float) -> None:
        """Sleep until the WAL grows past ``appended_before`` or ``stop()`` is called."""
        if not self._stop.is_set():
            self._wal.wait_for_append(appended_before, timeout)

    def _wait_for_room(self) -> bool:
        """The client's queue is full: serve reports a while. False: stop or reset instead."""
        self._poll(0.05)
        self._housekeeping(time.monotonic())
        return not (self._stop.is_set() or self._mode.reset_reason is not None)

    def _housekeeping(self, now: float) -> None:
        """Publish figures; write waiting dead letters, the checkpoint and the delivered hint
        when they are due.

        Besides every ``checkpoint_interval_s``, a checkpoint is written as soon as the frames
        replayed after a start or a reset are all delivered: an agent killed again within
        one interval would otherwise send its whole backlog once more at every restart.
        """
        self._publish()
        config = self._config
        tracker = self._ledger.tracker
        if now >= self._next_checkpoint or self._progress.replay_delivered_unrecorded(tracker):
            self._checkpoint(durable_hint=True)
            self._next_checkpoint = now + config.checkpoint_interval_s
            self._next_hint = now + config.hint_interval_s
        elif now >= self._next_hint:
            self._progress.write_hint(tracker, durable=False)
            self._next_hint = now + config.hint_interval_s
        if self._failures.waiting_letters:  # after the checkpoint, which may free space
            self._failures.write_waiting_letters(now, self._ledger.generation)

    def _checkpoint(self, *, durable_hint: bool) -> None:
        tracker = self._ledger.tracker
        if self._progress.checkpoint(tracker, durable_hint=durable_hint):
            self._failures.forget_below(tracker.watermark)

    def _finish(self) -> None:
        """Give in-flight records a last chance, then checkpoint what Kafka acknowledged."""
        assert self._producer is not None
        deadline = time.monotonic() + self._config.stop_flush_timeout_s
        while not self._ledger.tracker.idle and self._mode.reset_reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._poll(min(0.05, remaining))
        self._publish()
        if not self._wal.closed:
            self._checkpoint(durable_hint=True)

    def _poll(self, timeout: float) -> None:
        assert self._producer is not None
        serve_reports(self._producer, timeout, self._on_fatal_error)

    # ----------------------------------------------------------------- producers and modes
    def _new_producer(self) -> Producer:
        return self._producers.create(careful=self._mode.careful, isolate=self._mode.isolate)

    def _on_fatal_error(self, error: KafkaError) -> None:
        """The producer is dead: reset it. Raised or called back in order with the delivery
        reports, before any report the dying producer queued after the failure: stop
        believing its reports now (a lax broker may accept a batch after the failed one, and
        a sparse report would then vouch for the gap)."""
        self._ledger.disown_reports()
        self.health.error("fatal", error.code(), error.name(), error.str())
        self._mode.request_reset(
            f"fatal producer error {error.name()}: {error.str()}",
            isolate=fatal_error(error.code()) is Verdict.ISOLATE,
        )

    def _reset_producer(self) -> None:
        """Throw the producer away and replay from the watermark with a new, careful one, in
        order, until the frames in flight now have been forwarded again."""
        mode, ledger = self._mode, self._ledger
        reason = mode.enter_careful(ledger.tracker.next_offset)
        log.warning(
            "resetting the Kafka producer and replaying from the watermark carefully (one"
            " report per record%s) up to WAL offset %d: %s",
            ", one record per request" if mode.isolate else "",
            mode.careful_until,
            reason,
        )
        ledger.disown_reports()
        self._producer_resets += 1
        self._failures.retries.clear()
        if self._metrics is not None:
            self._metrics.producer_resets.inc()
        old = self._producer
        if old is not None:
            discard(old)
        self._progress.replaying_up_to(ledger.tracker.next_offset)
        self._replay.after_reset(ledger.tracker)
        watermark = ledger.tracker.watermark
        self._checkpoint(durable_hint=True)
        ledger.start_over(watermark)
        assert self._reader is not None
        self._reader.close()
        self._reader = self._wal.reader(watermark)
        self._stop.wait(self._config.reset_backoff_s)
        self._producer = self._new_producer()

    def _careful_pass_done(self) -> bool:
        """Every frame in flight at the last reset has been forwarded again (not yet
        necessarily delivered) and no record waits for a retry."""
        return (
            self._ledger.tracker.next_offset >= self._mode.careful_until
            and not self._failures.retries
        )

    def _return_to_sparse(self) -> None:
        """The careful producer delivered everything: continue with a sparse one."""
        log.info(
            "careful re-forwarding done up to WAL offset %d; back to sparse delivery reports",
            self._mode.careful_until,
        )
        old = self._producer
        self._ledger.disown_reports()
        if old is not None:
            discard(old)
        self._mode.leave_careful()
        self._producer = self._new_producer()

    # ----------------------------------------------------------------- observability
    def _publish(self) -> None:
        self._publisher.publish(self._ledger, self._failures)
