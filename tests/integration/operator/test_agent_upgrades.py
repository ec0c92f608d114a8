"""Upgrading the agent: status.outdatedAgents counts the pods still on the old one.

The real operator against the emulator. The agent image is an operator setting (the Helm
release's agent.image, env DURABLE_PRODUCER_AGENT_IMAGE): a `helm upgrade` restarts the
operator with a new one. Pods admitted before keep the agent they got (the operator never
restarts them); each one recreated goes through the webhook again and gets the new agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.contract import AGENT_HASH_ANNOTATION
from integration.operator.operator_harness import KubernetesApi
from integration.operator.test_webhook_harness import (
    PODS_PATH,
    WebhookOperator,
    api_call,
    durable_producer,
    opted_in_pod,
    patched,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration

OLD_IMAGE = "registry.example/durable-agent:1.0"
NEW_IMAGE = "registry.example/durable-agent:1.1"


def run_pod(webhook: WebhookOperator, kubernetes_api: KubernetesApi, name: str) -> dict[str, Any]:
    """What a ReplicaSet's pod goes through: the webhook, then created and Running."""
    pod = opted_in_pod(name)
    response = webhook.review(pod)
    assert response["allowed"] is True, response
    admitted = patched(pod, response)
    admitted["status"] = {"phase": "Running"}
    status, created = api_call(kubernetes_api, "POST", PODS_PATH, admitted)
    assert status in (200, 201), created
    return admitted


def delete_pod(kubernetes_api: KubernetesApi, name: str) -> None:
    status, answer = api_call(kubernetes_api, "DELETE", f"{PODS_PATH}/{name}")
    assert status == 200, answer


def status_of(kubernetes_api: KubernetesApi) -> dict[str, Any]:
    return dict((kubernetes_api.get("orders") or {}).get("status") or {})


def outdated_becomes(kubernetes_api: KubernetesApi, count: int, attached: int) -> None:
    """Both figures come from the same pool timer run."""
    wait_for(lambda: (status_of(kubernetes_api).get("outdatedAgents"),
                      status_of(kubernetes_api).get("attachedPods")) == (count, attached),
             timeout=60, what=f"status.outdatedAgents = {count} of {attached} attached pods")


def test_a_new_agent_image_counts_old_pods_until_they_are_recreated(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    before = start_webhook_operator(DURABLE_PRODUCER_AGENT_IMAGE=OLD_IMAGE)
    pods = [run_pod(before, kubernetes_api, name) for name in ("orders-1", "orders-2")]
    outdated_becomes(kubernetes_api, 0, attached=2)
    old_hashes = {pod["metadata"]["annotations"][AGENT_HASH_ANNOTATION] for pod in pods}

    before.process.stop()  # helm upgrade: the operator restarts with the new agent image
    after = start_webhook_operator(DURABLE_PRODUCER_AGENT_IMAGE=NEW_IMAGE)
    outdated_becomes(kubernetes_api, 2, attached=2)

    delete_pod(kubernetes_api, "orders-1")  # kubectl rollout restart, one pod at a time
    renewed = run_pod(after, kubernetes_api, "orders-1b")
    outdated_becomes(kubernetes_api, 1, attached=2)
    delete_pod(kubernetes_api, "orders-2")
    run_pod(after, kubernetes_api, "orders-2b")
    outdated_becomes(kubernetes_api, 0, attached=2)

    assert len(old_hashes) == 1
    assert renewed["metadata"]["annotations"][AGENT_HASH_ANNOTATION] not in old_hashes
    assert renewed["spec"]["initContainers"][0]["image"] == NEW_IMAGE


def test_a_spec_change_that_changes_the_agent_counts_too(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    webhook = start_webhook_operator()
    run_pod(webhook, kubernetes_api, "orders-1")
    outdated_becomes(kubernetes_api, 0, attached=1)

    kubernetes_api.patch_spec("orders", {"fsync": {"policy": "always"}})

    outdated_becomes(kubernetes_api, 1, attached=1)
    run_pod(webhook, kubernetes_api, "orders-2")  # a new pod gets the new agent
    outdated_becomes(kubernetes_api, 1, attached=2)
