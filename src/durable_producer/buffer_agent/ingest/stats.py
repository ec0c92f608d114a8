"""Counters of the Kafka-protocol listener (read by the agent's metrics and by tests)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass(slots=True)
class IngressStats:
    connections_total: int = 0
    connections_open: int = 0
    requests: int = 0
    batches_appended: int = 0
    records_appended: int = 0
    bytes_appended: int = 0
    duplicate_batches: int = 0
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)
    """Refused requests or partitions by reason (a Kafka error name or the refused API)."""
    dropped_connections: collections.Counter[str] = field(default_factory=collections.Counter)
    """Connections closed by the agent by reason (exception name, timeout, ...)."""
