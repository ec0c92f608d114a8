"""Spec and cluster edges of the volume pool, with the real operator against the emulator.

Each test is one defect of issue 17 that went through kopf: a storage.size too small for the
agent, a spec change leaving too-small volumes in the pool, a pod refused after the webhook
(retries), and a namespace deletion with unforwarded data. The emulator has no kubelet, Job
controller, volume binder or namespace controller: tests do what those would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kmock
import pytest

from durable_producer.operator import api_access, pod_mutation, startup, volume_fit
from durable_producer.operator import volume_pool as vp
from integration.operator import operator_harness
from integration.operator.operator_harness import NAMESPACE, KubernetesApi
from integration.operator.test_volume_pool_process import (
    FAST_POOL,
    admit_and_run,
    annotations_of,
    delete_pod,
    finish_job,
)
from integration.operator.test_webhook_harness import (
    JOBS_PATH,
    PVCS_PATH,
    WebhookOperator,
    api_call,
    durable_producer,
    items,
    opted_in_pod,
    patched,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration

STORAGE_CLASSES_PATH = "/apis/storage.k8s.io/v1/storageclasses"
PRODUCER_PATH = f"{operator_harness.COLLECTION_PATH}/orders"


@pytest.fixture(autouse=True)
def storage_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declare StorageClasses in the emulator (before it starts)."""
    monkeypatch.setitem(
        operator_harness.DECLARED_RESOURCES,
        "storage.k8s.io/v1/storageclasses",
        kmock.ResourceInfo(kind="StorageClass", namespaced=False),
    )


def status_of(kubernetes_api: KubernetesApi) -> dict[str, Any]:
    return dict((kubernetes_api.get("orders") or {}).get("status") or {})


def condition(kubernetes_api: KubernetesApi, condition_type: str) -> dict[str, Any]:
    conditions = status_of(kubernetes_api).get("conditions") or []
    return next((c for c in conditions if c.get("type") == condition_type), {})


def requested_size(kubernetes_api: KubernetesApi, volume: str) -> str | None:
    found = items(kubernetes_api, PVCS_PATH).get(volume) or {}
    return ((found.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")


def producer_with(**spec: Any) -> dict[str, Any]:
    producer = durable_producer()
    producer["spec"].update(spec)
    return producer


# Defect 1: a small storage.size gave a Ready producer whose pods never start.


def test_a_size_too_small_for_the_agent_is_refused_not_ready(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    tiny = producer_with(storage={"size": "5Mi"})
    assert any("spec.storage.size 5Mi is too small" in error
               for error in kubernetes_api.admission_errors(tiny))  # the CRD's CEL rule
    # 220Mi passes the CEL rule (a lower bound) but not the agent's own space budget.
    kubernetes_api.create(producer_with(storage={"size": "220Mi"}))
    webhook = start_webhook_operator()

    ready = wait_for(lambda: condition(kubernetes_api, "Ready") or None, what="Ready")

    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.storage.size 220Mi cannot hold the agent's WAL" in ready["message"]
    assert "usable bytes" in ready["message"] and "at least" in ready["message"]
    refused = webhook.review(opted_in_pod("app"))
    assert refused["allowed"] is False
    assert "cannot hold the agent's WAL" in refused["status"]["message"]
    assert items(kubernetes_api, PVCS_PATH) == {}


# Defect 2: after a spec change the pool handed out volumes that were too small.


def test_after_a_spec_change_only_fitting_volumes_go_to_new_pods_and_small_ones_grow(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    expandable = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                  "metadata": {"name": "expandable"}, "provisioner": "example.com/disk",
                  "allowVolumeExpansion": True}
    assert api_call(kubernetes_api, "POST", STORAGE_CLASSES_PATH, expandable)[0] in (200, 201)
    kubernetes_api.create(producer_with(storage={"storageClassName": "expandable"}))
    webhook = start_webhook_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS="1",
                                     DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    still_running = admit_and_run(webhook, kubernetes_api, "old-a")
    released = admit_and_run(webhook, kubernetes_api, "old-b")
    assert requested_size(kubernetes_api, released) == "2Gi"
    delete_pod(kubernetes_api, "old-b")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kubernetes_api, released),
             what="the volume of old-b to be free")

    kubernetes_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 4 * 2**20}})

    # The free volume is grown to the new size (its class allows expansion), not handed out
    # small; the one in use stays as it is while its pod runs.
    wait_for(lambda: requested_size(kubernetes_api, released) == "4Gi", what="expansion")
    assert requested_size(kubernetes_api, still_running) == "2Gi"
    status = wait_for(lambda: (s := status_of(kubernetes_api)).get("observedGeneration") == 2
                      and s.get("deployedVolumes") and s.get("bufferSize") == "4Gi" and s,
                      what="the new size in status")
    degraded = wait_for(lambda: condition(kubernetes_api, "Degraded").get("reason")
                        == "VolumesBelowSpec" and condition(kubernetes_api, "Degraded"),
                        what="Degraded: a smaller volume still in use")
    deployed = [
        {"size": "2Gi", "storageClassName": "expandable", "fitsSpec": False, "inUse": 1,
         "claimed": 0, "free": 0, "draining": 0},
        {"size": "4Gi", "storageClassName": "expandable", "fitsSpec": True, "inUse": 0,
         "claimed": 0, "free": 1, "draining": 0},
    ]
    status = wait_for(lambda: (s := status_of(kubernetes_api)).get("deployedVolumes")
                      == deployed and s, what="status.deployedVolumes: what is deployed")
    assert status["runwaySeconds"] < 600  # what 2Gi buys at 4 MiB/s, not what 4Gi buys
    assert f"only {status['runwaySeconds']}s" in degraded["message"]

    # New pods get volumes that fit: the grown one, then a new one of the new size.
    assert admit_and_run(webhook, kubernetes_api, "new-a") == released
    fresh = admit_and_run(webhook, kubernetes_api, "new-b")
    assert fresh not in (released, still_running)
    assert requested_size(kubernetes_api, fresh) == "4Gi"
    assert items(kubernetes_api, JOBS_PATH) == {}
    storage_reads = {(r.group, r.plural, r.verb) for r in kubernetes_api.requests()
                     if r.user_agent == api_access.STORAGE_CLASSES_USER_AGENT}
    declared = {(g, p, v) for g, p, verbs in api_access.STORAGE_CLASSES_API_ACCESS for v in verbs}
    assert storage_reads and storage_reads <= declared


