"""What the pool timer publishes in a DurableProducer's status (pure).

Attached pods, volumes by state, the agents' backlog, and a Degraded condition (with Warning
events) while the pool has problems: volumes stuck Pending, failed drains, pods running
without an agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_producer.operator import overrides, pod_mutation, reconcile
from durable_producer.operator.kube_objects import Object, name_of
from durable_producer.operator.volume_pool import FINISHED_POD_PHASES, PoolPlan, VolumeState

REASON_POOL_PROBLEM = "VolumePoolProblem"

@dataclass(frozen=True)
class PoolStatusUpdate:
    """The status merge patch (empty when nothing changed) and the Warning events to post."""

    changes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def status_volume_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """``PoolPlan.counts`` (keyed by VolumeState) as ``status.volumes`` (camelCase keys)."""
    keys = {
        VolumeState.IN_USE: "inUse",
        VolumeState.CLAIMED: "claimed",
        VolumeState.FREE: "free",
        VolumeState.DRAINING: "draining",
    }
    return {key: int(counts.get(state.value, 0)) for state, key in keys.items()}


def pods_without_agent(pods: Iterable[Object]) -> list[str]:
    """Names of running opted-in pods that have no agent (admitted while the webhook was down);
    pods that opted out by annotation (overrides.opted_out) are meant to run without one."""
    return sorted(
        name_of(pod)
        for pod in pods
        if (pod.get("status") or {}).get("phase") == "Running"
        and not pod_mutation.is_injected(pod)
        and not overrides.opted_out(pod)
    )


def attached_pods(pods: Iterable[Object]) -> int:
    return sum(
        1
        for pod in pods
        if pod_mutation.is_injected(pod)
        and (pod.get("status") or {}).get("phase") not in FINISHED_POD_PHASES
    )


def pool_problems(plan: PoolPlan, pods: Iterable[Object]) -> list[str]:
    """The plan's problems, and the audit's: opted-in pods running without an agent."""
    problems = list(plan.problems)
    missing = pods_without_agent(pods)
    if missing:
        problems.append(
            f"pods running without a buffer agent (admitted while the webhook was"
            f" unavailable?): {', '.join(missing)}; recreate them"
        )
    return problems


def degraded_conditions(
    current: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]],
    problems: Sequence[str],
    reason: str,
    now: datetime,
) -> list[dict[str, Any]] | None:
    """The conditions with Degraded reflecting pool problems, or None when nothing changes.

    ``baseline`` holds the conditions the spec alone gives (reconcile.desired_status): its
    Degraded message (e.g. a short runway) is kept next to the pool problems, and it is what
    Degraded returns to once the problems are gone. Only a Degraded we set is ever cleared.
    """
    degraded = next((c for c in current if c.get("type") == reconcile.DEGRADED), None)
    ours = degraded is not None and degraded.get("reason") == reason
    base = next((c for c in baseline if c.get("type") == reconcile.DEGRADED), None)
    if problems:
        messages = list(problems)
        if base is not None and base.get("status") == "True" and base.get("message"):
            messages.append(str(base["message"]))
        message = "; ".join(messages)
        if ours and degraded is not None and degraded.get("message") == message:
            return None
        return reconcile.set_condition(
            current, reconcile.DEGRADED, "True", reason, message, None, now
        )
    if not ours or base is None:
        return None
    return reconcile.set_condition(
        current,
        reconcile.DEGRADED,
        str(base.get("status")),
        str(base.get("reason")),
        str(base.get("message") or ""),
        base.get("observedGeneration"),
        now,
    )


def pool_status_update(
    producer: Object,
    plan: PoolPlan,
    pods: Sequence[Object],
    backlog: int | None,
    now: datetime,
) -> PoolStatusUpdate:
    """The status changes for what the pool timer found; Warning events while Degraded is ours.

    ``backlog`` is None when no agent answered (then the last known figure stays).
    """
    status = producer.get("status") or {}
    changes: dict[str, Any] = {}
    if backlog is not None and status.get("backlogBytes") != backlog:
        changes["backlogBytes"] = backlog
    attached = attached_pods(pods)
    if status.get("attachedPods") != attached:
        changes["attachedPods"] = attached
    volumes = status_volume_counts(plan.counts)
    if status.get("volumes") != volumes:
        changes["volumes"] = volumes
    problems = pool_problems(plan, pods)
    generation = (producer.get("metadata") or {}).get("generation")
    # What the spec alone says about Degraded (e.g. a short runway), to keep or restore it.
    baseline = reconcile.desired_status(producer.get("spec"), status, generation, now)
    conditions = degraded_conditions(
        status.get("conditions") or [],
        baseline.status.get("conditions") or [],
        problems,
        REASON_POOL_PROBLEM,
        now,
    )
    if conditions is None:
        return PoolStatusUpdate(changes)
    changes["conditions"] = conditions
    degraded = next(c for c in conditions if c["type"] == reconcile.DEGRADED)
    warnings = problems if degraded["reason"] == REASON_POOL_PROBLEM else []
    return PoolStatusUpdate(changes, list(warnings))
