"""The mutating admission webhook: attach the agent, env and a pool volume to opted-in pods.

kopf's webhook server calls the ``attach-buffer-agent`` handler (handlers.py) for every pod
review that carries the opt-in label; the MutatingWebhookConfiguration comes from the Helm
chart and calls ``https://<service>/attach-buffer-agent`` for CREATE only, and any other
operation is admitted untouched here too (kopf does not filter by operation).
``handle_admission`` admits an opted-out pod untouched, reads the pod's own agent settings
(overrides.py; bad ones refuse the pod), looks up the DurableProducer, refuses a pod whose names
clash with ours (pod_clashes.py), claims a volume (claims.py) and answers with the JSONPatch of
pod_mutation.py. A second pass over an admitted pod (reinvocation) yields no operations. Every
answer is counted and timed (metrics.py) by its result.

Every API call of one review shares a deadline under the API server's webhook timeout
(cluster.api_deadline); an API failure is a refusal that says what failed, never a bare 500.
The deadline starts when the review arrived (http_endpoint.review_received), not when a thread
picks the work up, and bounds the wait for the DurableProducer's lock too: a review that
cannot be answered in time is refused (retryable), and nothing is claimed or created once
the time is up (D5). ``admit`` runs the blocking work in the webhook's own bounded thread
pool, so kopf's handler threads (the pool timers) cannot keep a review waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import functools
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import INJECT_ANNOTATION, PRODUCER_LABEL
from durable_producer.operator import metrics
from durable_producer.operator.act import claims
from durable_producer.operator.act.api_access import (
    POOL_USER_AGENT,
    VOLUME_PLACEMENT_USER_AGENT,
)
from durable_producer.operator.act.cluster import (
    API_FAILURES,
    api_deadline,
    cluster,
    prepare_clients,
)
from durable_producer.operator.act.locks import ProducerBusy
from durable_producer.operator.decide import overrides, pod_clashes, pod_mutation, reconcile
from durable_producer.operator.http_endpoint import ReadyWebhookServer
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.settings import OperatorConfig, WebhookSettings

MUTATION_WEBHOOK_ID = "attach-buffer-agent"
MUTATED_OPERATION: Final = "CREATE"
# Reviews answered at once; more wait for a thread (their deadline running since arrival).
ADMISSION_WORKERS = 8

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def admission_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The webhook's own threads (made on first use), apart from kopf's handler threads."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=ADMISSION_WORKERS, thread_name_prefix="admission"
            )
        return _executor


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
    """kopf's webhook server with the mounted certificate (it reloads renewed files within a
    minute); it reports to /readyz once listening. The chart owns the configuration."""
    if not webhook.enabled:
        return NoWebhookServer()
    return ReadyWebhookServer(
        addr=webhook.addr or None,  # None: every interface, IPv4 and IPv6
        port=webhook.port,
        certfile=webhook.certfile,
        pkeyfile=webhook.keyfile,
    )


def prepare(config: OperatorConfig, logger: kopf.Logger) -> None:
    """At startup, when the webhook is served: make its API clients before the first pod."""
    if not (config.webhook.enabled and config.features.volume_pool):
        return
    try:
        prepare_clients(POOL_USER_AGENT)
        prepare_clients(VOLUME_PLACEMENT_USER_AGENT)
    except kubernetes.config.ConfigException as error:
        logger.warning("no Kubernetes API configuration yet (%s): made on first use", error)


def _reject(message: str) -> kopf.AdmissionError:
    return kopf.AdmissionError(message, code=400)


def api_failure(error: Exception, doing: str, namespace: str, budget: float) -> kopf.AdmissionError:
    """A refusal saying which API call failed and what to do about it."""
    if isinstance(error, ApiException) and error.status == 403:
        return kopf.AdmissionError(
            f"the durable-producer operator may not {doing} in namespace {namespace} (HTTP 403):"
            " it is installed to watch other namespaces (the chart's operator.watchNamespaces)"
            " or without the volume pool's permissions (rbac.features): add the namespace to"
            f" operator.watchNamespaces, or remove the label {PRODUCER_LABEL} from the pod",
            code=403,
        )
    if isinstance(error, ApiException):
        return kopf.AdmissionError(
            f"could not {doing} in namespace {namespace}: HTTP {error.status} {error.reason}:"
            f" {error.body!r}",
            code=500,
        )
    return kopf.AdmissionError(
        f"the Kubernetes API did not answer within {budget:g}s (under the webhook timeout)"
        f" while the operator tried to {doing} in namespace {namespace}: {error}; the pod's"
        " controller retries",
        code=504,
    )


def producer_busy(namespace: str, producer: str, budget: float) -> kopf.AdmissionError:
    """The refusal when the DurableProducer's lock could not be had within the budget."""
    return kopf.AdmissionError(
        f"DurableProducer {namespace}/{producer} was busy (other claims or the operator's pool"
        f" maintenance) for the whole {budget:g}s the webhook may take: no volume was claimed;"
        " the pod's controller retries",
        code=503,
    )


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


