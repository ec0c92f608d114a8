"""The buffer volume pool, run by the chart's operator on the real API server.

Pods are created through the API server (its admission chain calls the webhook), scheduled
and run by kwok; their volumes are bound by the PV controller (support.kube_cluster's
provisioner makes the PersistentVolumes). A drain Job's pod runs until the test ends it with an
exit code (``KubeApi.finish_drains``); the Job controller does the rest.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer import contract
from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.figures.metrics_server import MetricsServer
from durable_producer.contract import POOL_LABEL
from durable_producer.local.kube import fake_node
from durable_producer.local.ports import free_port
from durable_producer.operator.act import api_access
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide import volume_pool as vp
from support.kube_harness import CLAIM_GRACE, ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import durable_producer, opted_in_pod

pytestmark = pytest.mark.integration

FAST_POOL = {
    "DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS": CLAIM_GRACE,
    "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": "1",
    "DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS": "2",
}
MUTATING_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def run(kube_api: KubeApi, name: str) -> str:
    """Create an opted-in pod through the API server and wait until it runs; its volume."""
    claim = pod_mutation.claimed_volume(kube_api.run_pod(opted_in_pod(name)))
    assert claim is not None
    return claim


def annotations_of(kube_api: KubeApi, volume: str) -> dict[str, str]:
    found = kube_api.items(kube_api.pvcs_path).get(volume)
    return dict(((found or {}).get("metadata") or {}).get("annotations") or {})


def status_of(kube_api: KubeApi) -> dict[str, Any]:
    return dict((kube_api.get("orders") or {}).get("status") or {})


def pool_volume(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": name, "labels": {POOL_LABEL: "orders"}, "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "2Gi"}}}}


def remove_webhook(kube_api: KubeApi) -> None:
    """As if the webhook had been skipped (failurePolicy Ignore while no replica answered)."""
    for name in kube_api.items(MUTATING_WEBHOOKS):
        if kube_api.namespace in name:
            assert kube_api.call("DELETE", f"{MUTATING_WEBHOOKS}/{name}")[0] == 200


def test_pods_created_at_once_get_different_volumes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS=CLAIM_GRACE,
                         DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    free = run(kube_api, "before")  # a volume that a pod used and left
    kube_api.delete_pod("before")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kube_api, free), timeout=60,
             what="the volume to be free")
    claims: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def create(name: str) -> None:
        barrier.wait()
        status, created = kube_api.create_pod(opted_in_pod(name))
        assert status == 201, created
        claims[name] = pod_mutation.claimed_volume(created) or ""

    threads = [threading.Thread(target=create, args=(name,)) for name in ("p1", "p2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert set(claims) == {"p1", "p2"}
    assert claims["p1"] != claims["p2"]
    assert free in claims.values()  # the free one was reused, one was created
    volumes = kube_api.items(kube_api.pvcs_path)
    assert set(claims.values()) == set(volumes)
    tokens = {v["metadata"]["annotations"][vp.CLAIM_TOKEN_ANNOTATION] for v in volumes.values()}
    assert len(tokens) == 2


def test_a_deleted_pods_volume_goes_to_the_next_pod(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(**{**FAST_POOL, "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": "600"})
    first = run(kube_api, "first")
    wait_for(lambda: status_of(kube_api).get("attachedPods") == 1, timeout=60,
             what="status.attachedPods = 1")
    wait_for(lambda: status_of(kube_api).get("volumes")
             == {"inUse": 1, "claimed": 0, "free": 0, "draining": 0}, timeout=60,
             what="status.volumes: one in use")

    kube_api.delete_pod("first")
    wait_for(lambda: vp.RELEASED_AT_ANNOTATION in annotations_of(kube_api, first), timeout=60,
             what="the volume to be released")
    second = run(kube_api, "second")

    assert second == first
    assert len(kube_api.items(kube_api.pvcs_path)) == 1
    assert kube_api.items(kube_api.jobs_path) == {}  # replayed by the new pod, not drained


def test_an_orphaned_volume_is_drained_then_reclaimed_after_its_ttl(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(**FAST_POOL)
    volume = run(kube_api, "gone")
    job_name = vp.drain_job_name(volume)

    kube_api.delete_pod("gone")
    job = wait_for(lambda: kube_api.items(kube_api.jobs_path).get(job_name), timeout=60,
                   what="the drain Job")
    wait_for(lambda: (status_of(kube_api).get("volumes") or {}).get("draining") == 1,
             timeout=60, what="status.volumes.draining = 1")

    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "drain"
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": volume}
    assert annotations_of(kube_api, volume)[vp.DRAIN_JOB_ANNOTATION] == job_name
    wait_for(lambda: any((p.get("status") or {}).get("phase") == "Running" for p in
                         kube_api.items(kube_api.pods_path).values()
                         if p["metadata"]["name"].startswith(job_name)),
             timeout=60, what="the drain pod running on the volume")
    time.sleep(3)  # longer than the idle TTL: a volume with backlog is never reclaimed
    assert volume in kube_api.items(kube_api.pvcs_path)

    wait_for(lambda: kube_api.finish_drains(), timeout=30, what="the drain pod to exit 0")

    wait_for(lambda: job_name not in kube_api.items(kube_api.jobs_path), timeout=60,
             what="Job cleanup")
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the drained volume to be deleted after its TTL")


def test_the_pods_of_a_drain_job_are_kept_out_of_service_meshes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """D4 (a): the pods the real Job controller makes for a drain carry the annotations that
    keep Istio's and Linkerd's injectors away (a proxy in an ordinary container never exits,
    and the Job would never complete)."""
    kube_api.create(durable_producer())
    start_chart_operator(**FAST_POOL)
    volume = run(kube_api, "gone")
    job_name = vp.drain_job_name(volume)

    kube_api.delete_pod("gone")
    drain_pod = wait_for(lambda: next((p for p in kube_api.items(kube_api.pods_path).values()
                                       if p["metadata"]["name"].startswith(job_name)), None),
                         timeout=60, what="the drain Job's pod")

    annotations = drain_pod["metadata"].get("annotations") or {}
    assert annotations.get("sidecar.istio.io/inject") == "false", annotations
    assert annotations.get("linkerd.io/inject") == "disabled", annotations
    wait_for(lambda: job_name in kube_api.finish_drains(), timeout=60,
             what="the drain pod to exit 0")
    wait_for(lambda: job_name not in kube_api.items(kube_api.jobs_path), timeout=60,
             what="the drain Job to complete and go")


def test_an_empty_volume_whose_claim_never_got_a_pod_is_reclaimed_without_a_drain(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    empty = pool_volume("orders-buffer-empty", {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY})
    assert kube_api.call("POST", kube_api.pvcs_path, empty)[0] == 201
    start_chart_operator(**FAST_POOL)

    wait_for(lambda: "orders-buffer-empty" not in kube_api.items(kube_api.pvcs_path),
             timeout=60, what="the empty volume to be reclaimed")
    assert kube_api.items(kube_api.jobs_path) == {}


def test_deleting_the_producer_waits_for_pods_and_drains(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(**FAST_POOL)
    volume = run(kube_api, "busy")
    job_name = vp.drain_job_name(volume)
    wait_for(lambda: (kube_api.get("orders") or {}).get("metadata", {}).get("finalizers"),
             timeout=60, what="the finalizer")

    kube_api.delete("orders")
    time.sleep(3)

    still_there: dict[str, Any] | None = kube_api.get("orders")
    assert still_there is not None and still_there["metadata"].get("deletionTimestamp")
    assert kube_api.items(kube_api.jobs_path) == {}  # the pod still writes to it
    status, refused = kube_api.create_pod(opted_in_pod("late"))
    assert status == 400, refused
    assert "being deleted" in refused["message"]

    kube_api.delete_pod("busy")
    wait_for(lambda: job_name in kube_api.items(kube_api.jobs_path), timeout=60,
             what="the drain Job")
    assert kube_api.get("orders") is not None

    wait_for(lambda: kube_api.finish_drains(), timeout=60, what="the drain pod to exit 0")

    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="volume deletion")
    wait_for(lambda: kube_api.get("orders") is None, timeout=60, what="the producer to go")
    assert_pool_requests_within_declared_access(kube_api)


def test_a_complete_drain_job_left_from_an_earlier_drain_does_not_empty_the_volume(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """D1 (data loss): a drain Job was known by its name only. A Complete Job of that name left
    from an earlier drain (its delete failed, or another replica made it) answered the next
    drain: the volume was marked empty and deleted with the backlog its last pod left."""
    kube_api.create(durable_producer())
    start_chart_operator(**FAST_POOL)
    volume = run(kube_api, "writer")
    job_name = vp.drain_job_name(volume)
    labels = {POOL_LABEL: "orders", vp.DRAIN_VOLUME_LABEL: volume}
    stale = {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": job_name, "labels": labels},
             "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
                 "restartPolicy": "Never", "containers": [{"name": "drain", "image": "agent"}]}}}}
    status, created = kube_api.call("POST", kube_api.jobs_path, stale)
    assert status == 201, created
    wait_for(lambda: job_name in kube_api.finish_drains(), timeout=60, what="the old Job's pod")
    wait_for(lambda: job_outcome(kube_api.items(kube_api.jobs_path).get(job_name)) == "succeeded",
             timeout=60, what="the old Job Complete")

    kube_api.delete_pod("writer")  # the volume may hold its backlog: a drain is due

    def drain_of_this_request() -> dict[str, Any] | None:
        found = kube_api.items(kube_api.jobs_path).get(job_name)
        labels = (found or {}).get("metadata", {}).get("labels") or {}
        return found if labels.get(vp.DRAIN_REQUEST_LABEL) else None

    deadline = time.monotonic() + 60
    while not drain_of_this_request():
        backlog = annotations_of(kube_api, volume).get(vp.BACKLOG_ANNOTATION)
        assert backlog != vp.BACKLOG_EMPTY, "the old Job's success marked the volume empty"
        assert time.monotonic() < deadline, "no drain Job for the new request"
        time.sleep(0.2)
    token = annotations_of(kube_api, volume)[vp.DRAIN_REQUEST_ANNOTATION]
    assert drain_of_this_request()["metadata"]["labels"][vp.DRAIN_REQUEST_LABEL] == token

    wait_for(lambda: job_name in kube_api.finish_drains(), timeout=60, what="the new drain pod")
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the volume deleted once its own drain succeeded")


def job_outcome(job: dict[str, Any] | None) -> str | None:
    return vp.job_outcome(job) if job else None


def assert_pool_requests_within_declared_access(kube_api: KubeApi) -> None:
    """The pool's own API calls (audit log, by User-Agent) are all in POOL_API_ACCESS, which
    the chart's RBAC grants; none was refused."""
    declared = {(group, resource, verb)
                for group, resource, verbs in api_access.POOL_API_ACCESS
                for verb in verbs}
    requests = [r for r in kube_api.requests()
                if r.user_agent == api_access.POOL_USER_AGENT]
    used = {(r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource, r.verb)
            for r in requests}

    assert {("", "persistentvolumeclaims", "create"), ("", "persistentvolumeclaims", "delete"),
            ("batch", "jobs", "create"), ("batch", "jobs", "delete"),
            ("durable.dev", "durableproducers", "get")} <= used
    assert used <= declared, f"undeclared API access: {sorted(used - declared)}"
    assert not [r for r in requests if r.code == 403]


