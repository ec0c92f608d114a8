"""The BacklogCannotDrain condition from the agents' figures (agent_figures, pool_status)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_producer.contract import (
    BACKLOG_METRIC,
    CANNOT_DRAIN_METRIC,
    FORWARD_RATE_METRICS,
    INGEST_RATE_METRICS,
)
from durable_producer.operator.decide import agent_figures, pool_status
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.model.installation import PoolPolicy

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PoolPolicy()


def exposition(backlog: int, cannot_drain: bool, ingest: float, forward: float) -> str:
    return "\n".join(
        [
            f"# HELP {BACKLOG_METRIC} bytes",
            f"{BACKLOG_METRIC} {backlog}.0",
            f"{CANNOT_DRAIN_METRIC} {1.0 if cannot_drain else 0.0}",
            f"{INGEST_RATE_METRICS[0]} {ingest}",
            f"{INGEST_RATE_METRICS[1]} {ingest * 200}",
            f"{FORWARD_RATE_METRICS[0]} {forward}",
            f"{FORWARD_RATE_METRICS[1]} {forward * 200}",
        ]
    )


READY = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": ""}


def producer(conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A DurableProducer whose generation the reconcile handler has written, with
    ``conditions``."""
    return {
        "metadata": {"name": "orders", "generation": 3},
        "spec": {
            "kafka": {"bootstrapServers": ["k:9092"]},
            "throughput": {"peakBytesPerSecond": 1},
        },
        "status": {"observedGeneration": 3, "conditions": [READY, *(conditions or [])]},
    }


def condition(update: pool_status.PoolStatusUpdate) -> dict[str, Any]:
    return next(c for c in update.changes["conditions"] if c["type"] == "BacklogCannotDrain")


def test_the_agents_figures_are_parsed_and_summed() -> None:
    figures = agent_figures.agent_figures(
        {
            "http://a/metrics": exposition(100, True, 13_000, 10_000),
            "http://b/metrics": exposition(50, False, 1_000, 0),
        }
    )
    assert figures.answered == 2 and figures.backlog_bytes == 150
    (slow,) = figures.cannot_drain
    assert slow.agent == "http://a/metrics"
    assert slow.ingest == (13_000, 2_600_000) and slow.forward == (10_000, 2_000_000)
    assert agent_figures.parse_backlog_bytes(exposition(7, False, 0, 0)) == 7


def test_condition_appears_with_both_rates_and_clears() -> None:
    plan = vp.plan_pool([], [], [], NOW, POLICY)
    slow = agent_figures.agent_figures({"pod-a": exposition(100, True, 13_000, 10_000)})
    update = pool_status.pool_status_update(producer(), plan, [], 100, NOW, slow)
    cannot = condition(update)
    assert (cannot["status"], cannot["reason"]) == ("True", "IngestAboveForwardRate")
    assert "13,000 records/s (2.60 MB/s)" in cannot["message"]
    assert "10,000 records/s (2.00 MB/s)" in cannot["message"]
    assert cannot["observedGeneration"] == 3

    written = update.changes["conditions"][1:]  # the pool timer's own: Degraded too
    again = pool_status.pool_status_update(producer(written), plan, [], 100, NOW, slow)
    assert "conditions" not in again.changes, "same figures: no patch"

    fine = agent_figures.agent_figures({"pod-a": exposition(100, False, 6_000, 10_000)})
    cleared = condition(
        pool_status.pool_status_update(producer([cannot]), plan, [], 100, NOW, fine)
    )
    assert (cleared["status"], cleared["reason"]) == ("False", "ForwardingKeepsUp")

    nobody = agent_figures.agent_figures({})
    unknown = condition(
        pool_status.pool_status_update(producer([cannot]), plan, [], None, NOW, nobody)
    )
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "NoAgentFigures")


def test_without_figures_the_condition_is_left_alone() -> None:
    plan = vp.plan_pool([], [], [], NOW, POLICY)
    update = pool_status.pool_status_update(producer(), plan, [], None, NOW)
    assert not any(
        c["type"] == "BacklogCannotDrain" for c in update.changes.get("conditions", [])
    )


def test_before_the_first_reconcile_the_conditions_are_left_to_it() -> None:
    """The pool timer's first run may see the object as created (no status yet): writing the
    conditions list from there would replace the Ready condition the reconcile handler wrote
    meanwhile (a merge patch replaces a list)."""
    plan = vp.plan_pool([], [], [], NOW, POLICY)
    created = {**producer(), "status": {}}
    nobody = agent_figures.agent_figures({})
    update = pool_status.pool_status_update(created, plan, [], None, NOW, nobody)
    assert "conditions" not in update.changes


def test_while_reconcile_catches_up_with_a_new_generation_the_conditions_wait() -> None:
    """A view from before reconcile wrote the new generation's status (e.g. just after a
    pause ended) must not write back the conditions it holds."""
    plan = vp.plan_pool([], [], [], NOW, POLICY)
    behind = producer()
    behind["metadata"]["generation"] = 4
    slow = agent_figures.agent_figures({"pod-a": exposition(100, True, 13_000, 10_000)})
    update = pool_status.pool_status_update(behind, plan, [], 100, NOW, slow)
    assert "conditions" not in update.changes
