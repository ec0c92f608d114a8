"""Carrying out the volume pool's plans against the API (volume_pool.py decides).

``handle_pool_timer`` runs for every DurableProducer on the pool timer: releases volumes whose
pods are gone, starts drain Jobs, finishes drains, grows or retires volumes too small for the
spec, deletes idle empty volumes, reads the agents' backlog and says what to publish in the
status. ``handle_deletion`` runs while a DurableProducer is being deleted: it drains every
volume and deletes it, and holds the DurableProducer (the finalizer) until none is left.

API errors that mean "already done" (404 on delete, 409 on create or on a guarded patch) are
ignored: the next run sees the new state and plans again. A drain Job the API server forbids
(403, e.g. in a namespace being deleted) is a problem the status names; the volume is held.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.operator import metrics
from durable_producer.operator.act import agent_scrape, status_writes
from durable_producer.operator.act.api_access import POOL_USER_AGENT, STORAGE_CLASSES_USER_AGENT
from durable_producer.operator.act.cluster import Cluster, cluster, ignore_statuses
from durable_producer.operator.act.locks import holding_producer_lock
from durable_producer.operator.decide import (
    agent_versions,
    drain_placement,
    drain_start,
    manifests,
    pool_status,
    reconcile,
    volume_fit,
    volume_pool,
)
from durable_producer.operator.decide.kube_objects import JsonObject
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.model.conditions import DELETION_CONDITIONS, POOL_CONDITIONS
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.settings import OperatorConfig


@dataclass(frozen=True)
class PoolRun:
    """A plan that was carried out, and the volumes and pods it was made from."""

    plan: volume_pool.PoolPlan
    volumes: list[JsonObject]
    pods: list[JsonObject]
    let_go: frozenset[str] = frozenset()
    """Volumes whose finalizer this run removed (or found gone): only these may count as
    gone. A release or delete refused because the volume changed meanwhile is not."""


def api_error_text(error: ApiException) -> str:
    """``HTTP 403 Forbidden: <the API server's message>`` for problem messages."""
    message = ""
    try:
        message = str((json.loads(error.body or "{}") or {}).get("message") or "")
    except (TypeError, ValueError):
        message = str(error.body or "")
    status = f"HTTP {error.status} {error.reason or ''}".rstrip()
    return f"{status}: {message}" if message else status


def volume_fit_for(
    spec: DurableProducerSpec, volumes: list[JsonObject], logger: kopf.Logger
) -> VolumeFit:
    """The spec's fit, with the classes (of too-small volumes) that allow expansion."""
    fit = VolumeFit.from_spec(spec)
    expandable = set()
    for name in sorted(volume_fit.classes_to_check(volumes, fit)):
        try:
            found = cluster(STORAGE_CLASSES_USER_AGENT).get_storage_class(name)
        except ApiException as error:
            logger.info("cannot read StorageClass %s (%s): volumes too small are retired",
                        name, api_error_text(error))  # fmt: skip
            continue
        if volume_fit.allows_expansion(found):
            expandable.add(name)
    return VolumeFit.from_spec(spec, expandable)


def _expand(
    api: Cluster, namespace: str, name: str, fit: VolumeFit, plan: volume_pool.PoolPlan
) -> None:
    try:
        api.patch_volume(namespace, name, volume_fit.expansion_patch(fit))
    except ApiException as error:
        if error.status in (404, 409):
            return
        if error.status not in (403, 422):
            raise
        plan.problems.append(
            f"could not grow volume {name} to {fit.size_quantity} ({api_error_text(error)});"
            " it is drained (if it may hold backlog) and deleted instead"
        )
        ignore_statuses(
            partial(api.patch_volume, namespace, name, volume_fit.expansion_refused_patch(fit)),
            404,
        )


def _create_drain_job(
    api: Cluster, namespace: str, volume: str, manifest: JsonObject, plan: volume_pool.PoolPlan
) -> None:
    try:
        api.create_job(namespace, manifest)
    except ApiException as error:
        if error.status == 409:
            return
        if error.status != 403:
            raise
        plan.held.append(volume)
        plan.problems.append(
            f"cannot create drain Job for volume {volume}, which may hold data not yet forwarded"
            f" to Kafka: {api_error_text(error)}"
        )


