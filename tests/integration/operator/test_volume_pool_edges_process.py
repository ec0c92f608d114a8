"""Spec and cluster edges of the volume pool, with the chart's operator on the real API server.

Each test is one defect of issue 17 that went through kopf: a storage.size too small for the
agent, a spec change leaving too-small volumes in the pool, a pod refused after the webhook
(retries), and a namespace deletion with unforwarded data. The refusals, the volume expansion
checks and the namespace deletion are the API server's and its controllers' own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.operator import startup
from durable_producer.operator.act import api_access
from durable_producer.operator.decide import volume_fit
from durable_producer.operator.decide import volume_pool as vp
from integration.operator.test_volume_pool_process import (
    FAST_POOL,
    annotations_of,
    run,
    status_of,
)
from support.kube_cluster import storage_class
from support.kube_harness import CLAIM_GRACE, ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import durable_producer, opted_in_pod

pytestmark = pytest.mark.integration

STORAGE_CLASSES_PATH = "/apis/storage.k8s.io/v1/storageclasses"


def condition(kube_api: KubeApi, condition_type: str) -> dict[str, Any]:
    conditions = status_of(kube_api).get("conditions") or []
    return next((c for c in conditions if c.get("type") == condition_type), {})


def requested_size(kube_api: KubeApi, volume: str) -> str | None:
    found = kube_api.items(kube_api.pvcs_path).get(volume) or {}
    return ((found.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")


def producer_with(**spec: Any) -> dict[str, Any]:
    producer = durable_producer()
    producer["spec"].update(spec)
    return producer


# Defect 1: a small storage.size gave a Ready producer whose pods never start.


def test_a_size_too_small_for_the_agent_is_refused_not_ready(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    # 220Mi passes the CEL rule (a lower bound) but not the agent's own space budget.
    kube_api.create(producer_with(storage={"size": "220Mi"}))
    start_chart_operator()

    ready = wait_for(lambda: condition(kube_api, "Ready") or None, timeout=60, what="Ready")

    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.storage.size 220Mi cannot hold the agent's WAL" in ready["message"]
    assert "usable bytes" in ready["message"] and "at least" in ready["message"]
    status, refused = kube_api.create_pod(opted_in_pod("app"))
    assert status == 400, refused
    assert "cannot hold the agent's WAL" in refused["message"]
    assert kube_api.items(kube_api.pvcs_path) == {}


def test_a_storage_class_that_does_not_exist_is_not_ready_until_it_appears(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """Review D8: a DurableProducer naming a StorageClass the cluster lacks was Ready=True,
    while every opted-in pod would wait for a volume that is never provisioned."""
    missing = f"missing-{kube_api.namespace}"
    kube_api.create(producer_with(storage={"storageClassName": missing}))
    start_chart_operator()

    ready = wait_for(lambda: condition(kube_api, "Ready") or None, timeout=60, what="Ready")

    assert (ready["status"], ready["reason"]) == ("False", "StorageClassNotFound"), ready
    assert f"spec.storage.storageClassName '{missing}' names no StorageClass" in ready["message"]
    assert "Create the StorageClass" in ready["message"]
    def warnings() -> list[dict[str, Any]]:
        return [e for e in kube_api.events() if e.get("reason") == "StorageClassNotFound"]

    reported = wait_for(warnings, what="a Warning event")
    time.sleep(3)  # six pool intervals: the resync timer looks again each time, silently
    assert warnings() == reported and reported[0]["message"] == ready["message"]
    status, answer = kube_api.call("POST", STORAGE_CLASSES_PATH, storage_class(missing))
    assert status == 201, answer
    try:
        # No event reaches the operator: the resync timer checks again.
        fixed = wait_for(lambda: (found := condition(kube_api, "Ready")).get("status") == "True"
                         and found, timeout=60, what="Ready=True once the class exists")
        assert fixed["reason"] == "Reconciled"
        cluster_reads = {(r.group, r.resource, r.verb, r.code) for r in kube_api.cluster_requests()
                         if r.user_agent == api_access.STORAGE_CLASSES_USER_AGENT
                         and r.name == missing}
        assert ("storage.k8s.io", "storageclasses", "get", 404) in cluster_reads
        assert all(code != 403 for *_, code in cluster_reads)
    finally:
        kube_api.call("DELETE", f"{STORAGE_CLASSES_PATH}/{missing}")


# Defect 2: after a spec change the pool handed out volumes that were too small.


def test_after_a_spec_change_only_fitting_volumes_go_to_new_pods_and_small_ones_grow(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    expandable = f"expandable-{kube_api.namespace}"
    status, answer = kube_api.call("POST", STORAGE_CLASSES_PATH,
                                   storage_class(expandable, expandable=True))
    assert status == 201, answer
    try:
        spec_change_with_an_expandable_class(kube_api, start_chart_operator, expandable)
    finally:
        kube_api.call("DELETE", f"{STORAGE_CLASSES_PATH}/{expandable}")


def spec_change_with_an_expandable_class(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator], expandable: str
) -> None:
    kube_api.create(producer_with(storage={"storageClassName": expandable}))
    start_chart_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS=CLAIM_GRACE,
                         DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    still_running = run(kube_api, "old-a")
    released = run(kube_api, "old-b")
    assert requested_size(kube_api, released) == "2Gi"
    kube_api.delete_pod("old-b")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kube_api, released),
             timeout=60, what="the volume of old-b to be free")

    kube_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 4 * 2**20}})

    # The free volume is grown to the new size (its class allows expansion; the API server's
    # resize admission checks that), not handed out small; the one in use stays as it is.
    wait_for(lambda: requested_size(kube_api, released) == "4Gi", timeout=60, what="expansion")
    assert requested_size(kube_api, still_running) == "2Gi"
    wait_for(lambda: (s := status_of(kube_api)).get("observedGeneration") == 2
             and s.get("deployedVolumes") and s.get("bufferSize") == "4Gi" and s,
             timeout=60, what="the new size in status")
    degraded = wait_for(lambda: condition(kube_api, "Degraded").get("reason")
                        == "VolumesBelowSpec" and condition(kube_api, "Degraded"),
                        timeout=60, what="Degraded: a smaller volume still in use")

    # No resizer runs here: the grown volume's status.capacity is still 2Gi. It counts at
    # the size it has (review D10: before, at the size asked for), so it waits and a new pod
    # gets a new volume of the new size.
    waiting = [
        {"size": "2Gi", "storageClassName": expandable, "fitsSpec": False, "inUse": 1,
         "claimed": 0, "free": 1, "draining": 0},
    ]
    status = wait_for(lambda: (s := status_of(kube_api)).get("deployedVolumes")
                      == waiting and s, timeout=60,
                      what="status.deployedVolumes: the expansion not done yet")
    assert status["runwaySeconds"] < 600  # what 2Gi buys at 4 MiB/s, not what 4Gi buys
    assert f"only {status['runwaySeconds']}s" in degraded["message"]
    fresh = run(kube_api, "new-a")
    assert fresh not in (released, still_running)
    assert requested_size(kube_api, fresh) == "4Gi"

    # The resizer and the kubelet grow it (as a CSI driver's would): now it fits.
    volume_name = kube_api.items(kube_api.pvcs_path)[released]["spec"]["volumeName"]
    code, answer = kube_api.call(
        "PATCH", f"/api/v1/persistentvolumes/{volume_name}",
        {"spec": {"capacity": {"storage": "4Gi"}}}, content_type="application/merge-patch+json")
    assert code == 200, answer
    code, answer = kube_api.call(
        "PATCH", f"{kube_api.pvcs_path}/{released}/status",
        {"status": {"capacity": {"storage": "4Gi"}}},
        content_type="application/merge-patch+json")
    assert code == 200, answer
    deployed = [
        {"size": "2Gi", "storageClassName": expandable, "fitsSpec": False, "inUse": 1,
         "claimed": 0, "free": 0, "draining": 0},
        {"size": "4Gi", "storageClassName": expandable, "fitsSpec": True, "inUse": 1,
         "claimed": 0, "free": 1, "draining": 0},
    ]
    wait_for(lambda: status_of(kube_api).get("deployedVolumes") == deployed, timeout=60,
             what="status.deployedVolumes: the grown volume fits")
    assert run(kube_api, "new-b") == released
    assert kube_api.items(kube_api.jobs_path) == {}
    storage_reads = {(r.group, r.resource, r.verb) for r in kube_api.cluster_requests()
                     if r.user_agent == api_access.STORAGE_CLASSES_USER_AGENT}
    declared = {(g, p, v) for g, p, verbs in api_access.STORAGE_CLASSES_API_ACCESS for v in verbs}
    assert storage_reads and storage_reads <= declared


def test_after_a_spec_change_a_small_volume_that_cannot_grow_is_drained_and_retired(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())  # the cluster default class: nothing to grow
    start_chart_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS=CLAIM_GRACE,
                         DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600",
                         DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS="600")
    small = run(kube_api, "old")
    kube_api.delete_pod("old")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kube_api, small), timeout=60,
             what="the volume to be free")

    kube_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 4 * 2**20}})
    wait_for(lambda: status_of(kube_api).get("bufferSize") == "4Gi", timeout=60,
             what="new size")

    assert run(kube_api, "new") != small
    job = vp.drain_job_name(small)
    wait_for(lambda: job in kube_api.items(kube_api.jobs_path), timeout=60,
             what="a drain Job at once (no pod may claim it), not after the 600 s grace")
    wait_for(lambda: kube_api.finish_drains(), timeout=60, what="the drain pod to exit 0")
    wait_for(lambda: small not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the drained small volume to be deleted, not kept for its idle TTL")


# Defect 3: a pod refused after the webhook made a new volume on every retry.


def test_retries_of_a_refused_pod_reuse_its_claim_and_the_unused_volume_is_not_drained(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS=CLAIM_GRACE,
                         DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="1")
    # A full ResourceQuota: the API server refuses the pod after the webhook claimed a volume.
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "full"},
             "spec": {"hard": {"count/pods": "0"}}}
    quotas = f"/api/v1/namespaces/{kube_api.namespace}/resourcequotas"
    assert kube_api.call("POST", quotas, quota)[0] == 201
    wait_for(lambda: (kube_api.call("GET", f"{quotas}/full")[1].get("status") or {}).get("hard"),
             what="the quota to be counted")
    pod = opted_in_pod("orders-0")  # a StatefulSet's pod: the same name on every retry
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                           "name": "orders", "uid": "sts-uid",
                                           "controller": True}]

    for _ in range(6):  # the controller retries; the API server never creates the pod
        status, refused = kube_api.create_pod(pod)
        assert status == 403, refused
        assert "exceeded quota" in refused["message"]

    volumes = kube_api.items(kube_api.pvcs_path)
    assert len(volumes) == 1, sorted(volumes)
    (volume,) = volumes
    # Never bound: no pod ever used it (WaitForFirstConsumer), so it stays Pending.
    assert (volumes[volume].get("status") or {}).get("phase") == "Pending"
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the unused volume to be deleted once its claim expired")
    assert kube_api.items(kube_api.jobs_path) == {}
    assert not [r for r in kube_api.requests() if r.resource == "jobs" and r.verb == "create"]


# Defect 8: a namespace deletion lost unforwarded data.


def test_a_namespace_deletion_holds_volumes_with_backlog_until_abandoned(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """The namespace controller deletes everything and the API server refuses new objects in
    the namespace (the drain Job too): a volume whose backlog is unknown is held, the
    DurableProducer says why, and only the abandon annotation lets them go. The operator
    runs from a namespace of its own, as installed in production: its ServiceAccount must
    not go with the namespace under test."""
    kube_api.create(durable_producer())
    start_chart_operator(own_namespace=True, **FAST_POOL)
    volume = run(kube_api, "busy")
    wait_for(lambda: vp.VOLUME_FINALIZER in (kube_api.items(kube_api.pvcs_path)[volume]
                                             ["metadata"].get("finalizers") or []),
             timeout=60, what="the volume's finalizer")
    wait_for(lambda: startup.FINALIZER in ((kube_api.get("orders") or {})
                                          .get("metadata", {}).get("finalizers") or []),
             timeout=60, what="the DurableProducer's finalizer")

    status, answer = kube_api.call("DELETE", f"/api/v1/namespaces/{kube_api.namespace}")
    assert status == 200, answer

    deleting = wait_for(lambda: condition(kube_api, "Deleting").get("reason")
                        == "BacklogHeld" and condition(kube_api, "Deleting"),
                        timeout=90, what="Deleting=True, reason BacklogHeld")
    assert volume in deleting["message"] and vp.ABANDON_ANNOTATION in deleting["message"]
    time.sleep(3)  # several pool intervals: nothing lets go on its own
    held = kube_api.items(kube_api.pvcs_path).get(volume)
    assert held is not None and held["metadata"].get("deletionTimestamp")
    assert kube_api.get("orders") is not None
    refused_jobs = [r for r in kube_api.requests()
                    if r.resource == "jobs" and r.verb == "create" and r.code == 403]
    assert kube_api.items(kube_api.jobs_path) == {}, "a drain Job ran in a namespace being deleted"

    # The escape hatch: the user gives the backlog up deliberately.
    kube_api.annotate("orders", {vp.ABANDON_ANNOTATION: "true"})
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the volume to go")
    wait_for(lambda: kube_api.get("orders") is None, timeout=60, what="the DurableProducer to go")
    wait_for(lambda: kube_api.call("GET", f"/api/v1/namespaces/{kube_api.namespace}")[0] == 404,
             timeout=90, what="the namespace to go")
    assert volume_fit.STORAGE_CLASS_ANNOTATION in held["metadata"]["annotations"]
    print(f"\ndrain Job creates refused by the namespace being deleted: {len(refused_jobs)}")

