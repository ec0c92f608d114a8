"""Pure: pausing the reconciliation of one DurableProducer by annotation.

``operator.durable.dev/pause-reconciliation: "true"`` on a DurableProducer (as Strimzi's
``strimzi.io/pause-reconciliation``) makes the operator leave it alone: no status
reconciliation, no Spark templates, no volume-pool work (no release, drain or reclaim), and
deletion waits (the finalizer holds) until the annotation is removed. The webhook still
attaches agents and volumes to new pods: pausing never blocks a pod. The condition
``ReconciliationPaused`` says so; removing the annotation sets it to False and the next
reconcile catches up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from durable_producer.contract import PAUSE_ANNOTATION
from durable_producer.operator.decide import reconcile
from durable_producer.operator.model.conditions import (
    REASON_PAUSED,
    REASON_RESUMED,
    RECONCILIATION_PAUSED,
)

PAUSED_CONDITION = RECONCILIATION_PAUSED  # the condition and its reasons: conditions.py
PAUSED_MESSAGE = (
    f"{PAUSE_ANNOTATION} is \"true\": the operator does not reconcile this DurableProducer,"
    " maintain its volume pool or drain it on deletion (new pods still get agents); remove"
    " the annotation to resume"
)
RESUMED_MESSAGE = f"{PAUSE_ANNOTATION} was removed: reconciling again"


def is_paused(body: Mapping[str, Any]) -> bool:
    """Whether the DurableProducer carries the pause annotation set to "true"."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true"


def condition_is_stale(body: Mapping[str, Any]) -> bool:
    """Whether ReconciliationPaused disagrees with the annotation: paused without the
    condition True, or resumed with it still True (an annotation change kopf folded into a
    handling cycle that was already under way, so no handler saw it)."""
    conditions = (body.get("status") or {}).get("conditions") or []
    current = next((c for c in conditions if c.get("type") == PAUSED_CONDITION), None)
    shown = current is not None and current.get("status") == "True"
    return shown != is_paused(body)


def paused_conditions(
    conditions: Sequence[Mapping[str, Any]], paused: bool, generation: int | None, now: datetime
) -> list[dict[str, Any]] | None:
    """The conditions with ReconciliationPaused as ``paused`` says; None when nothing changes
    (never-paused objects get no such condition at all)."""
    current = next((c for c in conditions if c.get("type") == PAUSED_CONDITION), None)
    if paused:
        if current is not None and current.get("status") == "True":
            return None
        return reconcile.set_condition(
            conditions, PAUSED_CONDITION, "True", REASON_PAUSED, PAUSED_MESSAGE, generation, now
        )
    if current is None or current.get("status") != "True":
        return None
    return reconcile.set_condition(
        conditions, PAUSED_CONDITION, "False", REASON_RESUMED, RESUMED_MESSAGE, generation, now
    )


def resumed_status(
    desired: Mapping[str, Any], generation: int | None, now: datetime
) -> dict[str, Any]:
    """The desired status of a reconcile, with a ReconciliationPaused=True turned False."""
    conditions = paused_conditions(desired.get("conditions") or [], False, generation, now)
    return dict(desired) if conditions is None else {**desired, "conditions": conditions}