def answer_result(answer: AdmissionAnswer | None, error: BaseException | None) -> str:
    """The metrics result of one review: refused when the pod (or its DurableProducer) is
    wrong, failed when the operator could not do its part (API errors, conflicts, deadlines)."""
    if error is None:
        return metrics.ADMISSION_MUTATED if answer and answer.ops else metrics.ADMISSION_ADMITTED
    if isinstance(error, kopf.AdmissionError) and error.code == 400:
        return metrics.ADMISSION_REFUSED
    return metrics.ADMISSION_FAILED


_claim_gates: dict[tuple[str, str], asyncio.Lock] = {}


def _claiming(
    body: Mapping[str, Any], operation: str | None, dryrun: bool
) -> tuple[str, str] | None:
    """(namespace, DurableProducer) when the review may claim a volume; None for the reviews
    that claim nothing (not a create, a dry run, a reinvocation, an opt-out)."""
    if operation != MUTATED_OPERATION or dryrun or pod_mutation.already_mutated(body):
        return None
    if overrides.opted_out(body):
        return None
    namespace = (body.get("metadata") or {}).get("namespace")
    producer = pod_mutation.producer_name(body)
    return (str(namespace), producer) if namespace and producer else None


async def admit(
    body: Mapping[str, Any],
    *,
    operation: str | None,
    dryrun: bool,
    config: OperatorConfig,
    logger: kopf.Logger,
    received: float,
) -> AdmissionAnswer:
    """``handle_admission`` in the webhook's own threads (admission_executor), for kopf's
    event loop; ``received``: when the review arrived (``time.monotonic()``).

    Reviews that may claim a volume of one DurableProducer go one at a time per replica (its
    claims take turns anyway, on its lock): the others wait here, on the event loop, for the
    time their budget has left, then are refused (503). Waiting in threads instead, they held
    every thread while later reviews queued behind them past the API server's timeout (a
    burst of 200 pods: most answers came after 9 s, and some claims after the API server had
    given up)."""
    call = functools.partial(
        handle_admission,
        body,
        operation=operation,
        dryrun=dryrun,
        config=config,
        logger=logger,
        received=received,
    )
    loop = asyncio.get_running_loop()
    key = _claiming(body, operation, dryrun)
    if key is None:
        return await loop.run_in_executor(
            admission_executor(), functools.partial(contextvars.copy_context().run, call)
        )
    gate = _claim_gates.setdefault(key, asyncio.Lock())
    budget = config.webhook.api_budget_seconds
    try:
        await asyncio.wait_for(gate.acquire(), max(received + budget - time.monotonic(), 0.0))
    except TimeoutError:
        metrics.claim_failed(*key)
        refusal = producer_busy(*key, budget)
        metrics.admission_answered(answer_result(None, refusal), time.monotonic() - received)
        raise refusal from None
    try:
        return await loop.run_in_executor(
            admission_executor(), functools.partial(contextvars.copy_context().run, call)
        )
    finally:
        gate.release()


def handle_admission(
    body: Mapping[str, Any],
    *,
    operation: str | None,
    dryrun: bool,
    config: OperatorConfig,
    logger: kopf.Logger,
    received: float | None = None,
) -> AdmissionAnswer:
    """Add the agent, env and a pool volume to an opted-in pod (idempotent on re-invocation).

    Only a pod being created is mutated. Dry-run requests claim nothing: they are answered
    with the volume a real request would likely get. Raises kopf.AdmissionError to refuse the
    pod, with a message saying why. Counted and timed by result (metrics.py). The API budget
    is counted from ``received`` (``time.monotonic()`` at the review's arrival), else now.
    """
    started = time.monotonic() if received is None else received
    try:
        answer = _admit(
            body, operation=operation, dryrun=dryrun, config=config, logger=logger,
            started=started,
        )  # fmt: skip
    except BaseException as error:
        metrics.admission_answered(answer_result(None, error), time.monotonic() - started)
        raise
    metrics.admission_answered(answer_result(answer, None), time.monotonic() - started)
    return answer