RELEASE_ATTEMPTS = 3
"""Tries to remove our finalizer from a volume just deleted (each after a fresh read)."""


def _delete_volume(api: Cluster, namespace: str, pvc: Mapping[str, Any]) -> bool:
    """Delete, guarded by the version read (a volume claimed meanwhile stays, finalizer and
    all), then remove our finalizer from the deleted volume, which no claim can take any more.

    The other order left a window: with the finalizer gone and the delete then refused (409)
    because a pod had claimed the volume, the live volume was unprotected until the next run
    put the finalizer back (review D10). The release is guarded too (a merge patch replaces
    the finalizer list): refused because the PVC changed (Kubernetes' own pvc-protection
    finalizer going), it is tried again on the volume as it is now; still refused, the next
    run lets a deleted volume with nothing on it go.

    True once the volume is gone or deleted without our finalizer; False while it stays
    (claimed meanwhile, or the release still refused)."""
    name = str(pvc["metadata"]["name"])
    version = (pvc.get("metadata") or {}).get("resourceVersion")
    try:
        current = api.delete_volume(namespace, name, version)
    except ApiException as error:
        if error.status == 404:
            return True
        if error.status == 409:
            return False
        raise
    for _ in range(RELEASE_ATTEMPTS):
        finalizers = ((current or {}).get("metadata") or {}).get("finalizers") or []
        if current is None or volume_pool.VOLUME_FINALIZER not in finalizers:
            return True
        try:
            api.patch_volume(namespace, name, volume_pool.release_patch(current))
            return True
        except ApiException as error:
            if error.status == 404:
                return True
            if error.status != 409:
                raise
        current = api.read_volume(namespace, name)
    return False


def run_pool(
    producer: Mapping[str, Any], config: OperatorConfig, *, deleting: bool, logger: kopf.Logger
) -> PoolRun:
    """Plan the pool for one DurableProducer and carry the plan out."""
    metadata = producer.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    api = cluster(POOL_USER_AGENT)
    spec = reconcile.pool_spec(producer.get("spec"))
    # Read and plan without the producer's lock: the webhook waits for it (D5), and the
    # reads can be slow. A claim made meanwhile (here or by another replica, which no lock
    # keeps out anyway) changes its volume's resourceVersion, so every write below that
    # could undo it (patch, release, delete) is refused with 409 and the next run sees it.
    volumes = api.pool_volumes(namespace, name)
    pods = api.producer_pods(namespace, name)
    jobs = api.drain_jobs(namespace, name)
    fit = None if isinstance(spec, str) else volume_fit_for(spec, volumes, logger)
    plan = volume_pool.plan_pool(
        volumes,
        pods,
        jobs,
        datetime.now(UTC),
        config.pool,
        deleting=deleting,
        fit=fit,
        abandon=volume_pool.backlog_abandoned(producer),
    )
    if jobs:  # D3: a drain pod no node may take (its volume's zone or node is gone)
        stuck = drain_start.drains_not_scheduled(api.drain_pods(namespace, name))
        if stuck:
            plan.problems.append(drain_start.problem(stuck))
    by_name = {volume["metadata"]["name"]: volume for volume in volumes}
    with holding_producer_lock(namespace, name, None):
        not_patched = set()
        for volume_patch in [*plan.patches, *plan.releases]:
            try:
                api.patch_volume(namespace, volume_patch.name, volume_patch.patch)
            except ApiException as error:
                if error.status not in (404, 409):
                    raise
                if error.status == 409:  # changed meanwhile: the next run sees it
                    not_patched.add(volume_patch.name)
        let_go = {release.name for release in plan.releases} - not_patched
        for volume in plan.volumes_to_expand:
            if fit is not None:
                logger.info("growing volume %s to %s", volume, fit.size_quantity)
                _expand(api, namespace, volume, fit, plan)
        for volume in plan.jobs_to_create:
            if volume in not_patched:
                continue  # its drain request was not recorded: no Job may answer it (D1)
            if isinstance(spec, str):
                plan.problems.append(f"cannot drain volume {volume}: {spec}")
                continue
            manifest = manifests.drain_job_manifest(
                producer, spec, volume, config.pool, config.agent_image,
                request=plan.drain_requests.get(volume),
                placement=drain_placement.pod_fields(by_name.get(volume, {})),
            )  # fmt: skip
            logger.info("starting drain Job %s for volume %s", manifest["metadata"]["name"], volume)
            _create_drain_job(api, namespace, volume, manifest, plan)
        for job in plan.jobs_to_delete:
            ignore_statuses(partial(api.delete_job, namespace, job), 404)
        for volume in plan.volumes_to_delete:
            logger.info("deleting volume %s (empty, never written, or abandoned)", volume)
            if _delete_volume(api, namespace, by_name[volume]):
                let_go.add(volume)
    metrics.observe_pool_run(plan, jobs)
    return PoolRun(plan, volumes, pods, frozenset(let_go))


