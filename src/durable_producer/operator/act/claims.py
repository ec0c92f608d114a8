"""Handing a pool volume to a pod being admitted: optimistic concurrency, with retries.

handout.py decides which volume: the one claimed for an earlier attempt to create the same
pod (refused after the webhook), else a free one that fits the spec and, if bound, whose
PersistentVolume may be attached where the pod may run (persistent_volumes.py). The webhook
claims it with a merge patch carrying the resourceVersion it read; a concurrent claim of the
same PVC makes the API server answer 409 (a deleted one 404), and the next one is tried. With
none left a new PVC is created, already claimed. Inside the webhook's deadline
(cluster.api_deadline) the producer's lock is waited for only the time left
(locks.ProducerBusy), and no call, claim or create included, is made once it is up.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.operator.act.api_access import POOL_USER_AGENT
from durable_producer.operator.act.cluster import cluster, time_left
from durable_producer.operator.act.locks import holding_producer_lock
from durable_producer.operator.act.persistent_volumes import PlacementCheck
from durable_producer.operator.decide import (
    drain_placement,
    handout,
    manifests,
    pod_key,
    reconcile,
    volume_pool,
)
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.model.installation import PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec

CLAIM_ATTEMPTS = 5


def claim_volume(
    producer: Mapping[str, Any],
    spec: DurableProducerSpec,
    namespace: str,
    now: datetime,
    policy: PoolPolicy,
    *,
    pod: Mapping[str, Any] | None = None,
    token: str | None = None,
) -> str:
    """Claim a pool volume for ``pod`` (its own earlier claim first), or create a new one,
    under ``token`` (a new one when None; the webhook puts it on the pod too)."""
    name = str(producer["metadata"]["name"])
    token = token or new_claim_token()
    key = pod_key.claim_key(pod) if pod is not None else None
    placement = drain_placement.recorded(pod) if pod is not None else None
    fit = VolumeFit.from_spec(spec)
    conflicted: set[str] = set()
    placement_check = PlacementCheck(pod)  # D3: not a volume attached where the pod cannot run
    api = cluster(POOL_USER_AGENT)
    # Inside the webhook's deadline: wait for the lock only the time left (ProducerBusy).
    with holding_producer_lock(namespace, name, time_left()):
        for _ in range(CLAIM_ATTEMPTS):
            volumes = api.pool_volumes(namespace, name)
            pods = api.producer_pods(namespace, name)
            candidate = None
            if key is not None:
                candidate = handout.reusable_claim(
                    volumes, pods, key, now, policy, exclude=conflicted, fit=fit
                )
            if candidate is None:
                candidate = placement_check.first(
                    handout.free_volumes(volumes, pods, now, policy, exclude=conflicted, fit=fit)
                )
            if candidate is None:
                volume = volume_pool.volume_name(name, token[:8])
                api.create_volume(
                    namespace,
                    manifests.new_volume_manifest(
                        producer, spec, volume, token, now, key=key, placement=placement
                    ),
                )
                return volume
            volume = str(candidate["metadata"]["name"])
            try:
                api.patch_volume(
                    namespace, volume, handout.claim_patch(candidate, token, now, key, placement)
                )
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


def new_claim_token() -> str:
    return uuid.uuid4().hex


def preview_volume(
    producer: Mapping[str, Any], namespace: str, now: datetime, policy: PoolPolicy
) -> str:
    """For dry-run requests: the volume a real request would likely get, claiming nothing."""
    name = str(producer["metadata"]["name"])
    api = cluster(POOL_USER_AGENT)
    spec = reconcile.parse_spec(producer.get("spec"))
    candidate = handout.choose_volume(
        api.pool_volumes(namespace, name),
        api.producer_pods(namespace, name),
        now,
        policy,
        fit=None if isinstance(spec, str) else VolumeFit.from_spec(spec),
    )
    if candidate is not None:
        return str(candidate["metadata"]["name"])
    return volume_pool.volume_name(name, "dry-run")
