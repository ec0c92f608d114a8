"""Drain Jobs whose pod no node may take (pure; review D3).

A free volume whose PersistentVolume can only be attached where no node is left (a zonal disk
in a zone that is gone, a node-local PV whose node was deleted) is handed to no new pod
(act/persistent_volumes.py), so it waits for its drain; but the scheduler cannot place the
drain Job's pod either, and the Job only fails at its deadline, again and again. The pool
timer lists the drain pods while drain Jobs exist and names each such volume in Degraded with
the scheduler's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable

from durable_producer.operator.decide import agent_start, volume_topology
from durable_producer.operator.decide.kube_objects import Object, name_of
from durable_producer.operator.decide.volume_pool import DRAIN_VOLUME_LABEL


def drains_not_scheduled(drain_pods: Iterable[Object]) -> list[str]:
    """``volume (drain pod name: reason)`` of each drain pod the scheduler cannot place
    because its volume's PV may not be attached on any node it may use, sorted."""
    stuck = []
    for pod in drain_pods:
        volume = ((pod.get("metadata") or {}).get("labels") or {}).get(DRAIN_VOLUME_LABEL)
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if not (
                volume
                and condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
            ):
                continue
            why = agent_start.reason(condition, "not scheduled")
            if volume_topology.scheduler_conflict(why):
                stuck.append(f"{volume} (drain pod {name_of(pod)}: {agent_start.capped(why)})")
    return sorted(stuck)


def problem(stuck: list[str]) -> str:
    """The Degraded message naming the first few volumes whose drain cannot be scheduled."""
    more = len(stuck) - agent_start.LISTED
    return (
        f"{len(stuck)} volume(s) cannot be drained, no node may attach them:"
        f" {'; '.join(stuck[: agent_start.LISTED])}"
        + (f"; and {more} more" if more > 0 else "")
        + " (their zone or node is gone: bring it back, or delete the PVC and lose its backlog)"
    )
