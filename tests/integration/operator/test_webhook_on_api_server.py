"""The webhook called by the real API server for real Pod creates, the volume pool with real
controllers (garbage collector, Job controller, namespace controller; kwok as the kubelet),
and two replicas claiming volumes with real optimistic concurrency."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable_producer import contract, shutdown_record
from durable_producer.contract import POOL_LABEL
from durable_producer.local.kube_processes import CONTAINER_STOP_MESSAGE_ANNOTATION
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.shutdown_record import ShutdownRecord
from integration.operator.test_operator_on_api_server import durable_producer
from support.kube_harness import CLAIM_GRACE, ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import admission_review, opted_in_pod

pytestmark = pytest.mark.integration

FAST_POOL = {
    "DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS": CLAIM_GRACE,
    "DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS": "1",
    "DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS": "2",
}
AGENT = "durable-agent"


def producer(kube_api: KubeApi, name: str = "orders") -> dict[str, Any]:
    manifest = durable_producer(name)
    manifest["spec"]["outageSeconds"] = 600
    return kube_api.create(manifest)


def ready_producer(kube_api: KubeApi, start: Callable[..., ChartOperator],
                   own_namespace: bool = False, **env: str) -> ChartOperator:
    producer(kube_api)
    operator = start(own_namespace=own_namespace, **env)
    wait_for(lambda: ((kube_api.get("orders") or {}).get("status") or {}).get("volumes"),
             timeout=60, what="the pool timer's first status")
    return operator


def test_a_pod_created_through_the_api_server_gets_its_agent_and_a_volume_and_runs(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    ready_producer(kube_api, start_chart_operator)
    pod = opted_in_pod("unused", terminationGracePeriodSeconds=30)
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "orders-5c7d-"

    running = kube_api.run_pod(pod)

    claim = pod_mutation.claimed_volume(running)
    assert claim is not None
    assert [c["name"] for c in running["spec"]["initContainers"]] == [AGENT]
    assert running["spec"]["initContainers"][0]["restartPolicy"] == "Always"
    env = {e["name"]: e["value"] for e in running["spec"]["containers"][0]["env"]}
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    volumes = kube_api.items(kube_api.pvcs_path)
    assert list(volumes) == [claim]
    # Found by its label; no owner reference, so the garbage collector leaves it to the
    # finalizer (D2).
    assert volumes[claim]["metadata"]["labels"] == {POOL_LABEL: "orders"}
    assert "ownerReferences" not in volumes[claim]["metadata"]
    wait_for(lambda: ((kube_api.get("orders") or {}).get("status") or {}).get(
        "attachedPods") == 1, timeout=60, what="status.attachedPods = 1")


def test_a_pod_with_a_native_mesh_proxy_runs_with_the_agent_right_after_the_proxy(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """D4 (b): native sidecars stop in reverse order, so an agent before the mesh proxy would
    make its final drain after the proxy is gone. Created through the real API server (its
    validation of native sidecars included) and run by kwok."""
    ready_producer(kube_api, start_chart_operator)
    pod = opted_in_pod("meshed", initContainers=[
        {"name": "mesh-init", "image": "mesh/init:1"},
        {"name": "mesh-proxy", "image": "mesh/proxy:1", "restartPolicy": "Always"},
        {"name": "migrate", "image": "shop/migrate:1"},
    ])
    pod["metadata"]["annotations"] = {"traffic.sidecar.istio.io/excludeInboundPorts": "15020"}

    running = kube_api.run_pod(pod)

    assert [c["name"] for c in running["spec"]["initContainers"]] == [
        "mesh-init", "mesh-proxy", AGENT, "migrate"]
    assert pod_mutation.claimed_volume(running) is not None
    # D4 (c): probes and scrapes of the agent's metrics port pass the proxy by.
    annotations = running["metadata"]["annotations"]
    assert annotations["traffic.sidecar.istio.io/excludeInboundPorts"] == "15020,9644"
    assert annotations["config.linkerd.io/skip-inbound-ports"] == "9644"


def test_a_dry_run_create_is_mutated_but_claims_nothing(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    ready_producer(kube_api, start_chart_operator)

    status, answer = kube_api.create_pod(opted_in_pod("dry"), dry_run=True)

    assert status == 201, answer
    assert pod_mutation.claimed_volume(answer) == vp.volume_name("orders", "dry-run")
    assert [c["name"] for c in answer["spec"]["initContainers"]] == [AGENT]
    assert kube_api.items(kube_api.pvcs_path) == {}
    assert kube_api.opted_in_pods() == {}


def test_a_pod_naming_a_missing_producer_is_refused_with_the_reason(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    ready_producer(kube_api, start_chart_operator)

    status, answer = kube_api.create_pod(opted_in_pod("lost", producer="ghost"))

    assert status == 400, answer
    assert 'admission webhook "attach-buffer-agent.durable.dev" denied the request' in (
        answer["message"])
    assert f"no DurableProducer {kube_api.namespace}/ghost exists" in answer["message"]
    assert kube_api.items(kube_api.pvcs_path) == {}


def test_with_the_operator_down_opted_in_pods_are_refused_and_others_admitted(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """failurePolicy Fail, objectSelector on the opt-in label."""
    operator = ready_producer(kube_api, start_chart_operator)
    operator.process.stop()

    status, answer = kube_api.create_pod(opted_in_pod("orphan"))
    plain = opted_in_pod("plain")
    del plain["metadata"]["labels"][contract.PRODUCER_LABEL]
    plain_status, plain_answer = kube_api.create_pod(plain)

    assert status == 500, answer
    assert 'failed calling webhook "attach-buffer-agent.durable.dev"' in answer["message"]
    assert plain_status == 201, plain_answer
    assert "initContainers" not in plain_answer["spec"]


def test_the_injected_agent_is_admitted_under_a_limit_range_and_a_cpu_limit_quota(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """A multi-tenant namespace: LimitRange defaults and a ResourceQuota on limits.cpu."""
    ns = kube_api.namespace
    kube_api.client.call("POST", f"/api/v1/namespaces/{ns}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "500m"},
                             "defaultRequest": {"cpu": "100m"}}]}})
    kube_api.client.call("POST", f"/api/v1/namespaces/{ns}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"},
        "spec": {"hard": {"limits.cpu": "10"}}})
    ready_producer(kube_api, start_chart_operator)
    wait_for(lambda: (kube_api.client.call("GET", f"/api/v1/namespaces/{ns}/resourcequotas/cpu")
                      .get("status") or {}).get("hard"), what="the quota to be counted")

    status, answer = kube_api.create_pod(opted_in_pod("tenant"))

    assert status == 201, answer
    (agent,) = answer["spec"]["initContainers"]
    assert agent["resources"]["limits"]["cpu"]


def test_the_reinvocation_of_the_webhook_leaves_the_pod_as_it_is(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    producer(kube_api)
    operator = start_chart_operator()

    status, created = kube_api.create_pod(opted_in_pod("once"))

    assert status == 201, created
    (agent,) = created["spec"]["initContainers"]
    print(f"\nthe stored agent container's volumeMounts: {agent.get('volumeMounts')}")
    answered = admission_results(operator.metrics_url)
    assert answered.get("mutated") == 1, answered


def test_a_pod_created_from_an_admitted_pods_manifest_gets_its_own_volume(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """A copy of an admitted pod's manifest (an exported pod turned into a new one, ``kubectl
    debug --copy-to``) carries our annotation, the agent and the first pod's claim. It is not
    a reinvocation: it gets a volume of its own, not the one the first pod runs on (D6)."""
    producer(kube_api)
    start_chart_operator()
    first = kube_api.run_pod(opted_in_pod("first"))
    copied = json.loads(json.dumps(first))
    copied["metadata"] = {
        "name": "copy",
        "labels": first["metadata"].get("labels", {}),
        "annotations": first["metadata"].get("annotations", {}),
    }
    copied["spec"].pop("nodeName", None)
    copied.pop("status", None)

    second = kube_api.run_pod(copied)

    claims = [pod_mutation.claimed_volume(pod) for pod in (first, second)]
    print(f"\nclaims: {claims}")
    assert None not in claims and claims[0] != claims[1], claims
    summary = json.loads(second["metadata"]["annotations"][contract.INJECTED_ANNOTATION])
    assert summary["volume"] == claims[1]


def admission_results(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {sample.labels["result"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "durable_operator_admission_requests_total"}


def test_two_replicas_claiming_at_once_give_every_pod_its_own_volume(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """Both replicas serve the webhook; their claims race on the same free volumes and the API
    server answers the loser 409 (resourceVersion), as in a cluster with two replicas."""
    producer(kube_api)
    # Free volumes both will want: released by pods that came and went (a claim grace of 1 s
    # lets them go at once).
    setup = start_chart_operator(replica="setup", DURABLE_PRODUCER_POOL_CLAIM_GRACE_SECONDS="1",
                                 DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")
    first = [f"first-{index}" for index in range(3)]
    for name in first:
        kube_api.run_pod(opted_in_pod(name))
    for name in first:
        kube_api.delete_pod(name)
    wait_for(lambda: sum(vp.RELEASED_AT_ANNOTATION in (v["metadata"].get("annotations") or {})
                         for v in kube_api.items(kube_api.pvcs_path).values()) == 3,
             timeout=60, what="three free volumes")
    setup.process.stop()
    # The chart's claim grace (the pods below are never created: their claims must hold).
    replicas = [start_chart_operator(replica="replica-a",
                                     DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600"),
                start_chart_operator(replica="replica-b",
                                     DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")]
    claims: dict[str, str] = {}
    barrier = threading.Barrier(6)

    def admit(name: str, replica: ChartOperator) -> None:
        pod = opted_in_pod(name)
        pod["metadata"]["namespace"] = kube_api.namespace
        barrier.wait()
        status, answer = replica.post(json.dumps(admission_review(pod)).encode())
        response = answer["response"] if status == 200 else {}
        if response.get("allowed"):
            patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
            claims[name] = pod_mutation.claimed_volume(patched) or ""

    threads = [threading.Thread(target=admit, args=(f"p{i}", replicas[i % 2])) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(claims) == 6, claims
    assert len(set(claims.values())) == 6, f"a volume was given twice: {claims}"
    conflicts = [r for r in kube_api.requests() if r.resource == "persistentvolumeclaims"
                 and r.verb == "patch" and r.code == 409]
    print(f"\nclaims: {claims}; 409 answers to claim patches: {len(conflicts)}")


def delete_after_a_pod_ran(kube_api: KubeApi, start: Callable[..., ChartOperator],
                           stop_message: str | None = None, own_namespace: bool = False,
                           **env: str) -> str:
    """A pod runs with a pool volume, then is deleted; with ``stop_message``, its agent ends
    with that termination message (kwok writes it, as the kubelet would). ``own_namespace``:
    the operator installed in a namespace of its own (for tests that delete theirs)."""
    ready_producer(kube_api, start, own_namespace, **{**FAST_POOL, **env})
    pod = opted_in_pod("busy")
    if stop_message is not None:
        pod["metadata"]["annotations"] = {CONTAINER_STOP_MESSAGE_ANNOTATION: stop_message}
    kube_api.run_pod(pod)
    (volume,) = kube_api.items(kube_api.pvcs_path)
    kube_api.delete_pod("busy")
    wait_for(lambda: "busy" not in kube_api.items(kube_api.pods_path), timeout=60,
             what="the pod to go")
    return volume


def test_background_deletion_drains_the_volumes_then_the_producer_goes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    volume = delete_after_a_pod_ran(kube_api, start_chart_operator)

    kube_api.delete("orders", propagation="Background")

    wait_for(lambda: (kube_api.finish_drains(), kube_api.get("orders") is None)[1],
             timeout=120, what="the producer to go (each drain pod exiting 0)")
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=60,
             what="the drained volume to go")
    drains = [r for r in kube_api.requests() if r.resource == "jobs" and r.verb == "create"]
    assert drains, "the volume went without a drain Job"


def test_foreground_deletion_drains_the_volumes_then_the_producer_goes(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    # No drain before the deletion (a long drain grace): had one finished first, the volume
    # would be known empty whatever the garbage collector did.
    delete_after_a_pod_ran(kube_api, start_chart_operator,
                           DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600")

    kube_api.delete("orders", propagation="Foreground")

    wait_until_gone_or_explain(kube_api, lambda: kube_api.get("orders") is None,
                               "the producer to go (each drain pod exiting 0)")


def test_a_namespace_with_a_drained_producer_can_be_deleted(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """D2 (b): a namespace deletion makes the namespace controller delete every PVC, Job and
    pod and refuse new pods, so no drain Job can run. The agent stopped by SIGTERM drained
    its volume and said so in its termination message; the operator reads it from the pod's
    last status and lets the volume go. Before the fix the volume stayed ``unknown`` and the
    DurableProducer and the namespace stayed Terminating (BacklogHeld)."""
    emptied = shutdown_record.render(ShutdownRecord(True, 0, 0, 0))
    volume = delete_after_a_pod_ran(kube_api, start_chart_operator, stop_message=emptied,
                                    own_namespace=True,
                                    DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS="600",
                                    DURABLE_PRODUCER_POOL_IDLE_TTL_SECONDS="600")
    wait_for(lambda: (vp_annotations(kube_api, volume) or {}).get(vp.BACKLOG_ANNOTATION)
             == vp.BACKLOG_EMPTY, timeout=30, what="the volume marked empty from the record")

    status, answer = kube_api.call("DELETE", f"/api/v1/namespaces/{kube_api.namespace}")
    assert status == 200, answer

    wait_until_gone_or_explain(
        kube_api,
        lambda: kube_api.call("GET", f"/api/v1/namespaces/{kube_api.namespace}")[0] == 404,
        "the namespace to go")
    drains = [r for r in kube_api.requests() if r.resource == "jobs" and r.verb == "create"]
    assert not drains, "a drain Job was made for a volume its agent had emptied"


def test_an_agent_that_stopped_with_backlog_leaves_its_volume_to_a_drain(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    """The same stop, but the agent's record says records are left (Kafka was down): the
    volume stays ``unknown`` and is drained by a Job before the producer can go."""
    held = shutdown_record.render(ShutdownRecord(False, 120, 0, 0))
    volume = delete_after_a_pod_ran(kube_api, start_chart_operator, stop_message=held)

    kube_api.delete("orders", propagation="Background")

    drained = wait_for(lambda: kube_api.finish_drains(), timeout=60,
                       what="a drain Job for the volume its agent left with backlog")
    print(f"\ndrain Jobs: {drained}")
    wait_for(lambda: (kube_api.finish_drains(), kube_api.get("orders") is None)[1],
             timeout=120, what="the producer to go once the drain succeeded")
    # Released by us before the producer went; Kubernetes' own pvc-protection finalizer may
    # hold the object a moment longer.
    found = kube_api.items(kube_api.pvcs_path).get(volume)
    assert found is None or (found["metadata"].get("deletionTimestamp")
                             and vp.VOLUME_FINALIZER not in found["metadata"].get("finalizers", []))
    wait_for(lambda: volume not in kube_api.items(kube_api.pvcs_path), timeout=30,
             what="the drained volume to go")


def vp_annotations(kube_api: KubeApi, volume: str) -> dict[str, str] | None:
    found = kube_api.items(kube_api.pvcs_path).get(volume)
    return None if found is None else (found["metadata"].get("annotations") or {})


def wait_until_gone_or_explain(kube_api: KubeApi, gone: Callable[[], bool], what: str) -> None:
    """Wait (ending every drain pod with 0); on a timeout, say what holds the deletion."""
    try:
        wait_for(lambda: (kube_api.finish_drains(), gone())[1], timeout=120, what=what)
    except AssertionError as error:
        found = kube_api.get("orders")
        producer = found or {}
        deleting = [c for c in (producer.get("status") or {}).get("conditions") or []
                    if c["type"] == "Deleting"] if found is not None else "producer gone"
        volumes = {name: (v["metadata"].get("deletionTimestamp"),
                          (v["metadata"].get("annotations") or {}).get(vp.BACKLOG_ANNOTATION))
                   for name, v in kube_api.items(kube_api.pvcs_path).items()}
        raise AssertionError(f"{error}; Deleting condition: {deleting}; volumes (deletion"
                             f" time, backlog): {volumes}") from None
