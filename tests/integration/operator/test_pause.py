"""Pausing one DurableProducer by annotation: the real operator leaves it alone meanwhile."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.contract import GROUP, PAUSE_ANNOTATION
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


def wait_paused(kubernetes_api: KubernetesApi) -> None:
    wait_for(lambda: condition(kubernetes_api, pause.PAUSED_CONDITION).get("status") == "True",
             timeout=60, what="ReconciliationPaused=True")


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


# kopf's record of the reconcile handler for the current change (startup.configure_kopf keeps
# handler progress in annotations prefixed with our group): "succeeded for this update".
RECONCILE_PROGRESS = f"{GROUP}/reconcile_durable_producer"
HANDLED = {"started": "2026-01-01T00:00:00+00:00", "stopped": "2026-01-01T00:00:00+00:00",
           "purpose": "update", "retries": 1, "success": True, "failure": False}


def test_a_resumed_edit_is_reconciled_even_when_kopf_believes_it_handled(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    """The cause of the resume flake, made deterministic.

    kopf's change handlers are edge-triggered: it runs reconcile for a change unless its
    progress record says reconcile already succeeded for it. kopf takes a stale watch event
    for the current state when the event's resourceVersion matches its own last patch (the
    emulator never changes resourceVersion) or when the echo of its patch is late by more than
    settings.persistence.consistency_timeout (5 s; a slow API server); it then re-writes an
    older progress record, "reconcile succeeded", that belongs to the paused run. When the
    pause annotation goes, kopf skips reconcile, and the edit made during the pause stayed
    unreconciled until something else changed. Here that progress record is written on
    purpose; the level-triggered resync timer must reconcile the generation all the same.
    """
    kubernetes_api.create(durable_producer())
    start_webhook_operator()
    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 1, timeout=60,
             what="reconciled")
    annotate(kubernetes_api, "true")
    wait_paused(kubernetes_api)
    kubernetes_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 8 * 2**20}})
    time.sleep(2)  # the paused update is handled (and recorded as handled)

    status, answer = api_call(
        kubernetes_api, "PATCH", f"{COLLECTION_PATH}/orders",
        {"metadata": {"annotations": {RECONCILE_PROGRESS: json.dumps(HANDLED),
                                      PAUSE_ANNOTATION: None}}},
    )  # fmt: skip
    assert status == 200, answer

    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 2,
             timeout=60, what="the edit made during the pause reconciled")
    resumed = condition(kubernetes_api, pause.PAUSED_CONDITION)
    assert (resumed["status"], resumed["reason"]) == ("False", conditions.REASON_RESUMED)
    ready = condition(kubernetes_api, conditions.READY)
    assert ready["observedGeneration"] == 2, ready


def test_an_edit_during_a_pause_and_an_operator_restart_is_reconciled_on_resume(
    kubernetes_api: KubernetesApi, start_webhook_operator: Callable[..., WebhookOperator]
) -> None:
    kubernetes_api.create(durable_producer())
    first = start_webhook_operator()
    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 1, timeout=60,
             what="reconciled")
    size = status_of(kubernetes_api)["bufferSize"]
    annotate(kubernetes_api, "true")
    wait_paused(kubernetes_api)

    first.process.stop()
    kubernetes_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 8 * 2**20}})
    start_webhook_operator()
    time.sleep(2)  # the restarted operator resumes the paused object and leaves it alone
    assert status_of(kubernetes_api)["observedGeneration"] == 1

    annotate(kubernetes_api, None)
    wait_for(lambda: status_of(kubernetes_api).get("observedGeneration") == 2,
             timeout=60, what="the edit made during the pause reconciled after the restart")
    assert status_of(kubernetes_api)["bufferSize"] != size
