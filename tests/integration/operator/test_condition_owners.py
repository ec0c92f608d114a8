"""Each writer of a DurableProducer's conditions owns its types, on the real API server.

The reconcile handler and the pool timer both write ``status.conditions``. The steps of the
two writers are run by the test against the real API server (its server-side apply, the
list map keyed by ``type``, the status subresource and the CRD's 32,768-character message
limit), in the order that lost updates before (review D7): each wrote the whole list from its
own view with a merge patch, so the later write from an older view removed or reverted the
other's conditions.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest

from durable_producer.contract import (
    BACKLOG_METRIC,
    CANNOT_DRAIN_METRIC,
    FORWARD_RATE_METRICS,
    INGEST_RATE_METRICS,
    PAUSE_ANNOTATION,
)
from durable_producer.operator import handlers
from durable_producer.operator.act import cluster as cluster_module
from durable_producer.operator.act import pool_actions, status_writes
from durable_producer.operator.act.api_access import POOL_USER_AGENT
from durable_producer.operator.decide import agent_figures, pool_status
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.model.conditions import MAX_CONDITION_MESSAGE, POOL_CONDITIONS
from durable_producer.operator.settings import OperatorConfig
from integration.operator.test_operator_on_api_server import condition, durable_producer
from support.kube_harness import KubeApi
from support.operator_clients import operator_clients_on

pytestmark = pytest.mark.integration

LOGGER = logging.getLogger(__name__)
CONFIG = OperatorConfig()  # the volume pool on: Degraded is the pool timer's


@pytest.fixture()
def operator_clients(kube_api: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's own API clients (act/cluster.py) reach this API server as the admin."""
    operator_clients_on(kube_api.cluster, monkeypatch)


def reconcile(kube_api: KubeApi, body: dict[str, Any]) -> None:
    """The reconcile handler on ``body`` (kopf's view of the object), and kopf's merge patch
    of what it left in ``patch.status``, as kopf sends it."""
    patch = kopf.Patch()
    memo = kopf.Memo({handlers.CONFIG_KEY: CONFIG})  # as kopf gives a handler
    handlers.reconcile_status(kopf.Body(body), kopf.Body(body).meta, patch, LOGGER, memo)
    if patch.get("status"):
        status, answer = kube_api.call(
            "PATCH", f"{kube_api.collection_path}/orders/status", {"status": dict(patch["status"])},
            content_type="application/merge-patch+json")
        assert status == 200, answer


def cannot_drain_figures() -> agent_figures.AgentFigures:
    exposition = "\n".join([
        f"{BACKLOG_METRIC} 100.0", f"{CANNOT_DRAIN_METRIC} 1.0",
        f"{INGEST_RATE_METRICS[0]} 13000", f"{INGEST_RATE_METRICS[1]} 2600000",
        f"{FORWARD_RATE_METRICS[0]} 10000", f"{FORWARD_RATE_METRICS[1]} 2000000",
    ])
    return agent_figures.agent_figures({"http://pod-a/metrics": exposition})


def pool_timer_publishes(body: dict[str, Any], problems: list[str]) -> bool:
    """One pool-timer publication from ``body`` (its view when the run started)."""
    now = datetime.now(UTC)
    plan = vp.plan_pool([], [], [], now, CONFIG.pool)
    plan.problems.extend(problems)
    update = pool_status.pool_status_update(body, plan, [], 100, now, cannot_drain_figures())
    return pool_actions.publish_pool_status(body, update.changes, LOGGER)


def types(obj: dict[str, Any] | None) -> dict[str, str]:
    return {c["type"]: c["reason"] for c in ((obj or {}).get("status") or {}).get("conditions")
            or []}


def test_a_reconcile_from_an_older_view_keeps_the_pool_timers_conditions(
    kube_api: KubeApi, operator_clients: None
) -> None:
    """kopf can hand the reconcile handler a view older than the pool timer's last write: a
    stale watch event it accepts after its consistency timeout (handlers.py), a handler
    retried on its event's body. Before: reconcile merge-patched the whole conditions list of
    that view, so the pool timer's BacklogCannotDrain was removed and its Degraded
    (VolumePoolProblem) put back to the spec's AsExpected. The pool timer's message, a
    problem naming 2,000 volumes, is capped below the CRD's limit (else 422)."""
    kube_api.create(durable_producer("orders"))
    reconcile(kube_api, kube_api.get("orders") or {})
    edited = kube_api.patch_spec("orders", {"throughput": {"peakBytesPerSecond": 2 * 2**20}})
    reconcile(kube_api, edited)  # generation 2, from the update event's body
    settled = kube_api.get("orders") or {}
    assert settled["status"]["observedGeneration"] == 2

    failing = [f"drain Job for volume orders-buffer-{i:05d} failed" for i in range(2000)]
    assert len("; ".join(failing)) > MAX_CONDITION_MESSAGE
    assert pool_timer_publishes(settled, failing)
    published = kube_api.get("orders")
    assert types(published) == {"Ready": "Reconciled", "Degraded": "VolumePoolProblem",
                                "BacklogCannotDrain": "IngestAboveForwardRate"}
    message = (condition(published, "Degraded") or {})["message"]
    assert len(message) <= MAX_CONDITION_MESSAGE and "characters in all" in message

    reconcile(kube_api, edited)  # the same event again: a view older than the timer's write

    after = kube_api.get("orders")
    assert types(after) == types(published), "reconcile removed or reverted the pool's"
    assert condition(after, "Degraded") == condition(published, "Degraded")
    assert condition(after, "Ready") == condition(published, "Ready")


def test_the_pool_timer_never_touches_reconciles_conditions(
    kube_api: KubeApi, operator_clients: None
) -> None:
    """The review's race: a pool-timer run that read the object before a pause wrote its
    conditions after reconcile had written ReconciliationPaused, and so removed it. The
    timer's publication from its older view is refused (409, a fresh run publishes), and
    even an apply of the timer's types from that view leaves reconcile's as they are."""
    kube_api.create(durable_producer("orders"))
    reconcile(kube_api, kube_api.get("orders") or {})
    timer_view = kube_api.get("orders") or {}
    kube_api.annotate("orders", {PAUSE_ANNOTATION: "true"})
    reconcile(kube_api, kube_api.get("orders") or {})
    paused = kube_api.get("orders")
    assert types(paused) == {"Ready": "Reconciled", "ReconciliationPaused": "PauseAnnotation"}

    assert not pool_timer_publishes(timer_view, ["pod x runs without a buffer agent"])
    now = datetime.now(UTC)
    plan = vp.plan_pool([], [], [], now, CONFIG.pool)
    plan.problems.append("pod x runs without a buffer agent")
    stale = pool_status.pool_status_update(timer_view, plan, [], 100, now, cannot_drain_figures())
    status_writes.apply_conditions(
        cluster_module.cluster(POOL_USER_AGENT), timer_view, stale.changes["conditions"],
        POOL_CONDITIONS, status_writes.POOL_FIELD_MANAGER)

    after = kube_api.get("orders")
    assert types(after) == {"Ready": "Reconciled", "ReconciliationPaused": "PauseAnnotation",
                            "Degraded": "VolumePoolProblem",
                            "BacklogCannotDrain": "IngestAboveForwardRate"}
    assert condition(after, "ReconciliationPaused") == condition(paused, "ReconciliationPaused")
    assert condition(after, "Ready") == condition(paused, "Ready")
