"""Pausing one DurableProducer by annotation: the real operator leaves it alone meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.contract import PAUSE_ANNOTATION
from durable_producer.operator import conditions, pause
from integration.operator.operator_harness import COLLECTION_PATH, KubernetesApi
from integration.operator.test_webhook_harness import (
    WebhookOperator,
    api_call,
    durable_producer,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration


def annotate(kubernetes_api: KubernetesApi, value: str | None) -> None:
    status, answer = api_call(kubernetes_api, "PATCH", f"{COLLECTION_PATH}/orders",
                              {"metadata": {"annotations": {PAUSE_ANNOTATION: value}}})
    assert status == 200, answer


def status_of(kubernetes_api: KubernetesApi) -> dict[str, Any]:
    return dict((kubernetes_api.get("orders") or {}).get("status") or {})


def condition(kubernetes_api: KubernetesApi, kind: str) -> dict[str, Any]:
    return next((c for c in status_of(kubernetes_api).get("conditions") or []
                 if c["type"] == kind), {})


def test_a_paused_producer_is_not_reconciled_until_the_annotation_goes(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    start_webhook_operator()
    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 1, timeout=60,
             what="reconciled")
    size = status_of(kubernetes_api)["bufferSize"]

    annotate(kubernetes_api, "true")
    wait_for(lambda: condition(kubernetes_api, pause.PAUSED_CONDITION).get("status") == "True",
             timeout=60, what="ReconciliationPaused=True")
    kubernetes_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 8 * 2**20}})
    time.sleep(2)

    paused_status = status_of(kubernetes_api)
    assert condition(kubernetes_api, pause.PAUSED_CONDITION)["reason"] == conditions.REASON_PAUSED
    assert paused_status["observedGeneration"] == 1  # the change waits
    assert paused_status["bufferSize"] == size

    annotate(kubernetes_api, None)
    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 2,
             timeout=60, what="the change reconciled after the pause")
    resumed = condition(kubernetes_api, pause.PAUSED_CONDITION)
    assert (resumed["status"], resumed["reason"]) == ("False", conditions.REASON_RESUMED)
    assert status_of(kubernetes_api)["bufferSize"] != size


def test_deleting_a_paused_producer_waits_for_the_pause_to_end(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    start_webhook_operator()
    wait_for(lambda: (kubernetes_api.get("orders") or {}).get("metadata", {}).get("finalizers"),
             timeout=60, what="the finalizer")
    annotate(kubernetes_api, "true")
    wait_for(lambda: condition(kubernetes_api, pause.PAUSED_CONDITION).get("status") == "True",
             timeout=60, what="ReconciliationPaused=True")

    kubernetes_api.delete("orders")
    time.sleep(2)
    assert kubernetes_api.get("orders") is not None  # the finalizer holds while paused

    annotate(kubernetes_api, None)
    wait_for(lambda: kubernetes_api.get("orders") is None, timeout=60,
             what="the deletion to finish")
