"""kopf handlers that attach agents to pods and keep each DurableProducer's volume pool.

Thin: the decisions are in pod_mutation.py and volume_pool.py; these handlers read the
cluster, call them, and write back. Loaded with the other handlers (handlers.py imports this
module) or on its own: ``kopf run -m durable_producer.operator.webhook_handlers``.

- ``attach-buffer-agent`` (mutating admission, pods, CREATE): adds the agent sidecar, env and
  a buffer volume claimed from the pool. The MutatingWebhookConfiguration comes from the Helm
  chart and calls ``https://<service>/attach-buffer-agent``.
- ``volume-pool`` (timer per DurableProducer): releases volumes whose pods are gone, starts
  drain Jobs, finishes drains, deletes idle empty volumes, audits pods and publishes figures.
- ``drain-volumes`` (deletion): holds the DurableProducer until every volume is drained and
  deleted.

Claims and pool changes for one DurableProducer are serialized by a lock in this process
(the operator runs as a single replica) and, across processes, by resourceVersion
preconditions that the API server enforces.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from durable_producer.operator import pod_mutation, reconcile, volume_pool
from durable_producer.operator.kube_client import api_client
from durable_producer.operator.model import GROUP, PLURAL, VERSION, DurableProducerSpec

MUTATION_WEBHOOK_ID = "attach-buffer-agent"
USER_AGENT = "durable-producer-operator"
REASON_POOL_PROBLEM = "VolumePoolProblem"
CLAIM_ATTEMPTS = 5
# Per agent: a slow one must not stall the pool timer for long.
METRICS_TIMEOUT_SECONDS = 1.0

WEBHOOK_ADDR_ENV = "DURABLE_PRODUCER_WEBHOOK_ADDR"
WEBHOOK_PORT_ENV = "DURABLE_PRODUCER_WEBHOOK_PORT"
WEBHOOK_CERT_FILE_ENV = "DURABLE_PRODUCER_WEBHOOK_CERT_FILE"
WEBHOOK_KEY_FILE_ENV = "DURABLE_PRODUCER_WEBHOOK_KEY_FILE"
POOL_INTERVAL_ENV = "DURABLE_PRODUCER_POOL_INTERVAL_SECONDS"

# Kubernetes API access of this module, in the form of handlers.KUBERNETES_API_ACCESS.
POOL_API_ACCESS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, PLURAL, ("get",)),
    ("", "pods", ("list",)),
    ("", "persistentvolumeclaims", ("list", "create", "patch", "delete")),
    ("batch", "jobs", ("list", "create", "delete")),
)

RESOURCE = (GROUP, VERSION, PLURAL)


def _interval_from_environ(environ: Mapping[str, str]) -> float:
    try:
        interval = float(environ.get(POOL_INTERVAL_ENV, "10"))
    except ValueError:
        return 10.0
    return interval if interval > 0 else 10.0


POOL_INTERVAL_SECONDS = _interval_from_environ(os.environ)


@dataclass(frozen=True)
class WebhookSettings:
    """Where kopf's webhook server listens, with the certificate the chart mounts.

    No certificate configured means no webhook server (e.g. the operator runs without the
    webhook feature); kopf's own self-signed generation needs oscrypto, whose released
    version cannot load OpenSSL 3, so certificates always come from files.
    """

    addr: str = "0.0.0.0"
    port: int = 9443
    certfile: str | None = None
    keyfile: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.certfile and self.keyfile)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WebhookSettings:
        try:
            port = int(environ.get(WEBHOOK_PORT_ENV, "9443"))
        except ValueError:
            port = 9443
        return cls(
            addr=environ.get(WEBHOOK_ADDR_ENV, "0.0.0.0"),
            port=port,
            certfile=environ.get(WEBHOOK_CERT_FILE_ENV) or None,
            keyfile=environ.get(WEBHOOK_KEY_FILE_ENV) or None,
        )


class Cluster:
    """The few Kubernetes API calls the pool needs, on raw JSON dicts (no field dropped)."""

    def __init__(self) -> None:
        client = api_client(USER_AGENT)
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data or b"null")

    def get_producer(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _items(self, response: Any, label: str, value: str) -> list[dict[str, Any]]:
        # Filter again here: selectors are a server feature some test servers lack.
        items = (self._json(response) or {}).get("items") or []
        return [
            item
            for item in items
            if ((item.get("metadata") or {}).get("labels") or {}).get(label) == value
        ]

    def pool_volumes(self, namespace: str, producer: str) -> list[dict[str, Any]]:
        selector = f"{volume_pool.POOL_LABEL}={producer}"
        return self._items(
            self.core.list_namespaced_persistent_volume_claim(
                namespace, label_selector=selector, _preload_content=False
            ),
            volume_pool.POOL_LABEL,
            producer,
        )

    def producer_pods(self, namespace: str, producer: str) -> list[dict[str, Any]]:
        selector = f"{pod_mutation.PRODUCER_LABEL}={producer}"
        return self._items(
            self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            ),
            pod_mutation.PRODUCER_LABEL,
            producer,
        )

    def drain_jobs(self, namespace: str, producer: str) -> list[dict[str, Any]]:
        selector = f"{volume_pool.POOL_LABEL}={producer}"
        return self._items(
            self.batch.list_namespaced_job(
                namespace, label_selector=selector, _preload_content=False
            ),
            volume_pool.POOL_LABEL,
            producer,
        )

    def patch_volume(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._json(
            self.core.patch_namespaced_persistent_volume_claim(
                name,
                namespace,
                patch,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )

    def create_volume(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.core.create_namespaced_persistent_volume_claim(
            namespace, manifest, _preload_content=False
        )

    def delete_volume(self, namespace: str, name: str, resource_version: str | None) -> None:
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version=resource_version)
        )
        self.core.delete_namespaced_persistent_volume_claim(
            name, namespace, body=options, _preload_content=False
        )

    def create_job(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.batch.create_namespaced_job(namespace, manifest, _preload_content=False)

    def delete_job(self, namespace: str, name: str) -> None:
        self.batch.delete_namespaced_job(
            name, namespace, propagation_policy="Background", _preload_content=False
        )


_cluster: Cluster | None = None
_cluster_lock = threading.Lock()
_producer_locks: dict[tuple[str, str], threading.Lock] = {}


def cluster() -> Cluster:
    global _cluster
    with _cluster_lock:
        if _cluster is None:
            _cluster = Cluster()
        return _cluster


def producer_lock(namespace: str, name: str) -> threading.Lock:
    with _cluster_lock:
        return _producer_locks.setdefault((namespace, name), threading.Lock())


def _ignore_statuses(action: Callable[[], object], *statuses: int) -> None:
    """Run an API call; the listed HTTP statuses mean it is already done (or moot)."""
    try:
        action()
    except ApiException as error:
        if error.status not in statuses:
            raise


@kopf.on.startup()
def configure_admission(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    """kopf's webhook server with the mounted certificate; the chart owns the configuration."""
    webhook = WebhookSettings.from_environ(os.environ)
    settings.admission.managed = None
    if not webhook.enabled:
        logger.warning(
            "no webhook certificate configured (%s, %s): pods are not mutated",
            WEBHOOK_CERT_FILE_ENV,
            WEBHOOK_KEY_FILE_ENV,
        )
        return
    settings.admission.server = kopf.WebhookServer(
        addr=webhook.addr, port=webhook.port, certfile=webhook.certfile, pkeyfile=webhook.keyfile
    )


