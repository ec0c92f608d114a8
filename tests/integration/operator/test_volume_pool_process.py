"""The buffer volume pool, run by the real operator against the Kubernetes emulator.

The emulator has no kubelet, Job controller or garbage collector: tests create the pods the
webhook admitted, delete them, and mark drain Jobs as succeeded, as those controllers would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.metrics_server import MetricsServer
from durable_producer.operator import api_access, pod_mutation
from durable_producer.operator import volume_pool as vp
from durable_producer.operator.kube_objects import format_time
from integration.operator.operator_harness import KubernetesApi
from integration.operator.test_webhook_harness import (
    JOBS_PATH,
    PODS_PATH,
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

FAST_POOL = {
    "DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS": "1",
    "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": "1",
    "DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS": "2",
}


def admit_and_run(webhook: WebhookOperator, kubernetes_api: KubernetesApi, name: str) -> str:
    """Admit a pod through the webhook, create it as the API server would, mark it Running."""
    pod = opted_in_pod(name)
    response = webhook.review(pod)
    assert response["allowed"] is True, response
    admitted = patched(pod, response)
    admitted["status"] = {"phase": "Running"}
    status, created = api_call(kubernetes_api, "POST", PODS_PATH, admitted)
    assert status in (200, 201), created
    claim = pod_mutation.claimed_volume(admitted)
    assert claim is not None
    return claim


def delete_pod(kubernetes_api: KubernetesApi, name: str) -> None:
    status, answer = api_call(kubernetes_api, "DELETE", f"{PODS_PATH}/{name}")
    assert status == 200, answer


def annotations_of(kubernetes_api: KubernetesApi, volume: str) -> dict[str, str]:
    found = items(kubernetes_api, PVCS_PATH).get(volume)
    return dict(((found or {}).get("metadata") or {}).get("annotations") or {})


def finish_job(kubernetes_api: KubernetesApi, name: str) -> None:
    """What the Job controller writes when the drain pod exited 0."""
    status, answer = api_call(kubernetes_api, "PATCH", f"{JOBS_PATH}/{name}", {
        "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})
    assert status == 200, answer


def test_pods_admitted_concurrently_get_different_volumes(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    free = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": "orders-buffer-free", "labels": {vp.POOL_LABEL: "orders"},
        "resourceVersion": "1",
        "annotations": {vp.RELEASED_AT_ANNOTATION: format_time(datetime.now(UTC)),
                        vp.BACKLOG_ANNOTATION: vp.BACKLOG_UNKNOWN}},
        "spec": {"accessModes": ["ReadWriteOnce"]}}
    assert api_call(kubernetes_api, "POST", PVCS_PATH, free)[0] in (200, 201)
    webhook = start_webhook_operator(DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    claims: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def admit(name: str) -> None:
        barrier.wait()
        claims[name] = admit_and_run(webhook, kubernetes_api, name)

    threads = [threading.Thread(target=admit, args=(name,)) for name in ("p1", "p2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert set(claims) == {"p1", "p2"}
    assert claims["p1"] != claims["p2"]
    assert "orders-buffer-free" in claims.values()  # the free one was reused, one was created
    volumes = items(kubernetes_api, PVCS_PATH)
    assert set(claims.values()) == set(volumes)
    tokens = {v["metadata"]["annotations"][vp.CLAIM_TOKEN_ANNOTATION] for v in volumes.values()}
    assert len(tokens) == 2


def test_deleted_pods_volume_goes_to_the_next_pod(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(**{**FAST_POOL,
                                        "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": "600"})
    first = admit_and_run(webhook, kubernetes_api, "first")
    wait_for(lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
        "attachedPods") == 1, what="status.attachedPods = 1")
    wait_for(lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get("volumes")
             == {"inUse": 1, "claimed": 0, "free": 0, "draining": 0},
             what="status.volumes: one in use")

    delete_pod(kubernetes_api, "first")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kubernetes_api, first),
             what="the volume to be released")
    second = admit_and_run(webhook, kubernetes_api, "second")

    assert second == first
    assert len(items(kubernetes_api, PVCS_PATH)) == 1
    assert items(kubernetes_api, JOBS_PATH) == {}  # replayed by the new pod, not drained


def test_orphaned_volume_is_drained_then_reclaimed_after_its_ttl(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(**FAST_POOL)
    volume = admit_and_run(webhook, kubernetes_api, "gone")
    job_name = vp.drain_job_name(volume)

    delete_pod(kubernetes_api, "gone")
    job = wait_for(lambda: items(kubernetes_api, JOBS_PATH).get(job_name),
                   what="the drain Job")
    wait_for(lambda: (((kubernetes_api.get("orders") or {}).get("status") or {}).get("volumes")
                      or {}).get("draining") == 1, what="status.volumes.draining = 1")

    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "drain"
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": volume}
    assert annotations_of(kubernetes_api, volume)[vp.DRAIN_JOB_ANNOTATION] == job_name
    time.sleep(3)  # longer than the idle TTL: a volume with backlog is never reclaimed
    assert volume in items(kubernetes_api, PVCS_PATH)

    finish_job(kubernetes_api, job_name)

    wait_for(lambda: job_name not in items(kubernetes_api, JOBS_PATH), what="Job cleanup")
    wait_for(lambda: volume not in items(kubernetes_api, PVCS_PATH),
             what="the drained volume to be deleted after its TTL")


def test_empty_volume_whose_claim_never_got_a_pod_is_reclaimed_without_a_drain(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    empty = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": "orders-buffer-empty", "labels": {vp.POOL_LABEL: "orders"},
        "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY}},
        "spec": {"accessModes": ["ReadWriteOnce"]}}
    assert api_call(kubernetes_api, "POST", PVCS_PATH, empty)[0] in (200, 201)
    start_webhook_operator(**FAST_POOL)

    wait_for(lambda: "orders-buffer-empty" not in items(kubernetes_api, PVCS_PATH),
             what="the empty volume to be reclaimed")
    assert items(kubernetes_api, JOBS_PATH) == {}


def test_deleting_the_producer_waits_for_pods_and_drains(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(**FAST_POOL)
    volume = admit_and_run(webhook, kubernetes_api, "busy")
    job_name = vp.drain_job_name(volume)
    wait_for(lambda: (kubernetes_api.get("orders") or {}).get("metadata", {}).get("finalizers"),
             what="the finalizer")

    kubernetes_api.delete("orders")
    time.sleep(3)

    still_there: dict[str, Any] | None = kubernetes_api.get("orders")
    assert still_there is not None and still_there["metadata"].get("deletionTimestamp")
    assert items(kubernetes_api, JOBS_PATH) == {}  # the pod still writes to it
    refused = webhook.review(opted_in_pod("late"))
    assert refused["allowed"] is False
    assert "being deleted" in refused["status"]["message"]

    delete_pod(kubernetes_api, "busy")
    wait_for(lambda: job_name in items(kubernetes_api, JOBS_PATH), what="the drain Job")
    assert kubernetes_api.get("orders") is not None

    finish_job(kubernetes_api, job_name)

    wait_for(lambda: volume not in items(kubernetes_api, PVCS_PATH), what="volume deletion")
    wait_for(lambda: kubernetes_api.get("orders") is None, what="the producer to go")
    assert_pool_requests_within_declared_access(kubernetes_api)


def assert_pool_requests_within_declared_access(kubernetes_api: KubernetesApi) -> None:
    """The pool's own API calls are all in POOL_API_ACCESS (what the chart's RBAC grants)."""
    declared = {(group, resource, verb)
                for group, resource, verbs in api_access.POOL_API_ACCESS
                for verb in verbs}
    used = {(request.group, request.plural, request.verb)
            for request in kubernetes_api.requests()
            if request.user_agent == api_access.POOL_USER_AGENT and request.plural}

    assert {("", "persistentvolumeclaims", "create"), ("", "persistentvolumeclaims", "delete"),
            ("batch", "jobs", "create"), ("batch", "jobs", "delete"),
            ("durable.dev", "durableproducers", "get")} <= used
    assert used <= declared, f"undeclared API access: {sorted(used - declared)}"


def degraded(kubernetes_api: KubernetesApi) -> dict[str, Any]:
    conditions = ((kubernetes_api.get("orders") or {}).get("status") or {}).get("conditions")
    return next((c for c in conditions or [] if c["type"] == "Degraded"), {})


def test_pod_running_without_an_agent_degrades_the_producer_until_it_goes(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    start_webhook_operator(**FAST_POOL)
    wait_for(lambda: degraded(kubernetes_api).get("status") == "False", what="Degraded=False")
    bare = opted_in_pod("bare")  # admitted while the webhook was down (failurePolicy Ignore)
    bare["status"] = {"phase": "Running"}
    assert api_call(kubernetes_api, "POST", PODS_PATH, bare)[0] in (200, 201)

    condition = wait_for(lambda: degraded(kubernetes_api).get("status") == "True"
                         and degraded(kubernetes_api), what="Degraded=True")

    assert condition["reason"] == "VolumePoolProblem"
    assert "without a buffer agent" in condition["message"] and "bare" in condition["message"]
    status, events = api_call(kubernetes_api, "GET", "/api/v1/namespaces/default/events")
    assert status == 200
    assert any(event.get("reason") == "VolumePoolProblem" and "bare" in event.get("message", "")
               for event in events["items"])

    delete_pod(kubernetes_api, "bare")

    wait_for(lambda: degraded(kubernetes_api).get("status") == "False",
             what="Degraded=False once the pod is gone")
    assert degraded(kubernetes_api)["reason"] == "AsExpected"


def test_status_reports_the_backlog_the_agents_publish(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    metrics = AgentMetrics()
    metrics.refresh_buffer(size_bytes=4321, max_bytes=2**30, quarantined_segments=0)
    server = MetricsServer(metrics, host="127.0.0.1", port=0).start()
    try:
        producer = durable_producer()
        producer["spec"]["agent"] = {"ports": {"kafka": 9092, "metrics": server.port}}
        kubernetes_api.create(producer)
        webhook = start_webhook_operator(DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
        pod = patched(opted_in_pod("reporting"), webhook.review(opted_in_pod("reporting")))
        pod["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
        assert api_call(kubernetes_api, "POST", PODS_PATH, pod)[0] in (200, 201)

        wait_for(lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
            "backlogBytes") == 4321, what="status.backlogBytes from the agent's metrics")

        metrics.refresh_buffer(size_bytes=0, max_bytes=2**30, quarantined_segments=0)
        wait_for(lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
            "backlogBytes") == 0, what="status.backlogBytes back to 0")
    finally:
        server.stop()


def test_failed_drain_job_degrades_the_producer_and_is_retried(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator(**FAST_POOL)
    volume = admit_and_run(webhook, kubernetes_api, "gone")
    job_name = vp.drain_job_name(volume)
    delete_pod(kubernetes_api, "gone")
    wait_for(lambda: job_name in items(kubernetes_api, JOBS_PATH), what="the drain Job")

    status, answer = api_call(kubernetes_api, "PATCH", f"{JOBS_PATH}/{job_name}", {
        "status": {"failed": 3, "conditions": [{"type": "Failed", "status": "True"}]}})
    assert status == 200, answer

    condition = wait_for(lambda: degraded(kubernetes_api).get("reason") == "VolumePoolProblem"
                         and degraded(kubernetes_api), what="Degraded naming the Job")
    assert job_name in condition["message"] and volume in condition["message"]
    wait_for(lambda: annotations_of(kubernetes_api, volume).get(vp.DRAIN_FAILURES_ANNOTATION)
             == "1", what="the failure to be counted")
    # Retried: a fresh Job (the failed one was deleted) after the drain grace.
    def fresh_job() -> bool:
        job = items(kubernetes_api, JOBS_PATH).get(job_name)
        return job is not None and not job.get("status")

    wait_for(fresh_job, what="a new drain Job")
    assert volume in items(kubernetes_api, PVCS_PATH)
