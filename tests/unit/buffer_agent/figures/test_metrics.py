"""Metrics: runway and rate arithmetic, and the HTTP endpoints on a real socket."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

import pytest

from durable_producer.buffer_agent.figures.metrics import (
    AgentMetrics,
    RateEstimator,
    runway_seconds,
)
from durable_producer.buffer_agent.figures.metrics_server import MetricsServer


def test_runway_is_free_space_over_net_fill_rate() -> None:
    assert runway_seconds(1_000_000, 10_000.0) == pytest.approx(100.0)
    assert runway_seconds(1_000_000, -10_000.0) == math.inf
    assert runway_seconds(1_000_000, 0.0) == math.inf
    assert runway_seconds(0, 1.0) == 0.0


def test_rate_estimator_converges_to_a_steady_rate() -> None:
    estimator = RateEstimator(half_life_s=1.0)
    assert estimator.update(0, now=0.0) == 0.0
    for second in range(1, 30):
        estimator.update(second * 500, now=float(second))
    assert estimator.rate == pytest.approx(500.0, rel=1e-3)


def test_metrics_use_a_private_registry() -> None:
    first, second = AgentMetrics(), AgentMetrics()
    first.forwarded_records.inc(3)
    assert b"durable_agent_forwarded_records_total 3.0" in first.render()
    assert b"durable_agent_forwarded_records_total 0.0" in second.render()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_endpoints_report_metrics_health_and_readiness() -> None:
    metrics = AgentMetrics()
    metrics.dead_letters.labels(reason="MSG_SIZE_TOO_LARGE").inc()
    metrics.fsync_seconds.observe(0.003)
    readiness = {"ready": False}
    with MetricsServer(metrics, host="127.0.0.1", ready=lambda: readiness["ready"]) as server:
        base = f"http://127.0.0.1:{server.port}"
        status, body = _get(base + "/metrics")
        assert status == 200
        assert b'durable_agent_dead_letters_total{reason="MSG_SIZE_TOO_LARGE"} 1.0' in body
        assert b'durable_agent_fsync_seconds_bucket{le="0.005"} 1.0' in body
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz") == (503, b"not ready\n")
        readiness["ready"] = True
        assert _get(base + "/readyz") == (200, b"ok\n")
        assert _get(base + "/nothing")[0] == 404


def test_refresh_buffer_derives_runway_from_how_fast_the_wal_grows() -> None:
    metrics = AgentMetrics()
    limits = {"max_bytes": 301_000, "quarantined_segments": 1}
    assert metrics.refresh_buffer(size_bytes=1_000, **limits, now=0.0) == math.inf
    for second in range(1, 200):
        size = 1_000 + 1_000 * second
        runway = metrics.refresh_buffer(
            size_bytes=size, **limits, backlog_records=42, now=float(second)
        )
    assert runway == pytest.approx(101.0, rel=0.01), "101 kB free, filling at 1 kB/s"
    sample = metrics.registry.get_sample_value
    assert sample("durable_agent_runway_seconds") == runway
    assert sample("durable_agent_buffer_free_bytes") == 101_000
    assert sample("durable_agent_backlog_bytes") == 200_000
    for second in range(200, 400):
        runway = metrics.refresh_buffer(size_bytes=1_000, **limits, now=float(second))
    assert runway == math.inf, "a draining buffer has unlimited runway"
    assert sample("durable_agent_backlog_records") == 42
    assert sample("durable_agent_quarantined_segments") == 1


def test_every_scrape_first_brings_the_periodic_figures_up_to_date() -> None:
    metrics = AgentMetrics()
    stored = [0]

    def publish() -> None:  # as the agent's StatsPublisher: copy a live count into a counter
        metrics.ingest_records.inc(stored[0] - metrics.ingest_records._value.get())

    with MetricsServer(metrics, host="127.0.0.1", before_scrape=publish) as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        stored[0] = 1234
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    assert "durable_agent_ingest_records_total 1234.0" in body