def test_after_a_spec_change_a_small_volume_that_cannot_grow_is_drained_and_retired(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())  # the cluster default class: nothing to grow
    webhook = start_webhook_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS="1",
                                     DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600",
                                     DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS="600")
    small = admit_and_run(webhook, kubernetes_api, "old")
    delete_pod(kubernetes_api, "old")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kubernetes_api, small),
             what="the volume to be free")

    kubernetes_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 4 * 2**20}})
    wait_for(lambda: status_of(kubernetes_api).get("bufferSize") == "4Gi", what="new size")

    assert admit_and_run(webhook, kubernetes_api, "new") != small
    job = vp.drain_job_name(small)
    wait_for(lambda: job in items(kubernetes_api, JOBS_PATH),
             what="a drain Job at once (no pod may claim it), not after the 600 s grace")
    finish_job(kubernetes_api, job)
    wait_for(lambda: small not in items(kubernetes_api, PVCS_PATH),
             what="the drained small volume to be deleted, not kept for its idle TTL")


# Defect 3: a pod refused after the webhook made a new volume on every retry.


def test_retries_of_a_refused_pod_reuse_its_claim_and_the_unused_volume_is_not_drained(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS="3",
                                     DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="1")
    pod = opted_in_pod("orders-0")  # a StatefulSet's pod, refused later by a ResourceQuota
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                           "name": "orders", "uid": "sts-uid",
                                           "controller": True}]

    claims = set()
    for _ in range(6):  # the controller retries; the API server never creates the pod
        response = webhook.review(pod)
        assert response["allowed"] is True, response
        claim = pod_mutation.claimed_volume(patched(pod, response))
        assert claim is not None
        claims.add(claim)

    assert len(claims) == 1
    (volume,) = claims
    assert set(items(kubernetes_api, PVCS_PATH)) == {volume}
    # Never bound (a WaitForFirstConsumer class binds only for a scheduled pod): as the API
    # server reports it.
    status, answer = api_call(kubernetes_api, "PATCH", f"{PVCS_PATH}/{volume}",
                              {"status": {"phase": "Pending"}})
    assert status == 200, answer
    wait_for(lambda: volume not in items(kubernetes_api, PVCS_PATH), timeout=30,
             what="the unused volume to be deleted once its claim expired")
    assert items(kubernetes_api, JOBS_PATH) == {}
    assert not [r for r in kubernetes_api.requests() if r.plural == "jobs" and r.verb == "create"]


# Defect 8: a namespace deletion lost unforwarded data.


def test_a_namespace_deletion_holds_volumes_with_backlog_until_abandoned(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(**FAST_POOL)
    volume = admit_and_run(webhook, kubernetes_api, "busy")
    wait_for(lambda: vp.VOLUME_FINALIZER in (items(kubernetes_api, PVCS_PATH)[volume]
                                             ["metadata"].get("finalizers") or []),
             what="the volume's finalizer")
    wait_for(lambda: startup.FINALIZER in ((kubernetes_api.get("orders") or {})
                                          .get("metadata", {}).get("finalizers") or []),
             what="the DurableProducer's finalizer")

    # What the namespace controller does: everything is deleted, and the API server refuses
    # new objects in the namespace.
    kubernetes_api.refuse_creates(
        "batch/v1/jobs", 403,
        f'jobs.batch "{vp.drain_job_name(volume)}" is forbidden: unable to create new content'
        f" in namespace {NAMESPACE} because it is being terminated")
    kubernetes_api.delete("orders")
    delete_pod(kubernetes_api, "busy")
    status, answer = api_call(kubernetes_api, "DELETE", f"{PVCS_PATH}/{volume}")
    assert status == 200, answer

    deleting = wait_for(lambda: condition(kubernetes_api, "Deleting").get("reason")
                        == "BacklogHeld" and condition(kubernetes_api, "Deleting"),
                        what="Deleting=True, reason BacklogHeld")
    assert volume in deleting["message"] and vp.ABANDON_ANNOTATION in deleting["message"]
    time.sleep(3)  # several pool intervals: nothing lets go on its own
    held = items(kubernetes_api, PVCS_PATH).get(volume)
    assert held is not None and held["metadata"].get("deletionTimestamp")
    assert kubernetes_api.get("orders") is not None
    assert items(kubernetes_api, JOBS_PATH) == {}

    # The escape hatch: the user gives the backlog up deliberately.
    status, answer = api_call(kubernetes_api, "PATCH", PRODUCER_PATH, {
        "metadata": {"annotations": {vp.ABANDON_ANNOTATION: "true"}}})
    assert status == 200, answer
    wait_for(lambda: volume not in items(kubernetes_api, PVCS_PATH), what="the volume to go")
    wait_for(lambda: kubernetes_api.get("orders") is None, what="the DurableProducer to go")
    assert volume_fit.STORAGE_CLASS_ANNOTATION in held["metadata"]["annotations"]
