"""Review D8: Ready=True said nothing while opted-in pods could not start their agent; the
pool timer names them in Degraded with the kubelet's or the scheduler's reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from durable_producer.operator.decide import agent_start
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.decide.kube_objects import format_time
from durable_producer.operator.model.installation import PoolPolicy

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PoolPolicy(agent_start_grace_seconds=120)


def admitted_pod(name: str, age: float, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": format_time(NOW - timedelta(
                seconds=age))},
            "spec": {"initContainers": [{"name": "durable-agent", "restartPolicy": "Always"}],
                     "volumes": [{"name": "durable-buffer",
                                  "persistentVolumeClaim": {"claimName": "orders-buffer-1"}}]},
            "status": status}


def agent_waiting(reason: str, message: str = "") -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {"phase": "Pending", "initContainerStatuses": [
        {"name": "durable-agent", "state": {"waiting": waiting}}]}


def test_pods_whose_agent_cannot_start_are_named_with_the_kubelets_reason() -> None:
    pods = [
        admitted_pod("no-secret", 600, agent_waiting(
            "CreateContainerConfigError", 'secret "kafka-creds" not found')),
        admitted_pod("bad-image", 600, agent_waiting("ImagePullBackOff")),
        admitted_pod("no-mount", 600, agent_waiting("PodInitializing")),
        admitted_pod("unschedulable", 600, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "1 node(s) had volume node affinity conflict"}]}),
        admitted_pod("young", 30, agent_waiting("ImagePullBackOff")),
        admitted_pod("fine", 600, {"phase": "Running", "initContainerStatuses": [
            {"name": "durable-agent", "state": {"running": {}}}]}),
        admitted_pod("done", 600, {"phase": "Succeeded"}),
    ]

    stuck = agent_start.agents_not_starting(pods, NOW, 120)

    assert stuck == [
        "bad-image (ImagePullBackOff)",
        "no-mount (PodInitializing)",
        'no-secret (CreateContainerConfigError: secret "kafka-creds" not found)',
        "unschedulable (Unschedulable: 1 node(s) had volume node affinity conflict),"
        " its buffer volume orders-buffer-1 is bound where the pod may not run",
    ]
    (problem,) = vp.plan_pool([], pods, [], NOW, POLICY).problems
    assert problem.startswith("4 pod(s) waiting for their buffer agent for over 120s")


def test_a_pod_pending_on_its_volumes_node_affinity_names_the_volume_and_is_capped() -> None:
    """Review D3: the scheduler's current wording, with hundreds of nodes: the pod and its
    volume are named, and the scheduler's message is cut short."""
    verdict = ("0/300 nodes are available: 1 node(s) didn't match PersistentVolume's node"
               " affinity, " + ", ".join(f"node-{n} is cordoned" for n in range(300)))
    pod = admitted_pod("executor-7", 600, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": verdict}]})

    (stuck,) = agent_start.agents_not_starting([pod], NOW, 120)

    assert stuck.startswith("executor-7 (Unschedulable: 0/300 nodes are available")
    assert stuck.endswith(", its buffer volume orders-buffer-1 is bound where the pod may not run")
    assert len(stuck) < agent_start.REASON_CHARACTERS + 100


def test_a_long_list_of_stuck_pods_is_cut_short() -> None:
    pods = [admitted_pod(f"p{n:02d}", 600, agent_waiting("ErrImagePull")) for n in range(12)]

    (problem,) = vp.plan_pool([], pods, [], NOW, POLICY).problems

    assert problem.count("ErrImagePull") == agent_start.LISTED
    assert "and 7 more" in problem


def test_pods_not_opted_in_or_deleted_are_not_audited() -> None:
    plain = admitted_pod("plain", 600, agent_waiting("ImagePullBackOff"))
    plain["spec"] = {"containers": [{"name": "app"}]}
    going = admitted_pod("going", 600, agent_waiting("ImagePullBackOff"))
    going["metadata"]["deletionTimestamp"] = format_time(NOW)

    assert agent_start.agents_not_starting([plain, going], NOW, 120) == []
