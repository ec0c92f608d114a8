"""Manifests of the objects the operator creates for a DurableProducer (pure).

Pool volumes (PVCs) and drain Jobs. Pool volumes carry no owner reference: the
DurableProducer's finalizer owns their lifecycle (drained, then deleted). With an owner
reference, a foreground deletion (``kubectl delete --cascade=foreground``, Argo CD's default)
made the garbage collector delete every volume first, before any could be drained (D2).
Drain Jobs carry a non-blocking owner reference (the garbage collector removes a Job left
behind once the DurableProducer is gone; a foreground deletion does not wait for it). The Spark
templates ConfigMap (spark_templates.py) carries a blocking one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durable_producer.contract import (
    AGENT_CONTAINER_NAME,
    API_VERSION,
    BUFFER_VOLUME_NAME,
    CLAIM_TOKEN_ANNOTATION,
    DRAIN_KEPT_DEAD_LETTERS_EXIT,
    KIND,
    POOL_LABEL,
)
from durable_producer.operator.decide import agent_container, mesh
from durable_producer.operator.decide.kube_objects import Object, format_time
from durable_producer.operator.decide.pod_key import ClaimKey
from durable_producer.operator.decide.volume_fit import STORAGE_CLASS_ANNOTATION, VolumeFit
from durable_producer.operator.decide.volume_pool import (
    BACKLOG_ANNOTATION,
    BACKLOG_UNKNOWN,
    CLAIM_KEY_ANNOTATION,
    CLAIMED_AT_ANNOTATION,
    DRAIN_REQUEST_LABEL,
    DRAIN_VOLUME_LABEL,
    PLACEMENT_ANNOTATION,
    VOLUME_FINALIZER,
    drain_job_name,
)
from durable_producer.operator.model.installation import AgentImage, PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec


def owner_reference(producer: Object, *, blocking: bool = True) -> dict[str, Any]:
    metadata = producer.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
        "controller": True,
        "blockOwnerDeletion": blocking,
    }


def new_volume_manifest(
    producer: Object,
    spec: DurableProducerSpec,
    name: str,
    token: str,
    now: datetime,
    *,
    key: ClaimKey | None = None,
    placement: str | None = None,
) -> dict[str, Any]:
    """A new pool PVC, created already claimed by the pod being admitted (``key``, where it
    may run: ``placement``, drain_placement.recorded).

    It records the storage class asked for (volume_fit.py) and carries the pool's finalizer,
    so it goes only when the operator lets it (volume_pool.py). Found by its label, not by an
    owner reference (it has none: see the module's docstring).
    """
    metadata = producer.get("metadata") or {}
    fit = VolumeFit.from_spec(spec)
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": fit.size_quantity}},
    }
    if fit.storage_class is not None:
        pvc_spec["storageClassName"] = fit.storage_class
    annotations = {
        CLAIM_TOKEN_ANNOTATION: token,
        CLAIMED_AT_ANNOTATION: format_time(now),
        BACKLOG_ANNOTATION: BACKLOG_UNKNOWN,
        STORAGE_CLASS_ANNOTATION: fit.storage_class or "",
    }
    if key is not None:
        annotations[CLAIM_KEY_ANNOTATION] = key.value
    if placement is not None:
        annotations[PLACEMENT_ANNOTATION] = placement
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": metadata.get("namespace"),
            "labels": {POOL_LABEL: metadata.get("name")},
            "annotations": annotations,
            "finalizers": [VOLUME_FINALIZER],
        },
        "spec": pvc_spec,
    }


def drain_pod_security_context() -> dict[str, Any]:
    """Pod Security "restricted" at pod level too (the agent container sets it as well); the
    volume is made writable for the agent's group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": agent_container.AGENT_USER_ID,
        "runAsGroup": agent_container.AGENT_USER_ID,
        "fsGroup": agent_container.AGENT_USER_ID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def drain_job_manifest(
    producer: Object,
    spec: DurableProducerSpec,
    pvc_name: str,
    policy: PoolPolicy,
    agent_image: AgentImage,
    *,
    request: str | None = None,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Job running the agent in drain mode on one volume: exit 0 once all reached Kafka.

    ``request``: the volume's drain request token (volume_pool.drain_request_token), as a
    label: only a Job carrying the volume's current token counts (review D1). ``placement``:
    the pod spec fields that let it run where the volume's pod ran (drain_placement.py). Its
    pods are kept out of service meshes (mesh.DRAIN_POD_ANNOTATIONS): an injected proxy that
    never exits would keep the Job from ever completing (review D4)."""
    metadata = producer.get("metadata") or {}
    labels = {POOL_LABEL: metadata.get("name"), DRAIN_VOLUME_LABEL: pvc_name}
    if request:
        labels[DRAIN_REQUEST_LABEL] = request
    container = agent_container.agent_base_container(
        spec, agent_container.agent_drain_args(spec, policy.drain_timeout_seconds), agent_image
    )
    secrets = agent_container.image_pull_secrets(None, agent_image)
    pull_secrets = {"imagePullSecrets": secrets} if secrets else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": drain_job_name(pvc_name),
            "namespace": metadata.get("namespace"),
            "labels": labels,
            "ownerReferences": [owner_reference(producer, blocking=False)],
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 3 * (policy.drain_timeout_seconds + 60),
            # Dead letters on the volume: another pod would find them too (volume_pool.py
            # words the failure).
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": AGENT_CONTAINER_NAME,
                            "operator": "In",
                            "values": [DRAIN_KEPT_DEAD_LETTERS_EXIT],
                        },
                    }
                ]
            },
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": dict(mesh.DRAIN_POD_ANNOTATIONS),
                },
                "spec": {
                    "restartPolicy": "Never",
                    # The agent talks to Kafka only: no Kubernetes API token in the pod.
                    "automountServiceAccountToken": False,
                    "securityContext": drain_pod_security_context(),
                    **pull_secrets,
                    **(placement or {}),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": BUFFER_VOLUME_NAME,
                            "persistentVolumeClaim": {"claimName": pvc_name},
                        },
                        *agent_container.secret_volumes(spec),
                    ],
                },
            },
        },
    }
