"""Volumes and where they can be attached (review D3), on the real API server and scheduler.

A pool volume bound to a PersistentVolume with ``spec.nodeAffinity`` (a zonal disk, a
node-local PV) can only be mounted on the nodes that affinity selects: the real scheduler
leaves a pod that gets it and may not run there Pending ("volume node affinity conflict").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_producer.contract import POOL_LABEL
from durable_producer.local.kube import fake_node
from durable_producer.operator.act import api_access
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide import volume_pool as vp
from integration.operator.test_volume_pool_process import degraded
from support.kube_cluster import DEFAULT_STORAGE_CLASS
from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import durable_producer, opted_in_pod

pytestmark = pytest.mark.integration

ZONE_LABEL = "topology.kubernetes.io/zone"
PVS_PATH = "/api/v1/persistentvolumes"
NODES_PATH = "/api/v1/nodes"


@pytest.fixture()
def zones(kube_api: KubeApi) -> Iterator[dict[str, str]]:
    """Two kwok nodes, one in zone a and one in zone b: zone -> node name."""
    names = {}
    for zone in ("a", "b"):
        node = fake_node(f"zone-{zone}-{kube_api.namespace}")
        node["metadata"]["labels"][ZONE_LABEL] = f"{kube_api.namespace}-{zone}"
        status, answer = kube_api.call("POST", NODES_PATH, node)
        assert status == 201, answer
        names[zone] = node["metadata"]["name"]
    try:
        yield names
    finally:
        for name in names.values():
            kube_api.call("DELETE", f"{NODES_PATH}/{name}")


def zonal_volume(kube_api: KubeApi, name: str, zone: str) -> None:
    """A free pool volume (it may hold backlog, so it is the first choice) bound to a PV that
    only nodes of ``zone`` can attach, as a zonal disk once provisioned there."""
    bound_volume(kube_api, name, {"key": ZONE_LABEL, "operator": "In", "values": [zone]})


def bound_volume(kube_api: KubeApi, name: str, requirement: dict[str, Any]) -> None:
    """A free pool volume that may hold backlog, bound to a PV whose node affinity is the one
    ``requirement``."""
    pv_name = f"pv-{kube_api.namespace}-{name}"
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": name, "labels": {POOL_LABEL: "orders"},
        "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_UNKNOWN}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": DEFAULT_STORAGE_CLASS,
                 "volumeName": pv_name, "resources": {"requests": {"storage": "4Gi"}}}}
    status, answer = kube_api.call("POST", kube_api.pvcs_path, pvc)
    assert status == 201, answer
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
          "spec": {
              "capacity": {"storage": "4Gi"}, "accessModes": ["ReadWriteOnce"],
              "storageClassName": DEFAULT_STORAGE_CLASS,
              "persistentVolumeReclaimPolicy": "Retain",
              "hostPath": {"path": f"/nonexistent/{pv_name}"},
              "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "namespace": kube_api.namespace, "name": name,
                           "uid": answer["metadata"]["uid"]},
              "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                  requirement]}]}}}}
    status, answer = kube_api.call("POST", PVS_PATH, pv)
    assert status == 201, answer
    wait_for(lambda: (kube_api.items(kube_api.pvcs_path)[name].get("status") or {}).get("phase")
             == "Bound", timeout=30, interval=0.5, what=f"{name} bound to {pv_name}")


@pytest.fixture()
def remove_pvs(kube_api: KubeApi) -> Iterator[None]:
    yield
    status, listing = kube_api.call("GET", PVS_PATH)
    for item in listing.get("items") or [] if status == 200 else []:
        if item["metadata"]["name"].startswith(f"pv-{kube_api.namespace}-"):
            kube_api.call("DELETE", f"{PVS_PATH}/{item['metadata']['name']}")


def scheduled_condition(pod: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"), {})


def test_a_pod_pinned_to_another_zone_does_not_get_a_volume_bound_in_this_one(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator],
    zones: dict[str, str], remove_pvs: None,
) -> None:
    """A free volume bound in zone a, and a pod whose nodeSelector says zone b. Before, the
    webhook handed it that volume (free, may hold backlog: the first choice) and the real
    scheduler left the pod Pending for ever ("volume node affinity conflict"). Now it gets
    another volume and runs in zone b; the zonal one stays free."""
    kube_api.create(durable_producer())
    zone_a = f"{kube_api.namespace}-a"
    zone_b = f"{kube_api.namespace}-b"
    zonal_volume(kube_api, "orders-buffer-in-zone-a", zone_a)
    start_chart_operator()  # default policy: the free volume is not drained during the test

    status, created = kube_api.create_pod(opted_in_pod("in-zone-b",
                                                       nodeSelector={ZONE_LABEL: zone_b}))
    assert status == 201, created
    claim = pod_mutation.claimed_volume(created)
    if claim == "orders-buffer-in-zone-a":  # the defect: show what the scheduler says
        pending = wait_for(
            lambda: (found := kube_api.items(kube_api.pods_path).get("in-zone-b"))
            and scheduled_condition(found).get("status") == "False" and found,
            timeout=60, interval=0.5, what="the scheduler's verdict")
        pytest.fail(f"the pod got the volume bound in zone a: {scheduled_condition(pending)}")
    running = wait_for(
        lambda: (found := kube_api.items(kube_api.pods_path).get("in-zone-b"))
        and (found.get("status") or {}).get("phase") == "Running" and found,
        timeout=60, interval=0.5, what="the pod Running in zone b")
    assert running["spec"]["nodeName"] == zones["b"]
    assert "orders-buffer-in-zone-a" in kube_api.items(kube_api.pvcs_path)

    # A pod that may run in zone a still gets the zonal volume (backlog first, as before).
    status, created = kube_api.create_pod(opted_in_pod("in-zone-a",
                                                       nodeSelector={ZONE_LABEL: zone_a}))
    assert status == 201, created
    assert pod_mutation.claimed_volume(created) == "orders-buffer-in-zone-a"
    running = wait_for(
        lambda: (found := kube_api.items(kube_api.pods_path).get("in-zone-a"))
        and (found.get("status") or {}).get("phase") == "Running" and found,
        timeout=60, interval=0.5, what="the pod Running in zone a")
    assert running["spec"]["nodeName"] == zones["a"]
    pv_reads = {(r.group, r.resource, r.verb, r.code) for r in kube_api.cluster_requests()
                if r.user_agent == api_access.VOLUME_PLACEMENT_USER_AGENT
                and (r.name or "").startswith(f"pv-{kube_api.namespace}-")}
    declared = {(g, p, v, 200) for g, p, verbs in api_access.VOLUME_PLACEMENT_API_ACCESS
                for v in verbs}
    assert pv_reads and pv_reads <= declared  # read, and allowed by the chart's RBAC


def test_a_pod_pending_on_its_volumes_node_affinity_names_the_volume_in_degraded(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator],
    zones: dict[str, str], remove_pvs: None,
) -> None:
    """The zone of a free zonal volume loses its node (a zone outage, a node-local PV after a
    spot reclaim). A pod without constraints of its own may still get it (nothing it says
    rules the zone out), and the real scheduler cannot place it. Degraded names the pod with
    the scheduler's verdict and, new with D3, the volume it is pinned by; before, it named
    only the pod ("Unschedulable: ..."), not which volume to drain or delete."""
    kube_api.create(durable_producer())
    zonal_volume(kube_api, "orders-buffer-in-zone-a", f"{kube_api.namespace}-a")
    assert kube_api.call("DELETE", f"{NODES_PATH}/{zones['a']}")[0] == 200
    start_chart_operator(DURABLE_PRODUCER_POOL_AGENT_START_GRACE_SECONDS="1")

    status, created = kube_api.create_pod(opted_in_pod("anywhere"))
    assert status == 201, created
    assert pod_mutation.claimed_volume(created) == "orders-buffer-in-zone-a"

    condition = wait_for(
        lambda: (found := degraded(kube_api)).get("status") == "True"
        and "anywhere (Unschedulable" in found.get("message", "") and found,
        timeout=60, interval=0.5, what="Degraded naming the unschedulable pod")
    print(f"\n{condition['message']}")
    assert ("its buffer volume orders-buffer-in-zone-a is bound where the pod may not run"
            in condition["message"])


def test_a_volume_on_a_node_that_is_gone_is_not_handed_out(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator], remove_pvs: None,
) -> None:
    """A free volume on a node-local PV (local-path, TopoLVM) whose node is gone (spot
    reclaim, scale-down). Before, the next pod got it (may hold backlog: the first choice)
    and stayed Pending for ever, whatever it asked; now the webhook sees that no node the PV
    names exists, and the pod gets a new volume and runs. The old one waits for its drain."""
    node = fake_node(f"local-{kube_api.namespace}")
    assert kube_api.call("POST", NODES_PATH, node)[0] == 201
    kube_api.create(durable_producer())
    bound_volume(kube_api, "orders-buffer-on-gone-node",
                 {"key": "kubernetes.io/hostname", "operator": "In",
                  "values": [node["metadata"]["name"]]})
    assert kube_api.call("DELETE", f"{NODES_PATH}/{node['metadata']['name']}")[0] == 200
    start_chart_operator()

    status, created = kube_api.create_pod(opted_in_pod("after-reclaim"))
    assert status == 201, created
    claim = pod_mutation.claimed_volume(created)
    if claim == "orders-buffer-on-gone-node":  # the defect: show what the scheduler says
        pending = wait_for(
            lambda: (found := kube_api.items(kube_api.pods_path).get("after-reclaim"))
            and scheduled_condition(found).get("status") == "False" and found,
            timeout=60, interval=0.5, what="the scheduler's verdict")
        pytest.fail(f"the pod got the volume of a node that is gone: "
                    f"{scheduled_condition(pending)}")
    wait_for(lambda: (found := kube_api.items(kube_api.pods_path).get("after-reclaim"))
             and (found.get("status") or {}).get("phase") == "Running",
             timeout=60, interval=0.5, what="the pod Running on another volume")
    assert "orders-buffer-on-gone-node" in kube_api.items(kube_api.pvcs_path)


def test_a_volume_whose_node_is_gone_cannot_be_drained_and_degraded_says_so(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator], remove_pvs: None,
) -> None:
    """The volume of the test above waits for its drain, but no node may attach it, so the
    drain Job's pod stays Pending (the Job fails only at its deadline, then is retried).
    Before, Degraded said nothing until that deadline, and then only that the drain failed;
    now it names the volume with the scheduler's verdict."""
    node = fake_node(f"local-{kube_api.namespace}")
    assert kube_api.call("POST", NODES_PATH, node)[0] == 201
    kube_api.create(durable_producer())
    bound_volume(kube_api, "orders-buffer-on-gone-node",
                 {"key": "kubernetes.io/hostname", "operator": "In",
                  "values": [node["metadata"]["name"]]})
    assert kube_api.call("DELETE", f"{NODES_PATH}/{node['metadata']['name']}")[0] == 200
    start_chart_operator(DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="1")

    condition = wait_for(
        lambda: (found := degraded(kube_api)).get("status") == "True"
        and "cannot be drained" in found.get("message", "") and found,
        timeout=60, interval=0.5, what="Degraded naming the volume that cannot be drained")
    print(f"\n{condition['message']}")
    assert "orders-buffer-on-gone-node (drain pod orders-buffer-on-gone-node-drain-" in (
        condition["message"])
    assert "didn't match PersistentVolume's node affinity" in condition["message"]
