"""The agent's gauges of ingest and sustained forward rates, time to drain, "cannot drain".

The figures come from ``forward_rate.DrainOutlook`` (measured, never configured); the
names the operator scrapes are the contract's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from durable_producer.contract import CANNOT_DRAIN_METRIC, FORWARD_RATE_METRICS, INGEST_RATE_METRICS


class DrainMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        window = "over the last 30 s"
        self.ingest_records = Gauge(
            INGEST_RATE_METRICS[0], f"Records accepted per second {window}", registry=r
        )
        self.ingest_bytes = Gauge(
            INGEST_RATE_METRICS[1], f"WAL bytes accepted per second {window}", registry=r
        )
        sustained = (
            "sustained under load: while WAL frames waited for the Kafka client and Kafka"
            " delivered (the last such measurement; 0 until there was one)"
        )
        self.forward_records = Gauge(
            FORWARD_RATE_METRICS[0], f"Records forwarded per second, {sustained}", registry=r
        )
        self.forward_bytes = Gauge(
            FORWARD_RATE_METRICS[1], f"WAL bytes forwarded per second, {sustained}", registry=r
        )
        self.cannot_drain = Gauge(
            CANNOT_DRAIN_METRIC,
            "1 while ingest exceeds the sustained forward rate and the backlog grows: it can"
            " never drain at these rates (docs/runbook.md)",
            registry=r,
        )
        self.time_to_drain = Gauge(
            "durable_agent_time_to_drain_seconds",
            "Seconds until the backlog is forwarded at the sustained forward rate while ingest"
            " goes on (after Kafka returns, in an outage); 0 keeping up, +Inf cannot drain,"
            " NaN not measured yet",
            registry=r,
        )

    def refresh(
        self,
        *,
        ingest: tuple[float, float],
        forward: tuple[float, float],
        cannot_drain: bool,
        time_to_drain_s: float,
    ) -> None:
        """``ingest`` and ``forward``: (records/s, bytes/s)."""
        self.ingest_records.set(ingest[0])
        self.ingest_bytes.set(ingest[1])
        self.forward_records.set(forward[0])
        self.forward_bytes.set(forward[1])
        self.cannot_drain.set(1.0 if cannot_drain else 0.0)
        self.time_to_drain.set(time_to_drain_s)
