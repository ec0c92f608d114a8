"""Upgrading the agent: status.outdatedAgents counts the pods still on the old one.

The chart's operator on the real API server; pods are created through it (the webhook) and run
by kwok. The agent image is an operator setting (the Helm
release's agent.image, env DURABLE_PRODUCER_AGENT_IMAGE): a `helm upgrade` restarts the
operator with a new one. Pods admitted before keep the agent they got (the operator never
restarts them); each one recreated goes through the webhook again and gets the new agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.contract import AGENT_HASH_ANNOTATION
from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import durable_producer, opted_in_pod

pytestmark = pytest.mark.integration

OLD_IMAGE = "registry.example/durable-agent:1.0"
NEW_IMAGE = "registry.example/durable-agent:1.1"


def run_pod(kube_api: KubeApi, name: str) -> dict[str, Any]:
    """What a ReplicaSet's pod goes through: created (the API server calls the webhook), then
    scheduled and Running."""
    return kube_api.run_pod(opted_in_pod(name))


def status_of(kube_api: KubeApi) -> dict[str, Any]:
    return dict((kube_api.get("orders") or {}).get("status") or {})


def outdated_becomes(kube_api: KubeApi, count: int, attached: int) -> None:
    """Both figures come from the same pool timer run."""
    wait_for(lambda: (status_of(kube_api).get("outdatedAgents"),
                      status_of(kube_api).get("attachedPods")) == (count, attached),
             timeout=60, what=f"status.outdatedAgents = {count} of {attached} attached pods")


def test_a_new_agent_image_counts_old_pods_until_they_are_recreated(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    before = start_chart_operator(DURABLE_PRODUCER_AGENT_IMAGE=OLD_IMAGE)
    pods = [run_pod(kube_api, name) for name in ("orders-1", "orders-2")]
    outdated_becomes(kube_api, 0, attached=2)
    old_hashes = {pod["metadata"]["annotations"][AGENT_HASH_ANNOTATION] for pod in pods}

    before.process.stop()  # helm upgrade: the operator restarts with the new agent image
    start_chart_operator(DURABLE_PRODUCER_AGENT_IMAGE=NEW_IMAGE)
    outdated_becomes(kube_api, 2, attached=2)

    kube_api.delete_pod("orders-1")  # kubectl rollout restart, one pod at a time
    renewed = run_pod(kube_api, "orders-1b")
    outdated_becomes(kube_api, 1, attached=2)
    kube_api.delete_pod("orders-2")
    run_pod(kube_api, "orders-2b")
    outdated_becomes(kube_api, 0, attached=2)

    assert len(old_hashes) == 1
    assert renewed["metadata"]["annotations"][AGENT_HASH_ANNOTATION] not in old_hashes
    assert renewed["spec"]["initContainers"][0]["image"] == NEW_IMAGE


def test_a_spec_change_that_changes_the_agent_counts_too(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer())
    start_chart_operator()
    run_pod(kube_api, "orders-1")
    outdated_becomes(kube_api, 0, attached=1)

    kube_api.patch_spec("orders", {"fsync": {"policy": "always"}})

    outdated_becomes(kube_api, 1, attached=1)
    run_pod(kube_api, "orders-2")  # a new pod gets the new agent
    outdated_becomes(kube_api, 1, attached=2)