def _reject(message: str) -> kopf.AdmissionError:
    return kopf.AdmissionError(message, code=400)


def _producer_spec(
    pod: Mapping[str, Any], namespace: str, producer: str
) -> tuple[dict[str, Any], DurableProducerSpec]:
    found = cluster().get_producer(namespace, producer)
    if found is None:
        raise _reject(
            f"pod opts in to DurableProducer {producer!r} (label {pod_mutation.PRODUCER_LABEL})"
            f" but no DurableProducer {namespace}/{producer} exists: create it first, or remove"
            " the label to run without a buffer agent"
        )
    if (found.get("metadata") or {}).get("deletionTimestamp"):
        raise _reject(f"DurableProducer {namespace}/{producer} is being deleted")
    spec = reconcile.parse_spec(found.get("spec"))
    if isinstance(spec, str):
        raise _reject(f"DurableProducer {namespace}/{producer} cannot be used: {spec}")
    return found, spec


def claim_volume(
    producer: Mapping[str, Any], spec: DurableProducerSpec, namespace: str, now: datetime
) -> str:
    """Claim a free pool volume for a pod being admitted, or create a new one."""
    name = str(producer["metadata"]["name"])
    policy = volume_pool.PoolPolicy.from_environ(os.environ)
    token = uuid.uuid4().hex
    conflicted: set[str] = set()
    api = cluster()
    with producer_lock(namespace, name):
        for _ in range(CLAIM_ATTEMPTS):
            candidate = volume_pool.choose_volume(
                api.pool_volumes(namespace, name),
                api.producer_pods(namespace, name),
                now,
                policy,
                exclude=conflicted,
            )
            if candidate is None:
                volume = volume_pool.volume_name(name, token[:8])
                api.create_volume(
                    namespace, volume_pool.new_volume_manifest(producer, spec, volume, token, now)
                )
                return volume
            volume = str(candidate["metadata"]["name"])
            try:
                api.patch_volume(namespace, volume, volume_pool.claim_patch(candidate, token, now))
            except ApiException as error:
                if error.status in (404, 409):
                    conflicted.add(volume)  # taken or deleted meanwhile: the next one
                    continue
                raise
            return volume
    raise kopf.AdmissionError(
        f"could not claim a buffer volume for DurableProducer {namespace}/{name} after"
        f" {CLAIM_ATTEMPTS} conflicting attempts; retry",
        code=409,
    )