def _admit(
    body: Mapping[str, Any],
    *,
    operation: str | None,
    dryrun: bool,
    config: OperatorConfig,
    logger: kopf.Logger,
    started: float,
) -> AdmissionAnswer:
    if operation != MUTATED_OPERATION:
        return AdmissionAnswer()  # an update, a delete: the agent is attached at creation only
    if pod_mutation.already_mutated(body):
        # A reinvocation (reinvocationPolicy IfNeeded): the API server calls us again after
        # other webhooks or its in-tree plugins changed the pod. Whatever they changed (an
        # image mirror rewriting the agent's image, LimitRanger's defaults) stays; only
        # containers added since our first pass get the bootstrap env, and the agent is moved
        # (unchanged) after a native sidecar another webhook appended behind it (D4).
        return AdmissionAnswer(pod_mutation.reinvocation_patch(body))
    if overrides.opted_out(body):
        return AdmissionAnswer(
            warnings=[f"{INJECT_ANNOTATION}=false: no buffer agent, volume or env added"]
        )
    pod_overrides = overrides.pod_overrides(body)
    if isinstance(pod_overrides, list):
        raise _reject(f"pod cannot get a buffer agent: {'; '.join(pod_overrides)}")
    if not config.features.volume_pool:
        raise _reject(
            "this durable-producer installation has the volume pool switched off (the chart's"
            f" rbac.features): remove the label {PRODUCER_LABEL} from the pod"
        )
    pod = copy.deepcopy(dict(body))
    producer_name = pod_mutation.producer_name(pod)
    namespace = (pod.get("metadata") or {}).get("namespace")
    if not producer_name or not namespace:
        raise _reject(f"an opted-in pod needs a namespace and a non-empty {PRODUCER_LABEL} label")
    budget = config.webhook.api_budget_seconds
    with api_deadline(budget, started=started):
        try:
            producer, spec = _producer_spec(namespace, producer_name)
        except API_FAILURES as error:
            doing = f"read DurableProducer {producer_name}"
            raise api_failure(error, doing, namespace, budget) from error
        effective = overrides.effective_spec(spec, pod_overrides)
        if isinstance(effective, str):
            raise _reject(f"pod cannot get a buffer agent: {effective}")
        found = pod_clashes.clashes(pod, effective)
        if found:
            raise _reject(
                f"pod cannot get the buffer agent of DurableProducer {namespace}/{producer_name}:"
                f" {'; '.join(found)}"
            )
        # Not a reinvocation, so a claim the pod already names is another pod's (a copy of
        # an admitted pod's manifest): this pod gets its own (D6).
        now = datetime.now(UTC)
        token = None if dryrun else claims.new_claim_token()
        try:
            claim = (
                claims.preview_volume(producer, namespace, now, config.pool)
                if token is None
                else claims.claim_volume(
                    producer, spec, namespace, now, config.pool, pod=pod, token=token
                )
            )
        except (*API_FAILURES, kopf.AdmissionError, ProducerBusy) as error:
            metrics.claim_failed(namespace, producer_name)
            if isinstance(error, kopf.AdmissionError):
                raise  # claims' own refusal: conflicting claims, retry
            if isinstance(error, ProducerBusy):
                raise producer_busy(namespace, producer_name, budget) from error
            doing = f"claim a buffer volume for DurableProducer {producer_name}"
            raise api_failure(error, doing, namespace, budget) from error
    warnings = ["dry run: no buffer volume was claimed"] if dryrun else []
    warnings += pod_clashes.warnings(pod, effective)
    ops = pod_mutation.mutation_patch(
        pod,
        producer_name,
        effective,
        claim,
        config.agent_image,
        pod_overrides.log_level,
        claim_token=token,
    )
    if ops:
        logger.info("attaching agent and volume %s (DurableProducer %s)", claim, producer_name)
    return AdmissionAnswer(ops, warnings)
