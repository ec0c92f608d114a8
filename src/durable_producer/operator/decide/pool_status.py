"""What the pool timer and the delete handler publish in a DurableProducer's status (pure).

Attached pods, volumes by state and by size (what is deployed), the runway of the smallest
volume in use, the agents' backlog, and a Degraded condition (with Warning events) while the
pool has problems: volumes stuck Pending, failed drains, pods running without an agent. While
the DurableProducer is being deleted: a Deleting condition saying what the deletion waits for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_producer.operator.decide import overrides, pod_mutation, reconcile
from durable_producer.operator.decide.agent_figures import AgentFigures
from durable_producer.operator.decide.kube_objects import FINISHED_POD_PHASES, Object, name_of
from durable_producer.operator.decide.volume_pool import (
    ABANDON_ANNOTATION,
    VOLUME_FINALIZER,
    PoolPlan,
    VolumeState,
    VolumeSummary,
)
from durable_producer.operator.model.conditions import (
    BACKLOG_CANNOT_DRAIN,
    DEGRADED,
    DELETING,
    READY,
    REASON_BACKLOG_HELD,
    REASON_DRAINING,
    REASON_FORWARDING_KEEPS_UP,
    REASON_INGEST_ABOVE_FORWARD_RATE,
    REASON_NO_AGENT_FIGURES,
    REASON_POOL_PROBLEM,
    capped_message,
)
from durable_producer.operator.model.quantities import format_bytes

__all__ = ["REASON_POOL_PROBLEM", "PoolStatusUpdate", "pool_status_update"]

_STATE_KEYS = {
    VolumeState.IN_USE: "inUse",
    VolumeState.CLAIMED: "claimed",
    VolumeState.FREE: "free",
    VolumeState.DRAINING: "draining",
}


@dataclass(frozen=True)
class PoolStatusUpdate:
    """The status merge patch (empty when nothing changed) and the Warning events to post."""

    changes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    message: str = ""


def status_volume_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """``PoolPlan.counts`` (keyed by VolumeState) as ``status.volumes`` (camelCase keys)."""
    return {key: int(counts.get(state.value, 0)) for state, key in _STATE_KEYS.items()}


def deployed_volumes(volumes: Iterable[VolumeSummary]) -> list[dict[str, Any]]:
    """``status.deployedVolumes``: the pool grouped by size and class, counted by state."""
    groups: dict[tuple[int, str, bool], dict[str, Any]] = {}
    for volume in volumes:
        if volume.size_bytes is None:
            continue
        key = (volume.size_bytes, volume.storage_class or "", volume.fits)
        if key not in groups:
            group: dict[str, Any] = {"size": format_bytes(volume.size_bytes)}
            if volume.storage_class:
                group["storageClassName"] = volume.storage_class
            group["fitsSpec"] = volume.fits
            groups[key] = group | {name: 0 for name in _STATE_KEYS.values()}
        groups[key][_STATE_KEYS[volume.state]] += 1
    return [groups[key] for key in sorted(groups)]


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


def held_message(held: Iterable[str]) -> str:
    """Why volumes are held, and the two ways out."""
    names = sorted(set(held))
    return (
        f"{len(names)} buffer volume(s) may hold data not yet forwarded to Kafka and cannot be"
        f" drained (deleted, or no drain Job may be created): {', '.join(names)}; they are kept"
        f" (finalizer {VOLUME_FINALIZER}). To keep the data, recover them (docs/runbook.md); to"
        f" let them go without forwarding it, annotate the DurableProducer"
        f" {ABANDON_ANNOTATION}=true"
    )


def pool_problems(plan: PoolPlan, pods: Iterable[Object]) -> list[str]:
    """The plan's problems, and the audit's: opted-in pods running without an agent."""
    problems = list(plan.problems)
    if plan.held:
        problems.append(held_message(plan.held))
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
    generation: int | None = None,
) -> list[dict[str, Any]] | None:
    """The conditions with Degraded reflecting pool problems, or None when nothing changes.

    ``baseline`` holds the conditions the spec and the deployed volumes give
    (reconcile.desired_status): its Degraded message (e.g. a short runway) is kept next to the
    pool problems, and it is what Degraded is once the problems are gone. With the volume
    pool on, Degraded is the pool timer's alone (conditions.POOL_CONDITIONS): reconcile does
    not write it. No baseline (an invalid spec) and no problems: Degraded stays as it is.
    """
    degraded = next((c for c in current if c.get("type") == DEGRADED), None)
    base = next((c for c in baseline if c.get("type") == DEGRADED), None)
    if problems:
        messages = list(problems)
        if base is not None and base.get("status") == "True" and base.get("message"):
            messages.append(str(base["message"]))
        message = capped_message("; ".join(messages))
        if degraded is not None and (degraded.get("reason"), degraded.get("message")) == (
            reason,
            message,
        ):
            return None
        return reconcile.set_condition(
            current, DEGRADED, "True", reason, message, generation, now
        )
    if base is None:
        return None
    same = degraded is not None and all(
        degraded.get(key) == base.get(key) for key in ("status", "reason", "message")
    )
    if same:
        return None
    return reconcile.set_condition(
        current,
        DEGRADED,
        str(base.get("status")),
        str(base.get("reason")),
        str(base.get("message") or ""),
        base.get("observedGeneration"),
        now,
    )


def drain_condition(
    current: Sequence[Mapping[str, Any]],
    figures: AgentFigures,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]] | None:
    """The conditions with BacklogCannotDrain from the agents' figures; None when unchanged.

    True (with each such agent's ingest and sustained forward rates) while any agent says its
    ingest exceeds what it forwards under load; Unknown when no agent answered.
    """
    if not figures.answered:
        status, reason, message = "Unknown", REASON_NO_AGENT_FIGURES, "no agent answered"
    elif figures.cannot_drain:
        status, reason = "True", REASON_INGEST_ABOVE_FORWARD_RATE
        message = capped_message(
            "; ".join(agent.describe() for agent in figures.cannot_drain)
            + ": the backlog grows until the buffer is full; lower the load on these pods,"
            " spread it over more pods, or make Kafka faster for this producer"
        )
    else:
        status, reason = "False", REASON_FORWARDING_KEEPS_UP
        message = f"{figures.answered} agent(s) forward at least what they take in"
    previous: Mapping[str, Any] = next(
        (c for c in current if c.get("type") == BACKLOG_CANNOT_DRAIN), {}
    )
    if (previous.get("status"), previous.get("reason"), previous.get("message")) == (
        status,
        reason,
        message,
    ):
        return None
    return reconcile.set_condition(
        current, BACKLOG_CANNOT_DRAIN, status, reason, message, generation, now
    )


def pool_status_update(
    producer: Object,
    plan: PoolPlan,
    pods: Sequence[Object],
    backlog: int | None,
    now: datetime,
    figures: AgentFigures | None = None,
) -> PoolStatusUpdate:
    """The status changes for what the pool timer found; Warning events while Degraded is ours.

    ``backlog`` is None when no agent answered: then ``backlogBytes`` is removed, not left
    at a figure nobody vouches for any more. ``figures`` (the agents' answers) set the
    BacklogCannotDrain condition; without them it is left alone. It posts no event (the
    handler posts events under the pool's reason; the agent logs a WARNING when it starts).
    """
    update = _pool_status_update(producer, plan, pods, backlog, now)
    status = producer.get("status") or {}
    if not _settled(producer):
        # The timer's view predates the reconcile handler's latest status (no Ready yet, or
        # a newer generation, maybe an invalid spec): Degraded waits for reconcile. Next run.
        changes = {k: v for k, v in update.changes.items() if k != "conditions"}
        return PoolStatusUpdate(changes, update.warnings, update.message)
    current = update.changes.get("conditions", status.get("conditions") or [])
    if figures is None:
        return update
    generation = (producer.get("metadata") or {}).get("generation")
    conditions = drain_condition(current, figures, now, generation)
    if conditions is None:
        return update
    changes = {**update.changes, "conditions": conditions}
    return PoolStatusUpdate(changes, update.warnings, update.message)


def _settled(producer: Object) -> bool:
    """Whether the reconcile handler has written the status of the current generation."""
    status = producer.get("status") or {}
    generation = (producer.get("metadata") or {}).get("generation")
    has_ready = any(c.get("type") == READY for c in status.get("conditions") or [])
    return has_ready and (generation is None or status.get("observedGeneration") == generation)


def _pool_status_update(
    producer: Object,
    plan: PoolPlan,
    pods: Sequence[Object],
    backlog: int | None,
    now: datetime,
) -> PoolStatusUpdate:
    status = producer.get("status") or {}
    changes: dict[str, Any] = {}
    if status.get("backlogBytes") != backlog:
        changes["backlogBytes"] = backlog
    attached = attached_pods(pods)
    if status.get("attachedPods") != attached:
        changes["attachedPods"] = attached
    volumes = status_volume_counts(plan.counts)
    if status.get("volumes") != volumes:
        changes["volumes"] = volumes
    deployed = deployed_volumes(plan.volumes)
    if status.get("deployedVolumes") != deployed:
        changes["deployedVolumes"] = deployed
    problems = pool_problems(plan, pods)
    generation = (producer.get("metadata") or {}).get("generation")
    # What the spec and the deployed volumes say (size, runway, Degraded), to keep or restore.
    baseline = reconcile.desired_status(
        producer.get("spec"), {**status, "deployedVolumes": deployed}, generation, now
    ).status
    if "runwaySeconds" in baseline and status.get("runwaySeconds") != baseline["runwaySeconds"]:
        changes["runwaySeconds"] = baseline["runwaySeconds"]
    conditions = degraded_conditions(
        status.get("conditions") or [],
        baseline.get("conditions") or [],
        problems,
        REASON_POOL_PROBLEM,
        now,
        generation,
    )
    if conditions is None:
        return PoolStatusUpdate(changes)
    changes["conditions"] = conditions
    degraded = next(c for c in conditions if c["type"] == DEGRADED)
    # Events for the spec's own warnings (VolumesBelowSpec too) come from the reconcile handler.
    warnings = problems if degraded["reason"] == REASON_POOL_PROBLEM else []
    return PoolStatusUpdate(changes, list(warnings))


def deleting_status(
    producer: Object, plan: PoolPlan, remaining: Sequence[str], now: datetime
) -> PoolStatusUpdate:
    """The Deleting condition while a deletion waits for ``remaining`` volumes, and why."""
    metadata = producer.get("metadata") or {}
    status = producer.get("status") or {}
    reason = REASON_BACKLOG_HELD if plan.held else REASON_DRAINING
    messages = [
        f"waiting for {len(remaining)} buffer volume(s) to be released and drained:"
        f" {', '.join(remaining)}",
        *plan.problems,
    ]
    if plan.held:
        messages.append(held_message(plan.held))
    message = capped_message("; ".join(messages))
    conditions = reconcile.set_condition(
        status.get("conditions") or [],
        DELETING,
        "True",
        reason,
        message,
        metadata.get("generation"),
        now,
    )
    current: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == DELETING), {}
    )
    same = (current.get("reason"), current.get("message")) == (reason, message)
    return PoolStatusUpdate({} if same else {"conditions": conditions}, [], message)
