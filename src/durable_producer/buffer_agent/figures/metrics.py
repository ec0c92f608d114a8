"""Prometheus metrics of the buffer agent (served by ``metrics_server.py``).

``AgentMetrics`` owns a dedicated ``CollectorRegistry`` (never the global one, so several
agents or tests can live in one process). ``metrics_server.MetricsServer`` serves ``/metrics``,
``/healthz`` (the process answers) and ``/readyz`` (a callable decides, e.g. "WAL open
and writable") from a background thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from durable_producer.buffer_agent.figures.drain_metrics import DrainMetrics

log = logging.getLogger(__name__)
PREFIX = "durable_agent"
DUPLICATE_CAUSES = ("restart", "reset")
ERROR_KINDS = ("delivery", "fatal", "transport")
REFUSAL_REASONS = ("buffer_limit", "disk_full", "wal_failed")
"""Why appends may be refused (``wal/health.py``: ``Refusal``)."""
FSYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.backlog_bytes = Gauge(
            f"{PREFIX}_backlog_bytes", "Bytes in the WAL not yet delivered to Kafka", registry=r
        )
        self.backlog_records = Gauge(
            f"{PREFIX}_backlog_records",
            "Records in the WAL at or above the checkpoint (not yet known to be in Kafka)",
            registry=r,
        )
        self.oldest_unsent_age_seconds = Gauge(
            f"{PREFIX}_oldest_unsent_age_seconds",
            "Age of the oldest record not yet acknowledged by Kafka (0 when none)",
            registry=r,
        )
        self.runway_seconds = Gauge(
            f"{PREFIX}_runway_seconds",
            "Seconds until the buffer is full at the current net fill rate (+Inf if draining)",
            registry=r,
        )
        self.buffer_free_bytes = Gauge(
            f"{PREFIX}_buffer_free_bytes", "Bytes the WAL may still grow by", registry=r
        )
        self.ingest_records = Counter(
            f"{PREFIX}_ingest_records", "Records accepted into the WAL", registry=r
        )
        self.ingest_bytes = Counter(
            f"{PREFIX}_ingest_bytes", "Record batch bytes accepted into the WAL", registry=r
        )
        self.forwarded_records = Counter(
            f"{PREFIX}_forwarded_records", "Records acknowledged by Kafka", registry=r
        )
        self.forwarded_bytes = Counter(
            f"{PREFIX}_forwarded_bytes",
            "Record batch bytes (as stored in the WAL) of frames fully acknowledged by Kafka",
            registry=r,
        )
        self.fsync_seconds = Histogram(
            f"{PREFIX}_fsync_seconds", "Duration of WAL fsyncs", buckets=FSYNC_BUCKETS, registry=r
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters",
            "Records moved to the dead-letter area (in whole batches; an undecodable batch"
            " counts as one)",
            ["reason"],
            registry=r,
        )
        self.quarantined_segments = Gauge(
            f"{PREFIX}_quarantined_segments",
            "WAL segments moved aside as corrupt",
            registry=r,
        )
        self.in_flight_records = Gauge(
            f"{PREFIX}_in_flight_records",
            "Records handed to the Kafka client and awaiting a delivery report",
            registry=r,
        )
        self.checkpoint_offset = Gauge(
            f"{PREFIX}_checkpoint_offset", "Lowest WAL offset not yet delivered", registry=r
        )
        self.producer_resets = Counter(
            f"{PREFIX}_producer_resets",
            "Kafka producer re-creations followed by a replay from the watermark",
            registry=r,
        )
        self.buffer_limit_bytes = Gauge(
            f"{PREFIX}_buffer_limit_bytes",
            "The WAL's size limit in effect (--max-buffer-bytes, lowered to fit the volume)",
            registry=r,
        )
        self.volume_free_bytes = Gauge(
            f"{PREFIX}_volume_free_bytes",
            "Bytes the agent may still write on its volume (statvfs f_bavail)",
            registry=r,
        )
        self.refusing_appends = Gauge(
            f"{PREFIX}_refusing_appends",
            "1 while produce requests are refused for this reason: buffer_limit (the WAL is at"
            " its limit), disk_full (the volume is full), wal_failed (an fsync failed; accepting"
            " resumes once what was written before it is in Kafka)",
            ["reason"],
            registry=r,
        )
        for reason in REFUSAL_REASONS:
            self.refusing_appends.labels(reason=reason).set(0)
        self.write_errors = Counter(
            f"{PREFIX}_write_errors",
            "Failed writes of the agent's files (checkpoint, hint, dead_letter); each is"
            " retried later",
            ["file"],
            registry=r,
        )

        # -------------------------------------------- ingest limits and batch validation
        self.ingest_invalid_batches = Counter(
            f"{PREFIX}_ingest_invalid_batches",
            "Record batches refused before acknowledgement as invalid (CRC, codec,"
            " decompression, record count, records), by what was wrong; none is stored",
            ["reason"],
            registry=r,
        )
        self.ingest_connections = Gauge(
            f"{PREFIX}_ingest_connections",
            "Client connections open on the Kafka listener",
            registry=r,
        )
        self.ingest_refused_connections = Counter(
            f"{PREFIX}_ingest_refused_connections",
            "Connections closed on arrival because --max-connections were open",
            registry=r,
        )
        self.ingest_dropped_connections = Counter(
            f"{PREFIX}_ingest_dropped_connections",
            "Connections the agent closed: timeout (idle, or a request not complete within"
            " --request-read-timeout), malformed or unsupported requests, errors",
            ["reason"],
            registry=r,
        )
        self.ingest_request_memory_bytes = Gauge(
            f"{PREFIX}_ingest_request_memory_bytes",
            "Bytes of requests held (being received or processed), of --max-request-memory-bytes",
            registry=r,
        )
        self.ingest_request_memory_waits = Counter(
            f"{PREFIX}_ingest_request_memory_waits",
            "Times a connection stopped reading until request memory was free",
            registry=r,
        )
        self._ingest_seen: dict[str, float] = {}

        self._fill_rate = RateEstimator()
        self.drain = DrainMetrics(r)
        self._init_wal_recovery()
        self._add_forwarder_fault_metrics()

    # ----------------------------------------------------------------- WAL recovery
    def _init_wal_recovery(self) -> None:
        r = self.registry
        self.wal_lost_frames = Gauge(
            f"{PREFIX}_wal_lost_frames",
            "WAL frames (produce batches) lost to damage on the volume, as recorded in "
            "wal/quarantine/ (0 unless a disk returned corrupted bytes)",
            registry=r,
        )
        self.state_files_damaged = Gauge(
            f"{PREFIX}_state_files_damaged",
            "state files (producer ids, metadata cache, producer state, forwarding producer"
            " identity) found unusable at start: each was moved aside to NAME.damaged and"
            " rebuilt",
            registry=r,
        )
        self.wal_torn_tail_bytes = Gauge(
            f"{PREFIX}_wal_torn_tail_bytes",
            "Bytes of a torn last frame truncated when the WAL was opened (a crash mid-write)",
            registry=r,
        )
        self.wal_ignored_files = Gauge(
            f"{PREFIX}_wal_ignored_files",
            "Entries of the WAL directory that are not WAL files, left alone (see the log)",
            registry=r,
        )

    def record_state_damage(self, damage: Sequence[object]) -> None:
        """State files found unusable at start (each fell back and was moved aside)."""
        self.state_files_damaged.set(len(damage))

    def record_wal_recovery(self, found: WalRecoveryFigures) -> None:
        """Set the figures of what opening the WAL found (once, after the WAL is open)."""
        self.quarantined_segments.set(found.quarantined_segments)
        self.wal_lost_frames.set(found.lost_frames)
        self.wal_torn_tail_bytes.set(found.torn_tail_bytes)
        self.wal_ignored_files.set(found.ignored_files)

    # ----------------------------------------------------------------- forwarder faults
    def _add_forwarder_fault_metrics(self) -> None:
        """Which fault the forwarder is in, what Kafka said, and the duplicates it cost
        (``forward/health.py``, ``forward/publisher.py``)."""
        r = self.registry
        self.replayed_duplicates = Counter(
            f"{PREFIX}_replayed_duplicates",
            "Always 0 since the batch forwarder, kept for dashboards: a record Kafka had"
            " acknowledged that is sent again under a new producer id or epoch cannot be told"
            " from one whose outcome was unknown, and counts in possible_duplicates",
            ["cause"],
            registry=r,
        )
        self.possible_duplicates = Counter(
            f"{PREFIX}_possible_duplicates",
            "Records sent again (cause: restart, reset) whose earlier copy's outcome was"
            " unknown (in flight, timed out): each one may be a duplicate in Kafka",
            ["cause"],
            registry=r,
        )
        for cause in DUPLICATE_CAUSES:
            self.replayed_duplicates.labels(cause=cause)
            self.possible_duplicates.labels(cause=cause)
        self.kafka_errors = Counter(
            f"{PREFIX}_kafka_errors",
            "Errors the forwarder's Kafka client reported, by kind (delivery: records"
            " refused; transport: connections, timeouts; fatal: no longer reported)"
            " and error name",
            ["kind", "error"],
            registry=r,
        )
        self.kafka_last_error_code = Gauge(
            f"{PREFIX}_kafka_last_error_code",
            "Kafka error code of the latest error of each kind (0: none yet; a failed"
            " connection 13 NETWORK_EXCEPTION, a timeout 7 REQUEST_TIMED_OUT)",
            ["kind"],
            registry=r,
        )
        for kind in ERROR_KINDS:
            self.kafka_last_error_code.labels(kind=kind).set(0)
        self.seconds_since_last_delivery = Gauge(
            f"{PREFIX}_seconds_since_last_delivery",
            "Seconds since Kafka last acknowledged a record to the forwarder (since the"
            " forwarder started, if it never did)",
            registry=r,
        )
        self.forwarder_state = Gauge(
            f"{PREFIX}_forwarder_state",
            "1 for the forwarder's current state: idle, delivering, kafka_unreachable,"
            " kafka_refusing, waiting_for_kafka, stuck (docs/runbook.md)",
            ["state"],
            registry=r,
        )
        self.refused_records = Gauge(
            f"{PREFIX}_refused_records",
            "Records Kafka refused that wait to be produced again (dead-lettered once refused"
            " for --dead-letter-after seconds)",
            registry=r,
        )

    def count_kafka_error(self, kind: str, code: int, name: str) -> None:
        self.kafka_errors.labels(kind=kind, error=name).inc()
        self.kafka_last_error_code.labels(kind=kind).set(code)

    def watch_forwarder(
        self,
        *,
        states: Sequence[str],
        state: Callable[[], str],
        seconds_since_delivery: Callable[[], float],
        refused_records: Callable[[], int],
    ) -> None:
        """Compute the forwarder's gauges when scraped (a wedged forwarding thread cannot
        keep stale values alive)."""
        for name in states:
            self.forwarder_state.labels(state=name).set_function(
                lambda name=name: 1.0 if state() == name else 0.0  # type: ignore[misc]
            )
        self.seconds_since_last_delivery.set_function(seconds_since_delivery)
        self.refused_records.set_function(lambda: float(refused_records()))

    def publish_ingest(self, figures: IngestFigures) -> None:
        """Copy the listener's cumulative figures into the ingest metrics."""
        self.ingest_connections.set(figures.connections_open)
        self.ingest_request_memory_bytes.set(figures.request_memory_bytes)
        self._advance(self.ingest_refused_connections, "refused", figures.refused_connections)
        self._advance(self.ingest_request_memory_waits, "waits", figures.request_memory_waits)
        for reason, count in figures.invalid_batches.items():
            self._advance(self.ingest_invalid_batches.labels(reason), f"invalid:{reason}", count)
        for reason, count in figures.dropped_connections.items():
            counter = self.ingest_dropped_connections.labels(reason)
            self._advance(counter, f"dropped:{reason}", count)

    def _advance(self, counter: Counter, key: str, total: float) -> None:
        """Bring ``counter`` up to the cumulative ``total`` last published under ``key``."""
        delta = total - self._ingest_seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._ingest_seen[key] = total

    def refresh_buffer(
        self,
        *,
        size_bytes: int,
        max_bytes: int,
        quarantined_segments: int,
        backlog_records: int | None = None,
        refusing: str | None = None,
        now: float | None = None,
        net_fill_bytes_per_s: float | None = None,
    ) -> float:
        """Update the buffer gauges from a WAL snapshot (call every second or so).

        Runway uses the smoothed growth rate of the WAL itself: ingest and forward byte
        counters measure different things (compressed batches in, key and value bytes out),
        so their difference is not how fast the disk fills. ``size_bytes`` counts whole
        segments: up to one segment of already delivered frames is included in the backlog.
        ``net_fill_bytes_per_s``, when given, replaces that estimate: the agent passes ingest
        less the forward rate measured under load (``forward_rate.py``), which neither
        whole-segment deletions nor a forwarder that merely keeps up make noisy.
        Returns the runway in seconds.
        """
        net_fill = self._fill_rate.update(size_bytes, now)
        if net_fill_bytes_per_s is not None:
            net_fill = net_fill_bytes_per_s
        free = max(0, max_bytes - size_bytes)
        runway = runway_seconds(free, net_fill)
        self.backlog_bytes.set(size_bytes)
        self.buffer_free_bytes.set(free)
        self.runway_seconds.set(runway)
        self.quarantined_segments.set(quarantined_segments)
        self.buffer_limit_bytes.set(max_bytes)
        for reason in REFUSAL_REASONS:
            self.refusing_appends.labels(reason=reason).set(1 if reason == refusing else 0)
        if backlog_records is not None:
            self.backlog_records.set(backlog_records)
        return runway

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WalRecoveryFigures(Protocol):
    """What opening the WAL found (``wal.recovery.repair.RecoverySummary``)."""

    @property
    def quarantined_segments(self) -> int: ...

    @property
    def lost_frames(self) -> int: ...

    @property
    def torn_tail_bytes(self) -> int: ...

    @property
    def ignored_files(self) -> int: ...


