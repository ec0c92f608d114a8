"""What the forwarder shows of itself: its figures for other threads, its metrics, its health.

``Publisher.publish`` runs on the forwarding thread at every housekeeping pass: it copies
counters other threads read (``ForwarderStats``), pushes increments to the Prometheus
metrics, tells ``ForwarderHealth`` about deliveries and the work that waits (and so logs a
change of state), and lets ``ReplayAccount`` record new acknowledgements in the delivery
marks file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from durable_producer.buffer_agent.forward.delivery import DeliveryLedger
from durable_producer.buffer_agent.forward.failures import FailureHandler
from durable_producer.buffer_agent.forward.health import ForwarderHealth, ForwarderState
from durable_producer.buffer_agent.kafka.client_log import ClientLog
from durable_producer.buffer_agent.metrics import DUPLICATE_CAUSES, AgentMetrics
from durable_producer.buffer_agent.wal import WriteAheadLog


@dataclass(frozen=True, slots=True)
class ForwarderStats:
    forwarded_records: int
    forwarded_bytes: int
    dead_letters: int
    replayed_duplicates: int
    """Records sent again that Kafka had acknowledged (certain duplicates)."""
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
    possible_duplicates: int = 0
    """Records sent again whose earlier copy's outcome was unknown."""
    state: str = ForwarderState.IDLE.value


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
    possible_duplicates: int = 0


class Publisher:
    """Publishes one forwarder's figures (module docstring). Forwarding thread only, except
    the attributes other threads read: ``watermark``, ``in_flight``."""

    def __init__(
        self,
        wal: WriteAheadLog,
        metrics: AgentMetrics | None,
        health: ForwarderHealth,
        client_log: ClientLog | None = None,
    ) -> None:
        self._wal = wal
        self._metrics = metrics
        self._health = health
        self._client_log = client_log
        self.watermark = wal.checkpoint_offset
        self.in_flight = 0
        self._forwarded = (0, 0)
        self._duplicates: dict[tuple[str, str], int] = {}
        if metrics is not None:
            metrics.watch_forwarder(
                states=[state.value for state in ForwarderState],
                state=lambda: health.state().value,
                seconds_since_delivery=health.seconds_since_delivery,
                refused_records=lambda: health.refused_waiting,
            )

    def publish(self, ledger: DeliveryLedger, failures: FailureHandler) -> None:
        tracker = ledger.tracker
        self.watermark = tracker.watermark
        self.in_flight = tracker.pending_records
        health = self._health
        records, size = self._forwarded
        if ledger.forwarded_records != records:
            health.delivered()
            if self._client_log is not None:
                self._client_log.recovered()
        health.beat(
            in_flight=tracker.pending_records,
            unread=max(0, self._wal.frames_end - tracker.next_offset),
            refused_waiting=len(failures.retries),
        )
        health.check()
        ledger.replay.maybe_write(tracker, self._wal.checkpoint_offset, ledger.forwarded_records)
        metrics = self._metrics
        if metrics is not None:
            if ledger.forwarded_records != records:
                metrics.forwarded_records.inc(ledger.forwarded_records - records)
                metrics.forwarded_bytes.inc(ledger.forwarded_bytes - size)
            self._publish_duplicates(ledger, metrics)
            metrics.in_flight_records.set(tracker.pending_records)
            oldest = tracker.oldest_pending_appended_ms
            age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000.0)
            metrics.oldest_unsent_age_seconds.set(age)
        self._forwarded = (ledger.forwarded_records, ledger.forwarded_bytes)

    def _publish_duplicates(self, ledger: DeliveryLedger, metrics: AgentMetrics) -> None:
        replay = ledger.replay
        for cause in DUPLICATE_CAUSES:
            for kind, counts, counter in (
                ("certain", replay.certain, metrics.replayed_duplicates),
                ("possible", replay.possible, metrics.possible_duplicates),
            ):
                now = counts[cause]
                before = self._duplicates.get((kind, cause), 0)
                if now != before:
                    counter.labels(cause=cause).inc(now - before)
                    self._duplicates[(kind, cause)] = now
