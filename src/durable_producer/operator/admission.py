"""The mutating admission webhook: attach the agent, env and a pool volume to opted-in pods.

kopf's webhook server calls the ``attach-buffer-agent`` handler (handlers.py) for every pod
CREATE that carries the opt-in label; the MutatingWebhookConfiguration comes from the Helm
chart and calls ``https://<service>/attach-buffer-agent``. ``handle_admission`` looks up the
DurableProducer, claims a volume (claims.py) and answers with the JSONPatch of
pod_mutation.py. A second pass over an admitted pod (reinvocation) yields no operations.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import PRODUCER_LABEL
from durable_producer.operator import claims, pod_mutation, reconcile
from durable_producer.operator.api_access import POOL_USER_AGENT
from durable_producer.operator.cluster import cluster
from durable_producer.operator.model import DurableProducerSpec
from durable_producer.operator.settings import OperatorConfig, WebhookSettings

MUTATION_WEBHOOK_ID = "attach-buffer-agent"


@dataclass(frozen=True)
class AdmissionAnswer:
    """The JSONPatch operations for the pod (none: admit it as it is) and warnings for the user."""

    ops: list[pod_mutation.JsonPatchOp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class NoWebhookServer:
    """Stands in for kopf's webhook server when no certificate is configured: serves nothing.

    kopf refuses to start when admission handlers exist but no server is configured; with this
    one the operator still sizes, pools and drains, and pods are not mutated.
    """

    def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        return self

    def __aiter__(self) -> AsyncIterator[kopf.WebhookClientConfig]:
        return self

    async def __anext__(self) -> kopf.WebhookClientConfig:
        await asyncio.Event().wait()  # until the operator stops (the task is cancelled)
        raise StopAsyncIteration


def webhook_server(webhook: WebhookSettings) -> kopf.WebhookServer | NoWebhookServer:
    """kopf's webhook server with the mounted certificate; the chart owns the configuration."""
    if not webhook.enabled:
        return NoWebhookServer()
    return kopf.WebhookServer(
        addr=webhook.addr, port=webhook.port, certfile=webhook.certfile, pkeyfile=webhook.keyfile
    )


def _reject(message: str) -> kopf.AdmissionError:
    return kopf.AdmissionError(message, code=400)


def _producer_spec(namespace: str, producer: str) -> tuple[dict[str, Any], DurableProducerSpec]:
    found = cluster(POOL_USER_AGENT).get_producer(namespace, producer)
    if found is None:
        raise _reject(
            f"pod opts in to DurableProducer {producer!r} (label {PRODUCER_LABEL})"
            f" but no DurableProducer {namespace}/{producer} exists: create it first, or remove"
            " the label to run without a buffer agent"
        )
    if (found.get("metadata") or {}).get("deletionTimestamp"):
        raise _reject(f"DurableProducer {namespace}/{producer} is being deleted")
    spec = reconcile.parse_spec(found.get("spec"))
    if isinstance(spec, str):
        raise _reject(f"DurableProducer {namespace}/{producer} cannot be used: {spec}")
    return found, spec


def handle_admission(
    body: Mapping[str, Any], *, dryrun: bool, config: OperatorConfig, logger: kopf.Logger
) -> AdmissionAnswer:
    """Add the agent, env and a pool volume to an opted-in pod (idempotent on re-invocation).

    Dry-run requests claim nothing: they are answered with the volume a real request would
    likely get. Raises kopf.AdmissionError to refuse the pod, with a message saying why.
    """
    pod = copy.deepcopy(dict(body))
    producer_name = pod_mutation.producer_name(pod)
    namespace = (pod.get("metadata") or {}).get("namespace")
    if not producer_name or not namespace:
        raise _reject(
            f"an opted-in pod needs a namespace and a non-empty {PRODUCER_LABEL} label"
        )
    producer, spec = _producer_spec(namespace, producer_name)
    now = datetime.now(UTC)
    claim = pod_mutation.claimed_volume(pod)
    if claim is None:
        try:
            claim = (
                claims.preview_volume(producer, namespace, now, config.pool)
                if dryrun
                else claims.claim_volume(producer, spec, namespace, now, config.pool, pod=pod)
            )
        except ApiException as error:
            raise kopf.AdmissionError(
                f"could not claim a buffer volume for DurableProducer {namespace}/"
                f"{producer_name}: HTTP {error.status} {error.reason}: {error.body!r}",
                code=500,
            ) from error
    warnings = ["dry run: no buffer volume was claimed"] if dryrun else []
    ops = pod_mutation.mutation_patch(pod, producer_name, spec, claim, config.agent_image)
    if ops:
        logger.info("attaching agent and volume %s (DurableProducer %s)", claim, producer_name)
    return AdmissionAnswer(ops, warnings)