class IngestFigures(Protocol):
    """What ``publish_ingest`` reads: the listener's counters (``ingest.stats``)."""

    @property
    def connections_open(self) -> int: ...
    @property
    def refused_connections(self) -> int: ...
    @property
    def request_memory_bytes(self) -> int: ...
    @property
    def request_memory_waits(self) -> int: ...
    @property
    def invalid_batches(self) -> Mapping[str, int]: ...
    @property
    def dropped_connections(self) -> Mapping[str, int]: ...


def runway_seconds(free_bytes: int, net_fill_bytes_per_s: float) -> float:
    """Time until ``free_bytes`` are used up at the net fill rate; ``inf`` when not filling."""
    if net_fill_bytes_per_s <= 0:
        return math.inf
    return max(0.0, free_bytes) / net_fill_bytes_per_s


class RateEstimator:
    """Per-second rate of a monotonically growing total, smoothed exponentially.

    ``half_life_s`` sets how fast old observations fade; the first update gives 0.
    """

    def __init__(self, half_life_s: float = 10.0) -> None:
        self._half_life = half_life_s
        self._last_total: float | None = None
        self._last_time = 0.0
        self.rate = 0.0

    def update(self, total: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self._last_total is None:
            self._last_total, self._last_time = total, now
            return self.rate
        elapsed = now - self._last_time
        if elapsed <= 0:
            return self.rate
        instant = (total - self._last_total) / elapsed
        weight = 1.0 - 0.5 ** (elapsed / self._half_life)
        self.rate += weight * (instant - self.rate)
        self._last_total, self._last_time = total, now
        return self.rate
