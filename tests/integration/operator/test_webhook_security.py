"""The webhook's edges, against the real operator (kopf run) and the API emulator: operations
other than CREATE, name clashes, namespaces it may not read, a hanging API server, and an
installation with the volume pool switched off."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.operator import api_access
from integration.operator.operator_harness import KubernetesApi
from integration.operator.test_webhook_harness import (
    PVCS_PATH,
    WebhookOperator,
    answer_with,
    durable_producer,
    forbidden,
    items,
    opted_in_pod,
    patched,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration

PRODUCERS_PATH = "/apis/durable.dev/v1alpha1/namespaces/{namespace}/durableproducers"


@pytest.fixture()
def webhook(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> WebhookOperator:
    kubernetes_api.create(durable_producer("orders"))
    return start_webhook_operator()


def test_an_update_review_is_admitted_untouched_and_claims_nothing(
    webhook: WebhookOperator, kubernetes_api: KubernetesApi
) -> None:
    """The chart sends only CREATE; should anything send an UPDATE (a hand-made
    configuration, an older chart), kopf calls the handler anyway: it must not mutate."""
    pod = opted_in_pod("running")

    response = webhook.review(pod, operation="UPDATE")

    assert response["allowed"] is True
    assert "patch" not in response
    assert items(kubernetes_api, PVCS_PATH) == {}
    assert webhook.review(pod, operation="DELETE")["allowed"] is True
    assert items(kubernetes_api, PVCS_PATH) == {}


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
    webhook: WebhookOperator, kubernetes_api: KubernetesApi, pod: dict[str, Any], message: str
) -> None:
    response = webhook.review(pod)

    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert "DurableProducer default/orders" in response["status"]["message"]
    assert "patch" not in response
    assert items(kubernetes_api, PVCS_PATH) == {}  # refused before claiming anything


def test_a_pod_in_a_namespace_the_operator_may_not_read_gets_a_clear_refusal(
    webhook: WebhookOperator, kubernetes_api: KubernetesApi
) -> None:
    """With operator.watchNamespaces the operator has no Role elsewhere: the API answers 403.
    The chart keeps such pods away from the webhook (namespaceSelector); should one come
    anyway, the refusal says why, instead of an internal error (500)."""
    path = PRODUCERS_PATH.format(namespace="elsewhere") + "/orders"
    answer_with(kubernetes_api, f"get {path}", 403, forbidden("durableproducers.durable.dev"))
    pod = opted_in_pod("stray")
    pod["metadata"]["namespace"] = "elsewhere"

    response = webhook.review(pod)

    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert "may not read DurableProducer orders in namespace elsewhere" in message
    assert "operator.watchNamespaces" in message and "durable.dev/producer" in message


def test_the_admission_answers_within_the_webhook_timeout_when_the_api_hangs(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    """The API server gives up on the webhook after webhook.timeoutSeconds; the operator's own
    API calls stop before that and the pod is refused with the reason (its controller
    retries), rather than the API server timing out with no reason at all."""
    async def hang() -> int:
        await asyncio.sleep(30)
        return 404

    path = PRODUCERS_PATH.format(namespace="default") + "/orders"
    answer_with(kubernetes_api, f"get {path}", hang)
    webhook = start_webhook_operator(DURABLE_PRODUCER_WEBHOOK_TIMEOUT_SECONDS="2")

    started = time.monotonic()
    response = webhook.review(opted_in_pod("patient"))
    elapsed = time.monotonic() - started

    # 1 s of API budget; the rest is this loaded test machine (a hung call would take 30 s).
    assert elapsed < 8, f"answered after {elapsed:.1f}s"
    assert response["allowed"] is False
    assert response["status"]["code"] == 504
    assert "did not answer within 1s" in response["status"]["message"]


def ready(kubernetes_api: KubernetesApi, name: str) -> bool:
    conditions = ((kubernetes_api.get(name) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_with_the_volume_pool_off_a_durable_producer_stays_deletable(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    """rbac.features.* off: the chart grants no pods, PVCs, Jobs or ConfigMaps (403) and tells
    the operator so; it registers none of their handlers, adds no finalizer, and the
    DurableProducer goes at once. (A finalizer left by a former installation is removed by
    kopf when no handler needs it: test_handlers.py checks that none does.)"""
    for request, resource in [
        ("get /api/v1/namespaces/default/pods", "pods"),
        ("get /api/v1/namespaces/default/persistentvolumeclaims", "persistentvolumeclaims"),
        ("post /api/v1/namespaces/default/persistentvolumeclaims", "persistentvolumeclaims"),
        ("get /apis/batch/v1/namespaces/default/jobs", "jobs.batch"),
        ("post /apis/batch/v1/namespaces/default/jobs", "jobs.batch"),
        ("get /api/v1/namespaces/default/configmaps/orders-spark-templates", "configmaps"),
        ("post /api/v1/namespaces/default/configmaps", "configmaps"),
    ]:
        answer_with(kubernetes_api, request, 403, forbidden(resource))
    kubernetes_api.create(durable_producer("orders"))
    start_webhook_operator(serve_webhook=False, DURABLE_PRODUCER_FEATURES="")
    wait_for(lambda: ready(kubernetes_api, "orders"), what="Ready=True (the core still runs)")
    time.sleep(2)  # several pool intervals: a registered timer would have run by now

    assert not (kubernetes_api.get("orders") or {})["metadata"].get("finalizers")
    kubernetes_api.delete("orders")

    wait_for(lambda: kubernetes_api.get("orders") is None, timeout=15,
             what="the DurableProducer to be deleted")
    feature_agents = {api_access.POOL_USER_AGENT, api_access.SPARK_TEMPLATES_USER_AGENT}
    attempted = [(r.method, r.path) for r in kubernetes_api.requests()
                 if r.user_agent in feature_agents]
    assert attempted == [], f"the operator used switched-off features: {attempted}"


def test_with_the_pool_on_the_created_pod_matches_the_review(
    webhook: WebhookOperator, kubernetes_api: KubernetesApi
) -> None:
    """The happy path still claims exactly one volume (the edges above changed nothing)."""
    pod = opted_in_pod("fine")

    result = patched(pod, webhook.review(pod))

    assert list(items(kubernetes_api, PVCS_PATH)) == [
        result["metadata"]["annotations"]["durable.dev/buffer-volume"]]
