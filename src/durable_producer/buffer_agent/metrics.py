"""Prometheus metrics of the buffer agent and the HTTP endpoints that serve them.

``AgentMetrics`` owns a dedicated ``CollectorRegistry`` (never the global one, so several
agents or tests can live in one process). ``MetricsServer`` serves ``/metrics``,
``/healthz`` (the process answers) and ``/readyz`` (a callable decides, e.g. "WAL open
and writable") from a background thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

PREFIX = "durable_agent"
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
        self.replayed_duplicates = Counter(
            f"{PREFIX}_replayed_duplicates",
            "Records sent again after a restart or producer reset that Kafka may already"
            " hold (a conservative count of possible duplicates)",
            registry=r,
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters",
            "Records (or undecodable batches) moved to the dead-letter area",
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

        self._fill_rate = RateEstimator()

    def refresh_buffer(
        self,
        *,
        size_bytes: int,
        max_bytes: int,
        quarantined_segments: int,
        backlog_records: int | None = None,
        refusing: str | None = None,
        now: float | None = None,
    ) -> float:
        """Update the buffer gauges from a WAL snapshot (call every second or so).

        Runway uses the smoothed growth rate of the WAL itself: ingest and forward byte
        counters measure different things (compressed batches in, key and value bytes out),
        so their difference is not how fast the disk fills. ``size_bytes`` counts whole
        segments: up to one segment of already delivered frames is included in the backlog.
        Returns the runway in seconds.
        """
        net_fill = self._fill_rate.update(size_bytes, now)
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


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread; port 0 picks one.

    The agent's address comes from its settings (``--metrics-listen``)."""

    def __init__(
        self,
        metrics: AgentMetrics,
        *,
        host: str,
        port: int = 0,
        ready: Callable[[], bool] = lambda: True,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        handler = _make_handler(metrics, ready, alive)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _make_handler(
    metrics: AgentMetrics, ready: Callable[[], bool], alive: Callable[[], bool]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._probe(alive)
            elif path == "/readyz":
                self._probe(ready)
            else:
                self._reply(404, b"not found\n")

        def _probe(self, check: Callable[[], bool]) -> None:
            try:
                ok = bool(check())
            except Exception as error:  # a failing check means "not ready", with the reason
                self._reply(503, f"error: {error}\n".encode())
                return
            self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n")

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes every few seconds would flood the log."""

    return Handler
