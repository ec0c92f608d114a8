"""Review D3: a drain Job's pod that no node may take (its volume's zone or node is gone) is
named in Degraded with its volume; before, only the Job's failure at its deadline was."""

from __future__ import annotations

from typing import Any

from durable_producer.operator.decide import agent_start, drain_start
from durable_producer.operator.decide import volume_pool as vp


def drain_pod(volume: str, message: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{volume}-drain-x", "labels": {vp.DRAIN_VOLUME_LABEL: volume}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message}]}}


def test_drain_pods_unschedulable_on_their_volumes_node_affinity_are_named() -> None:
    pods = [
        drain_pod("v-new", "0/3 nodes are available: 3 node(s) didn't match PersistentVolume's"
                  " node affinity."),
        drain_pod("v-old", "0/3 nodes are available: 3 node(s) had volume node affinity conflict"),
        drain_pod("v-cpu", "0/3 nodes are available: 3 Insufficient cpu."),  # not ours to say
        {"metadata": {"name": "running", "labels": {vp.DRAIN_VOLUME_LABEL: "v-ok"}},
         "status": {"phase": "Running", "conditions": [
             {"type": "PodScheduled", "status": "True"}]}},
    ]

    stuck = drain_start.drains_not_scheduled(pods)

    assert [entry.split(" ")[0] for entry in stuck] == ["v-new", "v-old"]
    assert stuck[0].startswith("v-new (drain pod v-new-drain-x: Unschedulable: 0/3 nodes")
    message = drain_start.problem(stuck)
    assert message.startswith("2 volume(s) cannot be drained, no node may attach them: v-new")


def test_a_long_verdict_is_cut_short() -> None:
    verdict = "didn't match PersistentVolume's node affinity, " + "x" * 5000
    (entry,) = drain_start.drains_not_scheduled([drain_pod("v", verdict)])
    assert len(entry) < agent_start.REASON_CHARACTERS + 50