def handle_pool_timer(
    producer: Mapping[str, Any], config: OperatorConfig, logger: kopf.Logger
) -> pool_status.PoolStatusUpdate:
    """Release, drain, grow, reclaim; audit pods without an agent; say what to publish."""
    run = run_pool(producer, config, deleting=False, logger=logger)
    figures = None
    spec = reconcile.pool_spec(producer.get("spec"))
    if not isinstance(spec, str):
        urls = agent_scrape.agent_metrics_urls(run.pods, spec.agent.ports.metrics)
        figures = agent_scrape.scrape_agents(urls)
    backlog = None if figures is None else figures.backlog_bytes
    update = pool_status.pool_status_update(
        producer, run.plan, run.pods, backlog, datetime.now(UTC), figures
    )
    update.changes.update(agent_versions.outdated_status(producer, run.pods, config.agent_image))
    return update


def publish_pool_status(
    producer: Mapping[str, Any], changes: Mapping[str, Any], logger: kopf.Logger
) -> bool:
    """Write the pool timer's status changes only onto the object they were computed from.

    The timer's run takes seconds (listing, scraping agents); reconcile may write the status
    meanwhile (a new generation, the pause condition). The timer's own conditions (Degraded,
    BacklogCannotDrain) are applied first (status_writes: reconcile's are never touched),
    then its other fields merge-patched onto the version that apply left. Both carry the
    resourceVersion: the API server refuses them if the object changed since the run read
    it, and the next run publishes from a fresh view. False then.
    """
    if not changes:
        return True
    metadata = producer.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    fields = {key: value for key, value in changes.items() if key != "conditions"}
    api = cluster(POOL_USER_AGENT)
    version = metadata.get("resourceVersion")
    if version and "conditions" in changes:
        version = status_writes.apply_conditions(
            api, producer, changes["conditions"], POOL_CONDITIONS,
            status_writes.POOL_FIELD_MANAGER, guarded=True,
        )  # fmt: skip
    written = bool(version) and (
        not fields
        or api.patch_producer_status_if_unchanged(namespace, name, str(version), fields)
    )
    if not written:
        logger.debug("the DurableProducer changed during this pool run; publishing at the next")
    return written


def handle_deletion(
    producer: Mapping[str, Any], config: OperatorConfig, logger: kopf.Logger
) -> None:
    """Drain and delete the pool; kopf.TemporaryError (retried) while volumes remain.

    The Deleting condition (the delete handler's own, status_writes) says what is waited
    for: pods and drains, or volumes with backlog that cannot be drained (held).

    Only the volumes this run let go count as gone (``PoolRun.let_go``): a release the API
    server refused (409: Kubernetes' pvc-protection finalizer went meanwhile, as it does in a
    namespace being deleted) is tried again at the next run. Counting it gone released the
    DurableProducer and left the volume with our finalizer and no one to remove it: the
    namespace stayed Terminating.
    """
    run = run_pool(producer, config, deleting=True, logger=logger)
    names = {volume["metadata"]["name"] for volume in run.volumes}
    remaining = sorted(names - run.let_go)
    if remaining:
        update = pool_status.deleting_status(producer, run.plan, remaining, datetime.now(UTC))
        if "conditions" in update.changes:
            status_writes.apply_conditions(
                cluster(POOL_USER_AGENT), producer, update.changes["conditions"],
                DELETION_CONDITIONS, status_writes.DELETION_FIELD_MANAGER,
            )  # fmt: skip
        raise kopf.TemporaryError(update.message, delay=config.pool_interval_seconds)
    metadata = producer.get("metadata") or {}
    logger.info("DurableProducer %s/%s released", metadata.get("namespace"), metadata.get("name"))