def degraded(kube_api: KubeApi) -> dict[str, Any]:
    conditions = status_of(kube_api).get("conditions")
    return next((c for c in conditions or [] if c["type"] == "Degraded"), {})


def test_a_pod_running_without_an_agent_degrades_the_producer_until_it_goes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator(**FAST_POOL)
    wait_for(lambda: degraded(kube_api).get("status") == "False", timeout=60,
             what="Degraded=False")
    remove_webhook(kube_api)
    kube_api.run_pod(opted_in_pod("bare"))

    condition = wait_for(lambda: degraded(kube_api).get("status") == "True"
                         and degraded(kube_api), timeout=60, what="Degraded=True")

    assert condition["reason"] == "VolumePoolProblem"
    assert "without a buffer agent" in condition["message"] and "bare" in condition["message"]
    wait_for(lambda: any(e.get("reason") == "VolumePoolProblem" and "bare" in e.get("message", "")
                         for e in kube_api.events()), what="the Warning event")

    kube_api.delete_pod("bare")

    wait_for(lambda: degraded(kube_api).get("status") == "False", timeout=60,
             what="Degraded=False once the pod is gone")
    assert degraded(kube_api)["reason"] == "AsExpected"


def test_status_reports_the_backlog_the_agents_publish(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """The operator scrapes the agent at the pod's IP: kwok gives pods loopback addresses, so
    a metrics server of the agent's listens there."""
    port = free_port()
    producer = durable_producer()
    producer["spec"]["agent"] = {"ports": {"kafka": 9092, "metrics": port}}
    kube_api.create(producer)
    start_chart_operator(DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    pod_ip = kube_api.run_pod(opted_in_pod("reporting"))["status"]["podIP"]
    metrics = AgentMetrics()
    metrics.refresh_buffer(size_bytes=4321, max_bytes=2**30, quarantined_segments=0)
    server = MetricsServer(metrics, host=pod_ip, port=port).start()
    try:
        wait_for(lambda: status_of(kube_api).get("backlogBytes") == 4321, timeout=60,
                 what="status.backlogBytes from the agent's metrics")

        metrics.refresh_buffer(size_bytes=0, max_bytes=2**30, quarantined_segments=0)
        wait_for(lambda: status_of(kube_api).get("backlogBytes") == 0, timeout=60,
                 what="status.backlogBytes back to 0")
    finally:
        server.stop()


def drain_job_for_a_gone_pod(kube_api: KubeApi, start: Callable[..., ChartOperator]
                             ) -> tuple[str, str]:
    """A pod ran with a pool volume and went; its drain Job is there. The volume and Job."""
    kube_api.create(durable_producer())
    start(**FAST_POOL)
    volume = run(kube_api, "gone")
    job_name = vp.drain_job_name(volume)
    kube_api.delete_pod("gone")
    wait_for(lambda: job_name in kube_api.items(kube_api.jobs_path), timeout=60,
             what="the drain Job")
    return volume, job_name


def test_a_failed_drain_job_degrades_the_producer_and_is_retried(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    volume, job_name = drain_job_for_a_gone_pod(kube_api, start_chart_operator)

    def failing() -> dict[str, Any] | None:
        kube_api.finish_drains(exit_code="1")  # each retry's pod fails too (backoffLimit 2)
        found = degraded(kube_api)
        return found if found.get("reason") == "VolumePoolProblem" and job_name in found.get(
            "message", "") else None

    condition = wait_for(failing, timeout=150, interval=0.5,
                         what="the Job to fail (three pods exiting 1) and Degraded to name it")
    assert job_name in condition["message"] and volume in condition["message"]
    wait_for(lambda: annotations_of(kube_api, volume).get(vp.DRAIN_FAILURES_ANNOTATION) == "1",
             timeout=60, what="the failure to be counted")

    def fresh_job() -> bool:  # retried: a new Job (the failed one was deleted)
        job = kube_api.items(kube_api.jobs_path).get(job_name)
        return job is not None and not any(
            c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions") or [])

    wait_for(fresh_job, timeout=60, what="a new drain Job")
    assert volume in kube_api.items(kube_api.pvcs_path)


def test_a_drain_that_finds_dead_letters_fails_at_once_and_keeps_the_volume(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """``durable-agent drain`` exits 4 when the WAL reached Kafka but dead letters are still on
    the volume (it exited 0 before, and the volume was deleted with them). The real Job
    controller fails the Job at its first pod (the pod failure policy: another pod would find
    the same letters), and Degraded says what is on the volume and what to do."""
    volume, _job = drain_job_for_a_gone_pod(kube_api, start_chart_operator)

    def kept() -> dict[str, Any] | None:
        kube_api.finish_drains(exit_code=str(contract.DRAIN_KEPT_DEAD_LETTERS_EXIT))
        found = degraded(kube_api)
        return found if "dead letters" in found.get("message", "") else None

    condition = wait_for(kept, timeout=90, interval=0.5,
                         what="the Job to fail on exit 4 and Degraded to say why")
    print(f"\n{condition['message']}")
    assert volume in condition["message"] and vp.ABANDON_ANNOTATION in condition["message"]
    # The Job controller's own record of the pods it made (its requests are not audited).
    pods_per_job = Counter(
        (event.get("involvedObject") or {}).get("uid") for event in kube_api.events()
        if event.get("reason") == "SuccessfulCreate"
        and (event.get("involvedObject") or {}).get("kind") == "Job")
    assert pods_per_job and max(pods_per_job.values()) == 1, (
        f"pods per drain Job: {pods_per_job}; the first pod's exit 4 tells all")
    assert volume in kube_api.items(kube_api.pvcs_path)
    annotations = annotations_of(kube_api, volume)
    assert annotations.get(vp.BACKLOG_ANNOTATION) != vp.BACKLOG_EMPTY


def test_a_drain_job_runs_where_the_volumes_pod_could(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """A pod on a dedicated, tainted node pool (tolerations and a nodeSelector): its volume's
    drain Job gets them, and the real scheduler puts the drain pod on that pool. Before, the
    drain pod had neither, and on a cluster where only that pool can reach the volume (a zonal
    or node-local disk) it stayed Pending until its deadline, retried for ever (D9)."""
    node = fake_node(f"spot-{kube_api.namespace}")
    node["metadata"]["labels"]["pool"] = "spot"
    node["spec"] = {"taints": [{"key": "pool", "value": "spot", "effect": "NoSchedule"}]}
    status, answer = kube_api.call("POST", "/api/v1/nodes", node)
    assert status == 201, answer
    try:
        kube_api.create(durable_producer())
        start_chart_operator(**FAST_POOL)
        toleration = {"key": "pool", "operator": "Equal", "value": "spot",
                      "effect": "NoSchedule"}
        running = kube_api.run_pod(opted_in_pod("on-spot", tolerations=[toleration],
                                                nodeSelector={"pool": "spot"}))
        assert running["spec"]["nodeName"] == node["metadata"]["name"]
        volume = pod_mutation.claimed_volume(running)
        kube_api.delete_pod("on-spot")

        def drain_pod() -> dict[str, Any] | None:
            return next((pod for pod in kube_api.items(kube_api.pods_path).values()
                         if (pod["metadata"].get("labels") or {}).get(vp.DRAIN_VOLUME_LABEL)
                         == volume and (pod.get("spec") or {}).get("nodeName")), None)

        scheduled = wait_for(drain_pod, timeout=90, interval=0.5,
                             what="the drain Job's pod to be scheduled")
        print(f"\ndrain pod on {scheduled['spec']['nodeName']}")
        assert scheduled["spec"]["nodeName"] == node["metadata"]["name"]
        assert scheduled["spec"]["tolerations"][0] == toleration
    finally:
        kube_api.call("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")


def test_a_pod_whose_agent_cannot_start_degrades_the_producer(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """D8: a pod whose agent waits (here a missing Secret: CreateContainerConfigError, as the
    kubelet reports it) left the DurableProducer Ready and not Degraded. The pod is bound to
    a node no kwok runs, so the status written here is the only one it gets."""
    node = fake_node(f"quiet-{kube_api.namespace}")
    del node["metadata"]["annotations"]  # not kwok's: nobody else writes the pod's status
    status, answer = kube_api.call("POST", "/api/v1/nodes", node)
    assert status == 201, answer
    try:
        kube_api.create(durable_producer())
        start_chart_operator(**FAST_POOL, DURABLE_PRODUCER_POOL_AGENT_START_GRACE_SECONDS="1")
        status, created = kube_api.create_pod(opted_in_pod("stuck",
                                                           nodeName=node["metadata"]["name"]))
        assert status == 201, created
        reason = 'secret "kafka-credentials" not found'
        status, answer = kube_api.call(
            "PATCH", f"{kube_api.pods_path}/stuck/status",
            {"status": {"phase": "Pending", "initContainerStatuses": [{
                "name": "durable-agent", "image": "agent", "imageID": "", "ready": False,
                "restartCount": 0, "state": {"waiting": {
                    "reason": "CreateContainerConfigError", "message": reason}}}]}},
            content_type="application/strategic-merge-patch+json")
        assert status == 200, answer

        condition = wait_for(
            lambda: (found := degraded(kube_api)).get("status") == "True"
            and "stuck (CreateContainerConfigError" in found.get("message", "") and found,
            timeout=60, interval=0.5, what="Degraded naming the pod and the kubelet's reason")
        print(f"\n{condition['message']}")
        assert reason in condition["message"]
        kube_api.delete_pod("stuck")
        wait_for(lambda: degraded(kube_api).get("status") != "True", timeout=60, interval=0.5,
                 what="Degraded cleared once the pod is gone")
    finally:
        kube_api.call("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")
