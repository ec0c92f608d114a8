"""The audit of opted-in pods whose buffer agent does not start (pure; review D8).

``Ready=True`` said nothing while every opted-in pod waited: a missing Secret
(``CreateContainerConfigError``), a wrong image (``ImagePullBackOff``), a volume that cannot be
attached or mounted (the agent still ``PodInitializing``/``ContainerCreating``), no node the
volume can reach (``Unschedulable``). The pool timer, which lists the pods anyway, names each
pod older than ``PoolPolicy.agent_start_grace_seconds`` whose agent is not running, with the
kubelet's or the scheduler's reason, in Degraded. A pod the scheduler cannot place because its
buffer volume's PV may not be attached on any node it may use (review D3: a zonal disk in
another zone, a node-local PV whose node is gone) also names that volume (drain_start.py does
the same for drain Jobs' pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from durable_producer.contract import AGENT_CONTAINER_NAME
from durable_producer.operator.decide import pod_mutation, volume_topology
from durable_producer.operator.decide.kube_objects import (
    FINISHED_POD_PHASES,
    Object,
    name_of,
    parse_time,
)

LISTED = 5
"""Pods named in one problem message; the rest are counted."""
REASON_CHARACTERS = 300
"""One pod's reason (the scheduler's message can name every node) is cut to this length."""


def agents_not_starting(pods: Iterable[Object], now: datetime, grace_seconds: float) -> list[str]:
    """``name (reason: message)`` of each opted-in pod older than ``grace_seconds`` whose agent
    is not running, sorted."""
    stuck = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        created = parse_time(metadata.get("creationTimestamp"))
        if (
            not pod_mutation.is_injected(pod)
            or status.get("phase") in FINISHED_POD_PHASES
            or metadata.get("deletionTimestamp")
            or created is None
            or (now - created).total_seconds() < grace_seconds
        ):
            continue
        why = _agent_waiting(status)
        if why is not None:
            stuck.append(f"{name_of(pod)} ({capped(why)}){_volume_conflict(pod, why)}")
    return sorted(stuck)


def problem(stuck: list[str], grace_seconds: float) -> str:
    """The Degraded message naming the first few stuck pods."""
    more = len(stuck) - LISTED
    return (
        f"{len(stuck)} pod(s) waiting for their buffer agent for over {grace_seconds:.0f}s:"
        f" {'; '.join(stuck[:LISTED])}"
        + (f"; and {more} more" if more > 0 else "")
        + " (kubectl describe pod: a missing Secret, image or StorageClass, or a volume that"
        " cannot be attached there)"
    )


def capped(text: str) -> str:
    return text if len(text) <= REASON_CHARACTERS else text[: REASON_CHARACTERS - 3] + "..."


def _volume_conflict(pod: Object, why: str) -> str:
    """The pod's buffer volume, when the scheduler says a volume's node affinity rules out
    the nodes the pod may use."""
    volume = pod_mutation.claimed_volume(pod)
    if volume is None or not volume_topology.scheduler_conflict(why):
        return ""
    return f", its buffer volume {volume} is bound where the pod may not run"


def _agent_waiting(status: Mapping[str, Any]) -> str | None:
    """Why the pod's agent is not running, or None when it runs."""
    agent = next(
        (
            container
            for container in status.get("initContainerStatuses") or []
            if container.get("name") == AGENT_CONTAINER_NAME
        ),
        None,
    )
    if agent is not None:
        state = agent.get("state") or {}
        if "running" in state:
            return None
        waiting = state.get("waiting") or {}
        return reason(waiting, "terminated" if "terminated" in state else "waiting")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return reason(condition, "not scheduled")
    return "not started" if status.get("phase") == "Pending" else None


def reason(source: Mapping[str, Any], default: str) -> str:
    """``reason: message`` of a container state or pod condition."""
    cause = source.get("reason") or default
    message = source.get("message")
    return f"{cause}: {message}" if message else str(cause)
