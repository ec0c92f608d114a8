"""The audit of opted-in pods whose buffer agent does not start (pure; review D8).

``Ready=True`` said nothing while every opted-in pod waited: a missing Secret
(``CreateContainerConfigError``), a wrong image (``ImagePullBackOff``), a volume that cannot be
attached or mounted (the agent still ``PodInitializing``/``ContainerCreating``), no node the
volume can reach (``Unschedulable``). The pool timer, which lists the pods anyway, names each
pod older than ``PoolPolicy.agent_start_grace_seconds`` whose agent is not running, with the
kubelet's or the scheduler's reason, in Degraded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from durable_producer.contract import AGENT_CONTAINER_NAME
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide.kube_objects import (
    FINISHED_POD_PHASES,
    Object,
    name_of,
    parse_time,
)

LISTED = 5
"""Pods named in one problem message; the rest are counted."""


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
            stuck.append(f"{name_of(pod)} ({why})")
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
        return _why(waiting, "terminated" if "terminated" in state else "waiting")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _why(condition, "not scheduled")
    return "not started" if status.get("phase") == "Pending" else None


def _why(source: Mapping[str, Any], default: str) -> str:
    reason = source.get("reason") or default
    message = source.get("message")
    return f"{reason}: {message}" if message else str(reason)
