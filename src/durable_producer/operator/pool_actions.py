"""Carrying out the volume pool's plans against the API (volume_pool.py decides).

``handle_pool_timer`` runs for every DurableProducer on the pool timer: releases volumes whose
pods are gone, starts drain Jobs, finishes drains, deletes idle empty volumes, reads the
agents' backlog and says what to publish in the status. ``handle_deletion`` runs while a
DurableProducer is being deleted: it drains every volume and deletes it, and holds the
DurableProducer (the finalizer) until none is left.

API errors that mean "already done" (404 on delete, 409 on create) are ignored: the next run
sees the new state and plans again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf

from durable_producer.operator import (
    agent_scrape,
    agent_versions,
    manifests,
    metrics,
    pool_status,
    reconcile,
    volume_pool,
)
from durable_producer.operator.api_access import POOL_USER_AGENT
from durable_producer.operator.cluster import cluster, ignore_statuses
from durable_producer.operator.kube_objects import JsonObject
from durable_producer.operator.locks import producer_lock
from durable_producer.operator.settings import OperatorConfig


@dataclass(frozen=True)
class PoolRun:
    """A plan that was carried out, and the volumes and pods it was made from."""

    plan: volume_pool.PoolPlan
    volumes: list[JsonObject]
    pods: list[JsonObject]


def run_pool(
    producer: Mapping[str, Any], config: OperatorConfig, *, deleting: bool, logger: kopf.Logger
) -> PoolRun:
    """Plan the pool for one DurableProducer and carry the plan out."""
    metadata = producer.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    api = cluster(POOL_USER_AGENT)
    with producer_lock(namespace, name):
        volumes = api.pool_volumes(namespace, name)
        pods = api.producer_pods(namespace, name)
        jobs = api.drain_jobs(namespace, name)
        plan = volume_pool.plan_pool(
            volumes,
            pods,
            jobs,
            datetime.now(UTC),
            config.pool,
            deleting=deleting,
        )
        versions = {v["metadata"]["name"]: v["metadata"].get("resourceVersion") for v in volumes}
        for volume_patch in plan.patches:
            ignore_statuses(
                partial(api.patch_volume, namespace, volume_patch.name, volume_patch.patch),
                404,
                409,
            )
        spec = reconcile.parse_spec(producer.get("spec"))
        for volume in plan.jobs_to_create:
            if isinstance(spec, str):
                plan.problems.append(f"cannot drain volume {volume}: {spec}")
                continue
            manifest = manifests.drain_job_manifest(
                producer, spec, volume, config.pool, config.agent_image
            )
            logger.info("starting drain Job %s for volume %s", manifest["metadata"]["name"], volume)
            ignore_statuses(partial(api.create_job, namespace, manifest), 409)
        for job in plan.jobs_to_delete:
            ignore_statuses(partial(api.delete_job, namespace, job), 404)
        for volume in plan.volumes_to_delete:
            logger.info("deleting empty idle volume %s", volume)
            ignore_statuses(
                partial(api.delete_volume, namespace, volume, versions.get(volume)), 404, 409
            )
    metrics.observe_pool_run(plan, jobs)
    return PoolRun(plan, volumes, pods)


def handle_pool_timer(
    producer: Mapping[str, Any], config: OperatorConfig, logger: kopf.Logger
) -> pool_status.PoolStatusUpdate:
    """Release, drain, reclaim; audit pods without an agent; say what to publish."""
    run = run_pool(producer, config, deleting=False, logger=logger)
    backlog = None
    spec = reconcile.parse_spec(producer.get("spec"))
    if not isinstance(spec, str):
        urls = agent_scrape.agent_metrics_urls(run.pods, spec.agent.ports.metrics)
        backlog = agent_scrape.scrape_backlog(urls)
    now = datetime.now(UTC)
    update = pool_status.pool_status_update(producer, run.plan, run.pods, backlog, now)
    update.changes.update(agent_versions.outdated_status(producer, run.pods, config.agent_image))
    return update


def handle_deletion(
    producer: Mapping[str, Any], config: OperatorConfig, logger: kopf.Logger
) -> None:
    """Drain and delete the pool; kopf.TemporaryError (retried) while volumes remain."""
    run = run_pool(producer, config, deleting=True, logger=logger)
    names = {volume["metadata"]["name"] for volume in run.volumes}
    remaining = sorted(names - set(run.plan.volumes_to_delete))
    if remaining:
        problems = "".join(f"; {problem}" for problem in run.plan.problems)
        raise kopf.TemporaryError(
            f"waiting for {len(remaining)} buffer volume(s) to be released and drained:"
            f" {', '.join(remaining)}{problems}",
            delay=config.pool_interval_seconds,
        )
    metadata = producer.get("metadata") or {}
    logger.info("DurableProducer %s/%s released", metadata.get("namespace"), metadata.get("name"))
