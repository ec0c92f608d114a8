"""The fixed "now" the operator's decide tests reason about, and timestamps before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from durable_producer.operator.decide.kube_objects import format_time

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> str:
    """The Kubernetes timestamp ``seconds`` before ``NOW``."""
    return format_time(NOW - timedelta(seconds=seconds))
