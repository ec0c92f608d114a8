"""The webhook's edges, against the chart's operator (kopf run) on the real API server:
operations other than CREATE, name clashes, namespaces its RBAC does not cover, and an
installation with the volume pool switched off. One test stays on the API emulator (kmock): a
hanging API server, which a real one cannot be made to be for one request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.operator.act import api_access
from support.kube_cluster import Cluster
from support.kube_harness import ChartOperator, ChartOperators, KubeApi
from support.operator_harness import KubernetesApi
from support.waiting import wait_for
from support.webhook_harness import (
    WebhookOperator,
    admission_review,
    answer_with,
    durable_producer,
    opted_in_pod,
    patched,
    pool_resources,
    start_webhook_operator,
)

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration

PRODUCERS_PATH = "/apis/durable.dev/v1alpha1/namespaces/{namespace}/durableproducers"


@pytest.fixture()
def webhook(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> ChartOperator:
    kube_api.create(durable_producer("orders"))
    return start_chart_operator()


def test_an_update_review_is_admitted_untouched_and_claims_nothing(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    """The chart sends only CREATE; should anything send an UPDATE (a hand-made
    configuration, an older chart), kopf calls the handler anyway: it must not mutate."""
    pod = opted_in_pod("running")

    response = webhook.review(pod, operation="UPDATE")

    assert response["allowed"] is True
    assert "patch" not in response
    assert kube_api.items(kube_api.pvcs_path) == {}
    assert webhook.review(pod, operation="DELETE")["allowed"] is True
    assert kube_api.items(kube_api.pvcs_path) == {}


def clashing_pods() -> list[tuple[str, dict[str, Any], str]]:
    empty_dir = opted_in_pod("scratch", volumes=[{"name": "durable-buffer", "emptyDir": {}}])
    own_claim = opted_in_pod("adopt", volumes=[
        {"name": "durable-buffer", "persistentVolumeClaim": {"claimName": "my-data"}}])
    agent_named = opted_in_pod("named")
    agent_named["spec"]["containers"].append({"name": "durable-agent", "image": "mine:1"})
    env_set = opted_in_pod("env")
    env_set["spec"]["containers"][0]["env"] = [
        {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "kafka:9092"}]
    return [
        ("emptyDir", empty_dir, "volume 'durable-buffer' has the name of the buffer volume"),
        ("user PVC", own_claim, "volume 'durable-buffer' has the name of the buffer volume"),
        ("container", agent_named, "container 'durable-agent' has the name of the buffer agent"),
        ("env", env_set, "container 'app' sets KAFKA_BOOTSTRAP_SERVERS"),
    ]


@pytest.mark.parametrize(("pod", "message"), [(p, m) for _, p, m in clashing_pods()],
                         ids=[name for name, _, _ in clashing_pods()])
def test_a_pod_whose_names_clash_is_refused_naming_the_clash(
    webhook: ChartOperator, kube_api: KubeApi, pod: dict[str, Any], message: str
) -> None:
    response = webhook.review(pod)

    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert f"DurableProducer {kube_api.namespace}/orders" in response["status"]["message"]
    assert "patch" not in response
    assert kube_api.items(kube_api.pvcs_path) == {}  # refused before claiming anything


def test_a_pod_in_a_namespace_the_operator_may_not_read_gets_a_clear_refusal(
    kube_api: KubeApi, chart_operators: ChartOperators, control_plane: Cluster
) -> None:
    """With operator.watchNamespaces the operator has no Role elsewhere: the API answers 403.
    The chart keeps such pods away from the webhook (namespaceSelector); should one come
    anyway, the refusal says why, instead of an internal error (500)."""
    chart_operators.install({"operator": {"watchNamespaces": [kube_api.namespace]}})
    webhook = chart_operators.start()
    elsewhere = f"{kube_api.namespace}-elsewhere"
    control_plane.plane.create_namespace(elsewhere)
    try:
        pod = opted_in_pod("stray")
        pod["metadata"]["namespace"] = elsewhere
        status, answer = webhook.post(json.dumps(admission_review(pod)).encode())
    finally:
        control_plane.admin.request("DELETE", f"/api/v1/namespaces/{elsewhere}")

    assert status == 200, answer
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert f"may not read DurableProducer orders in namespace {elsewhere}" in message
    assert "operator.watchNamespaces" in message and "durable.dev/producer" in message


def test_the_admission_answers_within_the_webhook_timeout_when_the_api_hangs(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    """On kmock: a real API server cannot be made to hang on one request. The API server
    gives up on the webhook after webhook.timeoutSeconds; the operator's own API calls stop
    before that and the pod is refused with the reason (its controller
    retries), rather than the API server timing out with no reason at all."""
    async def hang() -> int:
        await asyncio.sleep(30)
        return 404

    path = PRODUCERS_PATH.format(namespace="default") + "/orders"
    answer_with(kubernetes_api, f"get {path}", hang)
    webhook = start_webhook_operator(DURABLE_PRODUCER_WEBHOOK_TIMEOUT_SECONDS="3")

    started = time.monotonic()
    response = webhook.review(opted_in_pod("patient"))
    elapsed = time.monotonic() - started

    # 1 s of API budget; the rest is this loaded test machine (a hung call would take 30 s).
    assert elapsed < 8, f"answered after {elapsed:.1f}s"
    assert response["allowed"] is False
    assert response["status"]["code"] == 504
    assert "did not answer within 1s" in response["status"]["message"]


def ready(kube_api: KubeApi, name: str) -> bool:
    conditions = ((kube_api.get(name) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_with_the_volume_pool_off_a_durable_producer_stays_deletable(
    kube_api: KubeApi, chart_operators: ChartOperators
) -> None:
    """rbac.features.* off: the chart grants no pods, PVCs, Jobs or ConfigMaps (RBAC answers
    403) and tells the operator so; it registers none of their handlers, adds no finalizer,
    and the DurableProducer goes at once. (A finalizer left by a former installation is removed
    by kopf when no handler needs it: test_handlers.py checks that none does.)"""
    chart_operators.install({"webhook": {"enabled": False}, "rbac": {"features": {
        "podAudit": False, "sparkPodTemplates": False, "volumePool": False,
        "drainJobs": False}}})
    kube_api.create(durable_producer("orders"))
    chart_operators.start()
    wait_for(lambda: ready(kube_api, "orders"), timeout=60,
             what="Ready=True (the core still runs)")
    time.sleep(2)  # several pool intervals: a registered timer would have run by now

    assert not (kube_api.get("orders") or {})["metadata"].get("finalizers")
    kube_api.delete("orders")

    wait_for(lambda: kube_api.get("orders") is None, timeout=15,
             what="the DurableProducer to be deleted")
    feature_agents = {api_access.POOL_USER_AGENT, api_access.SPARK_TEMPLATES_USER_AGENT}
    attempted = [(r.verb, r.resource, r.code) for r in kube_api.requests()
                 if r.user_agent in feature_agents]
    assert attempted == [], f"the operator used switched-off features: {attempted}"


def test_with_the_pool_on_the_created_pod_matches_the_review(
    webhook: ChartOperator, kube_api: KubeApi
) -> None:
    """The happy path still claims exactly one volume (the edges above changed nothing)."""
    pod = opted_in_pod("fine")

    result = patched(pod, webhook.review(pod))

    assert list(kube_api.items(kube_api.pvcs_path)) == [
        result["metadata"]["annotations"]["durable.dev/buffer-volume"]]
