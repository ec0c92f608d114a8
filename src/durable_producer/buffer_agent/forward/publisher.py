"""What the forwarder shows of itself: its figures for other threads, its metrics, its health.

``Publisher.publish`` runs at every turn of the forwarding loop. Records newly counted as
possible duplicates are logged, one line a pass that counted some: the log keeps the count
across kill -9 (the metric restarts from 0), and the line is written in the pass that counted
them, before the requests that carry them go out.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from durable_producer.buffer_agent.figures.metrics import DUPLICATE_CAUSES, AgentMetrics
from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.health import ForwarderHealth, ForwarderState
from durable_producer.buffer_agent.wal import WriteAheadLog

log = logging.getLogger(__name__)

POSSIBLE_DUPLICATES_LOG = "%d record(s) counted as possible duplicates (cause %s, %d this run)"
"""Logged when records are counted (tests sum the first figure over an agent's runs)."""


@dataclass(slots=True)
class ForwarderCounts:
    """Totals kept by the forwarding thread (read, never written, by others)."""

    forwarded_records: int = 0
    forwarded_bytes: int = 0
    dead_letters: int = 0
    possible: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DUPLICATE_CAUSES, 0))
    """Possible duplicates by cause: ``restart`` (the previous run's identity could not be
    used), ``reset`` (a partition moved to a new epoch)."""
    new_epochs: int = 0

    @property
    def possible_duplicates(self) -> int:
        """Possible duplicates of every cause."""
        return sum(self.possible.values())


@dataclass(frozen=True, slots=True)
class ForwarderStats:
    forwarded_records: int
    forwarded_bytes: int
    dead_letters: int
    producer_resets: int
    """Partitions moved to a new producer epoch (or id)."""
    in_flight_records: int
    watermark: int
    possible_duplicates: int = 0
    """Records sent again under a new epoch or id whose earlier copy's outcome was unknown."""


@dataclass(frozen=True, slots=True)
class DrainSummary:
    """What ``drain`` achieved: ``complete`` when everything up to ``target_offset`` is in Kafka."""

    complete: bool
    target_offset: int
    checkpoint_offset: int
    forwarded_records: int
    dead_letters: int
    elapsed_s: float
    possible_duplicates: int = 0


class Publisher:
    """Publishes one forwarder's figures. Forwarding thread only, except the attributes other
    threads read: ``watermark``."""

    def __init__(
        self, wal: WriteAheadLog, metrics: AgentMetrics | None, health: ForwarderHealth
    ) -> None:
        self._wal = wal
        self._metrics = metrics
        self._health = health
        self.watermark = wal.checkpoint_offset
        self._forwarded = (0, 0)
        self._possible = dict.fromkeys(DUPLICATE_CAUSES, 0)
        self._new_epochs = 0
        if metrics is not None:
            metrics.watch_forwarder(
                states=[state.value for state in ForwarderState],
                state=lambda: health.state().value,
                seconds_since_delivery=health.seconds_since_delivery,
                refused_records=lambda: health.refused_waiting,
            )

    def publish(self, tracker: AckTracker, counts: ForwarderCounts, refused_waiting: int) -> None:
        self.watermark = tracker.watermark
        health = self._health
        records, size = self._forwarded
        if counts.forwarded_records != records:
            health.delivered()
        health.beat(
            in_flight=tracker.pending_records,
            unread=max(0, self._wal.frames_end - tracker.next_offset),
            refused_waiting=refused_waiting,
        )
        health.check()
        metrics = self._metrics
        for cause, total in counts.possible.items():
            if total != self._possible[cause]:
                added = total - self._possible[cause]
                log.warning(POSSIBLE_DUPLICATES_LOG, added, cause, total)
                if metrics is not None:
                    metrics.possible_duplicates.labels(cause=cause).inc(added)
                self._possible[cause] = total
        if metrics is not None:
            if counts.forwarded_records != records:
                metrics.forwarded_records.inc(counts.forwarded_records - records)
                metrics.forwarded_bytes.inc(counts.forwarded_bytes - size)
            if counts.new_epochs != self._new_epochs:
                metrics.producer_resets.inc(counts.new_epochs - self._new_epochs)
                self._new_epochs = counts.new_epochs
            metrics.in_flight_records.set(tracker.pending_records)
            oldest = tracker.oldest_pending_appended_ms
            age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000.0)
            metrics.oldest_unsent_age_seconds.set(age)
        self._forwarded = (counts.forwarded_records, counts.forwarded_bytes)
