"""Counters of the Kafka-protocol listener (read by the agent's metrics and by tests)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass(slots=True)
class IngestStats:
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
    invalid_batches: collections.Counter[str] = field(default_factory=collections.Counter)
    """Record batches refused as invalid, by what was wrong (``InvalidRecordBatch.reason``);
    also counted in ``refusals`` under the Kafka error answered."""
    refused_connections: int = 0
    """Connections closed on arrival because ``max_connections`` were open."""
    request_memory_bytes: int = 0
    """Bytes of request buffers held now (received, not yet processed)."""
    request_memory_waits: int = 0
    """Times a connection stopped reading because the request memory budget was used up."""
