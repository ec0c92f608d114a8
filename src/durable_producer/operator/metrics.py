"""The operator's Prometheus metrics (prometheus-client), served by http_endpoint.py.

What each replica counts itself:

- ``durable_operator_handler_runs_total{handler, result}``: every run of a kopf handler
  (``reconcile``, ``spark-templates``, ``volume-pool``, ``drain-volumes``); result ``success``,
  ``retry`` (kopf.TemporaryError: waiting, e.g. for drains) or ``error``. Only the replica that
  leads (kopf peering) runs handlers, so on the others these stay still.
- ``durable_operator_admission_requests_total{result}`` and
  ``durable_operator_admission_duration_seconds{result}``: every pod review the webhook
  answered, on every replica, timed from its arrival; result ``mutated``, ``admitted``
  (nothing to add: an update, an opt-out, a re-invocation), ``refused`` (the pod is wrong:
  4xx) or ``failed`` (the operator could not do its part: API errors, deadlines, a busy
  DurableProducer).
- ``durable_operator_drains_total{result}``: drain Jobs ``started``, ``succeeded``, ``failed``.
- ``durable_operator_volume_claim_failures_total{namespace, durable_producer}``: pods refused
  because the pool could hand out no volume (PVC creation refused: quota, storage class; or
  claims conflicting again and again): the pool is exhausted.
- ``durable_operator_volumes{namespace, durable_producer, state}`` and
  ``durable_operator_outdated_agents{namespace, durable_producer}``: from the pool timer, as
  published in status. Kept only while fresh (a few pool intervals), so a replica that stops
  leading, or a DurableProducer that is gone, drops out instead of repeating old figures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from durable_producer.operator.decide import volume_pool
from durable_producer.operator.decide.kube_objects import Object, name_of

RESULT_SUCCESS: Final = "success"
RESULT_RETRY: Final = "retry"
RESULT_ERROR: Final = "error"
ADMISSION_MUTATED: Final = "mutated"
ADMISSION_ADMITTED: Final = "admitted"
ADMISSION_REFUSED: Final = "refused"
ADMISSION_FAILED: Final = "failed"
DRAIN_STARTED: Final = "started"
DRAIN_SUCCEEDED: Final = "succeeded"
DRAIN_FAILED: Final = "failed"
# status.volumes key -> the state label.
VOLUME_STATES: Final = {"inUse": "InUse", "claimed": "Claimed", "free": "Free",
                        "draining": "Draining"}  # fmt: skip
DEFAULT_STALE_AFTER_SECONDS = 60.0

REGISTRY = CollectorRegistry(auto_describe=True)

HANDLER_RUNS = Counter(
    "durable_operator_handler_runs",
    "Runs of the operator's kopf handlers, by handler and result (success, retry, error).",
    ["handler", "result"],
    registry=REGISTRY,
)
ADMISSION_REQUESTS = Counter(
    "durable_operator_admission_requests",
    "Pod admission reviews answered, by result (mutated, admitted, refused, failed).",
    ["result"],
    registry=REGISTRY,
)
ADMISSION_DURATION = Histogram(
    "durable_operator_admission_duration_seconds",
    "Time to answer one pod admission review, by result.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 9.0, 15.0),
    registry=REGISTRY,
)
CLAIM_FAILURES = Counter(
    "durable_operator_volume_claim_failures",
    "Pods refused because no buffer volume could be claimed or created for them.",
    ["namespace", "durable_producer"],
    registry=REGISTRY,
)
DRAINS = Counter(
    "durable_operator_drains",
    "Drain Jobs by result (started, succeeded, failed).",
    ["result"],
    registry=REGISTRY,
)


class PoolFigures(Collector):
    """Per-DurableProducer gauges from the pool timer, dropped once stale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures: dict[tuple[str, str], tuple[float, dict[str, int], int | None]] = {}
        self.stale_after_seconds = DEFAULT_STALE_AFTER_SECONDS

    def observe(self, namespace: str, producer: str, status: Mapping[str, Any]) -> None:
        volumes = status.get("volumes") or {}
        counts = {state: int(volumes.get(key) or 0) for key, state in VOLUME_STATES.items()}
        outdated = status.get("outdatedAgents")
        with self._lock:
            self._figures[(namespace, producer)] = (
                time.monotonic(), counts, outdated if isinstance(outdated, int) else None
            )

    def forget(self, namespace: str, producer: str) -> None:
        with self._lock:
            self._figures.pop((namespace, producer), None)

    def collect(self) -> Iterator[Metric]:
        volumes = GaugeMetricFamily(
            "durable_operator_volumes",
            "Buffer volumes of a DurableProducer's pool by state (as in status.volumes).",
            labels=["namespace", "durable_producer", "state"],
        )
        outdated = GaugeMetricFamily(
            "durable_operator_outdated_agents",
            "Pods whose agent differs from what the webhook would inject now"
            " (status.outdatedAgents).",
            labels=["namespace", "durable_producer"],
        )
        now = time.monotonic()
        with self._lock:
            fresh = [
                (key, counts, count)
                for key, (seen, counts, count) in self._figures.items()
                if now - seen <= self.stale_after_seconds
            ]
        for (namespace, producer), counts, count in sorted(fresh, key=lambda item: item[0]):
            for state, value in counts.items():
                volumes.add_metric([namespace, producer, state], value)
            if count is not None:
                outdated.add_metric([namespace, producer], count)
        yield volumes
        yield outdated


POOL_FIGURES = PoolFigures()
REGISTRY.register(POOL_FIGURES)


def configure(pool_interval_seconds: float) -> None:
    """Pool gauges stay while the timer refreshes them: three intervals and some slack."""
    POOL_FIGURES.stale_after_seconds = 3 * pool_interval_seconds + 30.0


def handler_run(handler: str, result: str) -> None:
    HANDLER_RUNS.labels(handler=handler, result=result).inc()


def admission_answered(result: str, seconds: float) -> None:
    ADMISSION_REQUESTS.labels(result=result).inc()
    ADMISSION_DURATION.labels(result=result).observe(seconds)


def claim_failed(namespace: str, producer: str) -> None:
    CLAIM_FAILURES.labels(namespace=namespace, durable_producer=producer).inc()


def observe_drains(jobs_to_create: Iterable[str], finished_jobs: Iterable[Object]) -> None:
    """Drain Jobs the pool timer starts, and the finished ones it collects (deletes)."""
    for _ in jobs_to_create:
        DRAINS.labels(result=DRAIN_STARTED).inc()
    for job in finished_jobs:
        outcome = volume_pool.job_outcome(job)
        if outcome in (DRAIN_SUCCEEDED, DRAIN_FAILED):
            DRAINS.labels(result=outcome).inc()


def observe_pool_run(plan: volume_pool.PoolPlan, jobs: Iterable[Object]) -> None:
    """What one pool run did about drains (called by pool_actions.run_pool)."""
    collected = set(plan.jobs_to_delete)
    observe_drains(plan.jobs_to_create, [job for job in jobs if name_of(job) in collected])


def register_defaults(names: Iterable[tuple[str, str]]) -> None:
    """Create label sets at zero, so that rates and alerts see them before the first event."""
    for handler, result in names:
        HANDLER_RUNS.labels(handler=handler, result=result)
    for result in (ADMISSION_MUTATED, ADMISSION_ADMITTED, ADMISSION_REFUSED, ADMISSION_FAILED):
        ADMISSION_REQUESTS.labels(result=result)
    for result in (DRAIN_STARTED, DRAIN_SUCCEEDED, DRAIN_FAILED):
        DRAINS.labels(result=result)
