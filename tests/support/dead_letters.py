"""Refused batches for the dead-letter store's tests: a deleted topic's backlog, lettered."""

from __future__ import annotations

from durable_producer.buffer_agent.forward.dead_letter import RefusedBatch


def refused(wal_offset: int, payload: bytes = b"z" * 100) -> RefusedBatch:
    """The batch at ``wal_offset`` of orders/2, refused because the partition is gone."""
    return RefusedBatch(
        wal_offset=wal_offset,
        topic="orders",
        partition=2,
        payload=payload,
        reason="partition orders/2 does not exist (for 60 s)",
        error_code="UNKNOWN_TOPIC_OR_PARTITION",
    )