def preview_volume(producer: Mapping[str, Any], namespace: str, now: datetime) -> str:
    """For dry-run requests: the volume a real request would likely get, claiming nothing."""
    name = str(producer["metadata"]["name"])
    api = cluster()
    candidate = volume_pool.choose_volume(
        api.pool_volumes(namespace, name),
        api.producer_pods(namespace, name),
        now,
        volume_pool.PoolPolicy.from_environ(os.environ),
    )
    if candidate is not None:
        return str(candidate["metadata"]["name"])
    return volume_pool.volume_name(name, "dry-run")


def attach_buffer_agent(
    body: kopf.Body,
    patch: kopf.Patch,
    dryrun: bool,
    warnings: list[str],
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Add the agent, env and a pool volume to an opted-in pod (idempotent on re-invocation)."""
    pod = copy.deepcopy(dict(body))
    producer_name = pod_mutation.producer_name(pod)
    namespace = (pod.get("metadata") or {}).get("namespace")
    if not producer_name or not namespace:
        raise _reject(
            f"an opted-in pod needs a namespace and a non-empty {pod_mutation.PRODUCER_LABEL} label"
        )
    producer, spec = _producer_spec(pod, namespace, producer_name)
    now = datetime.now(UTC)
    claim = pod_mutation.claimed_volume(pod)
    if claim is None:
        try:
            claim = (
                preview_volume(producer, namespace, now)
                if dryrun
                else claim_volume(producer, spec, namespace, now)
            )
        except ApiException as error:
            raise kopf.AdmissionError(
                f"could not claim a buffer volume for DurableProducer {namespace}/"
                f"{producer_name}: HTTP {error.status} {error.reason}: {error.body!r}",
                code=500,
            ) from error
    if dryrun:
        warnings.append("dry run: no buffer volume was claimed")
    ops = pod_mutation.mutation_patch(pod, producer_name, spec, claim, os.environ)
    if ops:
        logger.info("attaching agent and volume %s (DurableProducer %s)", claim, producer_name)
        patch.fns.append(lambda target: jsonpatch.apply_patch(target, ops, in_place=True))


# kopf refuses to start when admission handlers exist but no webhook server is configured, so
# the handler is registered only when a certificate is: without one the operator still sizes,
# pools and drains, and says in its log that pods are not mutated.
if WebhookSettings.from_environ(os.environ).enabled:
    kopf.on.mutate(
        "v1",
        "pods",
        id=MUTATION_WEBHOOK_ID,
        operations=["CREATE"],
        labels={pod_mutation.PRODUCER_LABEL: kopf.PRESENT},
    )(attach_buffer_agent)


def run_pool(
    producer: Mapping[str, Any], *, deleting: bool, logger: logging.Logger
) -> tuple[volume_pool.PoolPlan, list[dict[str, Any]], list[dict[str, Any]]]:
    """Plan the pool for one DurableProducer and carry the plan out; returns what was seen."""
    metadata = producer.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    policy = volume_pool.PoolPolicy.from_environ(os.environ)
    api = cluster()
    with producer_lock(namespace, name):
        volumes = api.pool_volumes(namespace, name)
        pods = api.producer_pods(namespace, name)
        plan = volume_pool.plan_pool(
            volumes,
            pods,
            api.drain_jobs(namespace, name),
            datetime.now(UTC),
            policy,
            deleting=deleting,
        )
        versions = {v["metadata"]["name"]: v["metadata"].get("resourceVersion") for v in volumes}
        for volume_patch in plan.patches:
            _ignore_statuses(
                lambda p=volume_patch: api.patch_volume(namespace, p.name, p.patch), 404, 409
            )
        spec = reconcile.parse_spec(producer.get("spec"))
        for volume in plan.jobs_to_create:
            if isinstance(spec, str):
                plan.problems.append(f"cannot drain volume {volume}: {spec}")
                continue
            manifest = volume_pool.drain_job_manifest(producer, spec, volume, policy, os.environ)
            logger.info("starting drain Job %s for volume %s", manifest["metadata"]["name"], volume)
            _ignore_statuses(lambda m=manifest: api.create_job(namespace, m), 409)
        for job in plan.jobs_to_delete:
            _ignore_statuses(lambda j=job: api.delete_job(namespace, j), 404)
        for volume in plan.volumes_to_delete:
            logger.info("deleting empty idle volume %s", volume)
            _ignore_statuses(
                lambda v=volume: api.delete_volume(namespace, v, versions.get(v)), 404, 409
            )
    return plan, volumes, pods


def _publish(
    body: kopf.Body,
    patch: kopf.Patch,
    problems: list[str],
    attached: int,
    volume_counts: Mapping[str, int] | None = None,
) -> None:
    """attachedPods, volumes by state, and a Degraded condition (with Events) while the pool
    has problems."""
    status = body.get("status") or {}
    if status.get("attachedPods") != attached:
        patch.status["attachedPods"] = attached
    if volume_counts is not None:
        volumes = volume_pool.status_volume_counts(volume_counts)
        if status.get("volumes") != volumes:
            patch.status["volumes"] = volumes
    now = datetime.now(UTC)
    generation = (body.get("metadata") or {}).get("generation")
    # What the spec alone says about Degraded (e.g. a short runway), to keep or restore it.
    baseline = reconcile.desired_status(body.get("spec"), status, generation, now)
    conditions = volume_pool.degraded_conditions(
        status.get("conditions") or [],
        baseline.status.get("conditions") or [],
        problems,
        REASON_POOL_PROBLEM,
        now,
    )
    if conditions is None:
        return
    patch.status["conditions"] = conditions
    degraded = next(c for c in conditions if c["type"] == reconcile.DEGRADED)
    if degraded["reason"] == REASON_POOL_PROBLEM:
        for problem in problems:
            kopf.warn(body, reason=REASON_POOL_PROBLEM, message=problem)


def scrape_backlog(urls: list[str]) -> int | None:
    """Total backlog of the agents that answer; None when none does (then nothing is known)."""
    answers = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_SECONDS) as response:
                answers.append(volume_pool.parse_backlog_bytes(response.read().decode()))
        except (OSError, ValueError):
            continue
    known = [backlog for backlog in answers if backlog is not None]
    return sum(known) if known else None


@kopf.timer(*RESOURCE, id="volume-pool", interval=POOL_INTERVAL_SECONDS)
def maintain_volume_pool(
    body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any
) -> None:
    """Release, drain, reclaim; audit pods without an agent; publish pods and backlog."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return  # drain-volumes owns the pool from here
    plan, _, pods = run_pool(body, deleting=False, logger=logger)
    spec = reconcile.parse_spec(body.get("spec"))
    if not isinstance(spec, str):
        backlog = scrape_backlog(volume_pool.agent_metrics_urls(pods, spec.agent.ports.metrics))
        if backlog is not None and (body.get("status") or {}).get("backlogBytes") != backlog:
            patch.status["backlogBytes"] = backlog
    problems = list(plan.problems)
    missing = volume_pool.pods_without_agent(pods)
    if missing:
        problems.append(
            f"pods running without a buffer agent (admitted while the webhook was"
            f" unavailable?): {', '.join(missing)}; recreate them"
        )
    _publish(body, patch, problems, volume_pool.attached_pods(pods), plan.counts)


@kopf.on.delete(*RESOURCE, id="drain-volumes")
def drain_volumes_before_deletion(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Hold the DurableProducer until each volume is drained by a Job and deleted."""
    plan, volumes, _ = run_pool(body, deleting=True, logger=logger)
    remaining = sorted({v["metadata"]["name"] for v in volumes} - set(plan.volumes_to_delete))
    if remaining:
        problems = "".join(f"; {problem}" for problem in plan.problems)
        raise kopf.TemporaryError(
            f"waiting for {len(remaining)} buffer volume(s) to be released and drained:"
            f" {', '.join(remaining)}{problems}",
            delay=POOL_INTERVAL_SECONDS,
        )
