"""Every kopf handler of the operator; each body hands over to one function.

Run with::

    kopf run -m durable_producer.operator.handlers --standalone --all-namespaces \\
        --liveness=http://0.0.0.0:8080/healthz

(the chart runs ``--peering=NAME`` instead of ``--standalone``: several replicas, one of them
running the handlers at a time; see startup.py).

- ``log_in`` (kopf's login): login.log_in, kopf's own client login, with one line and exit code
  2 when there are no usable credentials.
- ``start_operator`` (operator start): reads settings.OperatorConfig, startup.configure_kopf
  (peering priority, webhook server), starts /metrics and /readyz (startup.serve_endpoint),
  then ``register_feature_handlers`` and admission.prepare (the webhook's API clients); /readyz
  turns ready once all that is done and the webhook listens.
- ``reconcile_durable_producer`` (DurableProducer resume/create/update): reconcile (pure).
- ``resync_durable_producer`` (timer, per DurableProducer; feature volume pool): reconcile
  again when ``metadata.generation`` is ahead of ``status.observedGeneration`` and the object
  is not paused, or when the ReconciliationPaused condition disagrees with the annotation.
  kopf's change detection is edge-triggered: when it believes a change handled, no event
  brings it back. It can be wrong: a stale event accepted after its consistency timeout
  re-writes an older "succeeded" record, and a change that arrives while a handling cycle is
  under way (an annotation set just after creation) is folded into that cycle's record
  without the handlers that already ran seeing it. This timer is the level-triggered safety
  net: an edit, a pause or a resume takes effect within one pool interval. kopf gives every
  object with a timer a finalizer, so it runs only with the volume pool, whose finalizer is
  there anyway.
- ``render_spark_templates`` (same events; feature sparkPodTemplates):
  spark_actions.handle_spark_templates.
- ``maintain_volume_pool`` (timer, per DurableProducer; feature volume pool):
  pool_actions.handle_pool_timer.
- ``drain_volumes_before_deletion`` (deletion, our finalizer; feature volume pool):
  pool_actions.handle_deletion.
- ``record_clean_shutdown`` (events of pods with the opt-in label; feature volume pool):
  clean_shutdowns.record_clean_shutdown (a stopped agent's record marks its volume empty).
- ``attach_buffer_agent`` (webhook, pod reviews with the opt-in label):
  admission.admit (handle_admission in the webhook's own threads).

A DurableProducer with the pause annotation (pause.py) is left alone by every handler but the
webhook. Every handler run is counted by result (metrics.py).

Nothing happens at import time but registration. The environment is read once, by the
startup handler, into an ``OperatorConfig`` that reaches every handler through kopf's memo.
The handlers of optional features (the chart's rbac.features.*) are registered by the startup
handler, and only when their feature is on: a feature whose permissions the chart did not
grant is never attempted, and with the volume pool off no finalizer is added (kopf removes
ours from existing DurableProducers), so they stay deletable. kopf starts watching only
after the startup handlers are done.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import GROUP, PLURAL, PRODUCER_LABEL, VERSION
from durable_producer.operator import http_endpoint, login, metrics, startup
from durable_producer.operator.act import (
    admission,
    clean_shutdowns,
    pool_actions,
    spark_actions,
    status_writes,
)
from durable_producer.operator.act.api_access import STATUS_USER_AGENT, STORAGE_CLASSES_USER_AGENT
from durable_producer.operator.act.cluster import cluster
from durable_producer.operator.decide import pause, reconcile
from durable_producer.operator.decide.pool_status import REASON_POOL_PROBLEM
from durable_producer.operator.model.conditions import reconcile_conditions
from durable_producer.operator.settings import OperatorConfig

RESOURCE = (GROUP, VERSION, PLURAL)
POD_RESOURCE = ("v1", "pods")
POOL_TIMER_ID = "volume-pool"
DRAIN_HANDLER_ID = "drain-volumes"
SPARK_TEMPLATES_ID = "spark-templates"
RECONCILE_ID = "reconcile"  # the metrics label of reconcile_durable_producer (kopf's id: its name)
RESYNC_ID = "resync"
CLEAN_SHUTDOWN_ID = "clean-shutdown"
CONFIG_KEY = "config"
WARNED_KEY = "warned-problem"
"""In an object's memo: the last bad-spec problem warned about (``warn_once``)."""
WARNED_LOCK_KEY = "warned-problem-lock"
HANDLER_IDS = (
    RECONCILE_ID,
    SPARK_TEMPLATES_ID,
    POOL_TIMER_ID,
    DRAIN_HANDLER_ID,
    CLEAN_SHUTDOWN_ID,
)


def config_of(memo: kopf.Memo) -> OperatorConfig:
    """The settings the startup handler read (kopf copies the memo to every handler)."""
    config = memo.get(CONFIG_KEY)
    if not isinstance(config, OperatorConfig):
        raise kopf.PermanentError("the operator's settings are missing: startup did not run")
    return config


@kopf.on.startup()
def start_operator(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Read the settings, configure kopf, and register the handlers of the features on."""
    config = OperatorConfig.from_environ(os.environ)
    memo[CONFIG_KEY] = config
    http_endpoint.READINESS.reset()
    startup.configure_kopf(settings, config, logger)
    startup.configure_peering(settings, config, time.time_ns())
    startup.serve_endpoint(config, logger)
    metrics.register_defaults(
        (handler, result)
        for handler in HANDLER_IDS
        for result in (metrics.RESULT_SUCCESS, metrics.RESULT_RETRY, metrics.RESULT_ERROR)
    )
    register_feature_handlers(config, kopf.get_default_registry(), logger)
    admission.prepare(config, logger)
    http_endpoint.READINESS.handlers_registered.set()


@kopf.on.login()
def log_in(
    logger: kopf.Logger, settings: kopf.OperatorSettings, **_: Any
) -> kopf.ConnectionInfo | None:
    """In a pod its ServiceAccount, else the kubeconfig; one line when neither can be used."""
    return login.log_in(logger, settings)


@contextmanager
def counted(handler: str) -> Iterator[None]:
    """Count one handler run by its result: success, retry (kopf.TemporaryError) or error."""
    try:
        yield
    except kopf.TemporaryError:
        metrics.handler_run(handler, metrics.RESULT_RETRY)
        raise
    except BaseException:
        metrics.handler_run(handler, metrics.RESULT_ERROR)
        raise
    metrics.handler_run(handler, metrics.RESULT_SUCCESS)


def register_feature_handlers(
    config: OperatorConfig, registry: kopf.OperatorRegistry, logger: kopf.Logger
) -> None:
    """The handlers of the optional features that are on (settings.OperatorFeatures)."""
    features = config.features
    if features.spark_pod_templates:
        for on_event in (kopf.on.resume, kopf.on.create, kopf.on.update):
            on_event(*RESOURCE, id=SPARK_TEMPLATES_ID, registry=registry)(render_spark_templates)
    else:
        logger.warning("Spark pod templates are switched off: spec.spark is not rendered")
    if features.volume_pool:
        # A timer's interval is fixed when it is registered: known only now. A run that fails
        # (an API error, a refused write) is tried again at the next interval, not after
        # kopf's default backoff of 60 s, which stalled the pool for a minute.
        interval = config.pool_interval_seconds
        kopf.timer(
            *RESOURCE, id=POOL_TIMER_ID, interval=interval, backoff=interval, registry=registry
        )(maintain_volume_pool)
        # kopf gives every object with a timer a finalizer: only with the pool, which has one.
        kopf.timer(
            *RESOURCE, id=RESYNC_ID, interval=interval, backoff=interval, registry=registry
        )(resync_durable_producer)
        kopf.on.delete(*RESOURCE, id=DRAIN_HANDLER_ID, backoff=interval, registry=registry)(
            drain_volumes_before_deletion
        )
        # The pods' last status, which the kubelet writes just before it deletes them.
        kopf.on.event(
            *POD_RESOURCE,
            id=CLEAN_SHUTDOWN_ID,
            labels={PRODUCER_LABEL: kopf.PRESENT},
            registry=registry,
        )(record_clean_shutdown)
    else:
        logger.warning(
            "the volume pool is switched off: no buffer volumes, no drain on deletion, no"
            " finalizer, and opted-in pods are not mutated"
        )


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
def reconcile_durable_producer(
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Compute the desired status and write what differs. Never raises on a bad spec.

    A bad spec is reported in the status; an unexpected error in the pure code is a bug that
    retrying cannot fix, so it fails the handler permanently (until the next change). Paused:
    only the ReconciliationPaused condition is written.
    """
    reconcile_status(body, meta, patch, logger, memo)


def missing_storage_class(
    body: kopf.Body, config: OperatorConfig, logger: kopf.Logger
) -> str | None:
    """The spec's StorageClass when the API server says there is none (review D8).

    Only with the volume pool on (no volumes otherwise; the read is the pool's access). No
    class in the spec (the cluster default) is not checked: without a default class such a
    PVC binds to a pre-provisioned volume without a class, which is a valid setup."""
    spec = reconcile.parse_spec(body.get("spec"))
    if not config.features.volume_pool or isinstance(spec, str):
        return None
    name = spec.storage.storage_class_name
    if not name:
        return None
    try:
        found = cluster(STORAGE_CLASSES_USER_AGENT).get_storage_class(name)
    except ApiException as error:
        logger.info("cannot read StorageClass %s (%s): not checked",
                    name, pool_actions.api_error_text(error))  # fmt: skip
        return None
    return name if found is None else None


def reconcile_status(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, logger: kopf.Logger, memo: kopf.Memo,
) -> None:  # fmt: skip
    """Write the status reconcile (pure) wants for this spec and generation (paused: only
    the ReconciliationPaused condition); warn about a bad spec (once: ``warn_once``).

    The conditions reconcile owns are applied first (status_writes), under its own field
    manager: the pool timer's stay as they are whatever this view of them is; the rest
    (observedGeneration last) goes into kopf's merge patch."""
    config = config_of(memo)
    with counted(RECONCILE_ID):
        current = dict(body.get("status") or {})
        now = datetime.now(UTC)
        if pause.is_paused(body):
            generation = (body.get("metadata") or {}).get("generation")
            conditions = pause.paused_conditions(
                current.get("conditions") or [], True, generation, now
            )
            write_reconcile_conditions(body, conditions or [], config)
            return
        missing = missing_storage_class(body, config, logger)
        try:
            outcome = reconcile.desired_status(
                body.get("spec"), current, meta.get("generation"), now, missing
            )
        except Exception as error:
            raise kopf.PermanentError(f"reconcile failed: {error!r}") from error
        desired = pause.resumed_status(outcome.status, meta.get("generation"), now)
        write_reconcile_conditions(body, desired.pop("conditions", []), config)
        current.pop("conditions", None)
        patch.status.update(reconcile.status_patch(current, desired))
    # A class still missing when the resync looks again was reported already: no new event.
    reported = missing is not None and reconcile.awaits_storage_class(body.get("status"))
    problem = None if outcome.problem is None else (
        meta.get("generation"), outcome.problem_reason or "Problem", outcome.problem)
    if warn_once(memo, problem) and problem is not None and not reported:
        logger.warning(outcome.problem)
        kopf.warn(body, reason=problem[1], message=problem[2])


def warn_once(memo: kopf.Memo, problem: tuple[Any, str, str] | None) -> bool:
    """Whether ``problem`` (generation, reason, message) of this object is new: not the one
    reported last by this process (None: the spec is fine again). kopf runs the create handler
    and the resync timer of a new object at once, each with the same snapshot without the
    status the other is writing, and both warned (two identical Warning events, CI); the
    object's memo, which kopf gives both, holds the last one, behind a lock."""
    lock = memo.setdefault(WARNED_LOCK_KEY, threading.Lock())  # setdefault: atomic
    with lock:
        if memo.get(WARNED_KEY) == problem:
            return False
        memo[WARNED_KEY] = problem
        return True


def write_reconcile_conditions(
    body: kopf.Body, conditions: list[dict[str, Any]], config: OperatorConfig
) -> None:
    """Apply reconcile's condition types (Degraded too without the pool); an API error is
    retried by kopf."""
    if not conditions:
        return
    try:
        status_writes.apply_conditions(
            cluster(STATUS_USER_AGENT), body, conditions,
            reconcile_conditions(config.features.volume_pool),
            status_writes.RECONCILE_FIELD_MANAGER,
        )  # fmt: skip
    except ApiException as error:
        raise kopf.TemporaryError(
            f"cannot write the conditions: {pool_actions.api_error_text(error)}",
            delay=config.pool_interval_seconds,
        ) from error


def resync_durable_producer(
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Timer (registered by start_operator with the volume pool): reconcile a generation that
    no event brought to reconcile (see the module doc), with its Spark templates when that
    feature is on.

    Also the pause condition, both ways, when it disagrees with the annotation. Nothing to do
    (the usual case) costs a comparison; a deleted object is the delete handler's."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    status = body.get("status") or {}
    paused = pause.is_paused(body)
    if pause.condition_is_stale(body):
        logger.info("the pause annotation is %s but the condition says otherwise: reconciling",
                    "set" if paused else "gone")  # fmt: skip
    elif reconcile.is_behind(meta.get("generation"), status) and not paused:
        logger.info(
            "generation %s is not reconciled yet (status.observedGeneration %s): reconciling",
            meta.get("generation"), status.get("observedGeneration"),
        )
    elif reconcile.awaits_storage_class(status) and not paused:
        # Looking for the class again (one GET); the spec is reconciled: no templates.
        logger.debug("checking again for the StorageClass the spec names")
        reconcile_status(body, meta, patch, logger, memo)
        return
    else:
        return
    reconcile_status(body, meta, patch, logger, memo)  # paused: the condition
    if not paused and config_of(memo).features.spark_pod_templates:
        render_spark_templates(body=body, patch=patch, logger=logger)


def render_spark_templates(
    body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any
) -> None:
    """Create, re-render or remove the templates ConfigMap; record its name in status.

    Registered by start_operator (resume, create, update) when the feature is on."""
    with counted(SPARK_TEMPLATES_ID):
        if not pause.is_paused(body):  # the condition is reconcile's to write
            patch.status.update(spark_actions.handle_spark_templates(body, logger))


def maintain_volume_pool(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Timer (registered by start_operator): release, drain, reclaim, audit, publish."""
    metadata = body.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return  # the delete handler owns the pool from here
    with counted(POOL_TIMER_ID):
        if pause.is_paused(body):  # the condition is reconcile's to write
            return
        update = pool_actions.handle_pool_timer(body, config_of(memo), logger)
        if not pool_actions.publish_pool_status(body, update.changes, logger):
            return  # the object changed meanwhile: the next run publishes from a fresh view
        metrics.POOL_FIGURES.observe(
            str(metadata.get("namespace")),
            str(metadata.get("name")),
            {**(body.get("status") or {}), **update.changes},
        )
        for warning in update.warnings:
            kopf.warn(body, reason=REASON_POOL_PROBLEM, message=warning)


def drain_volumes_before_deletion(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Hold the DurableProducer (our finalizer) until each volume is drained and deleted.

    Registered by start_operator (deletion) when the volume pool is on. Paused: it waits."""
    config = config_of(memo)
    with counted(DRAIN_HANDLER_ID):
        if pause.is_paused(body):
            raise kopf.TemporaryError(pause.PAUSED_MESSAGE, delay=config.pool_interval_seconds)
        pool_actions.handle_deletion(body, config, logger)
    metadata = body.get("metadata") or {}
    metrics.POOL_FIGURES.forget(str(metadata.get("namespace")), str(metadata.get("name")))


def record_clean_shutdown(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """Pod event (registered by start_operator with the volume pool): a pod whose agent
    stopped with its volume empty marks the volume empty (clean_shutdowns.py)."""
    with counted(CLEAN_SHUTDOWN_ID):
        clean_shutdowns.record_clean_shutdown(body, logger)


@kopf.on.mutate(
    *POD_RESOURCE,
    id=admission.MUTATION_WEBHOOK_ID,
    operations=[admission.MUTATED_OPERATION],
    labels={PRODUCER_LABEL: kopf.PRESENT},
)
async def attach_buffer_agent(
    body: kopf.Body,
    patch: kopf.Patch,
    dryrun: bool,
    warnings: list[str],
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Add the agent, env and a pool volume to a pod being created (served with a certificate
    and the volume pool on). kopf calls it for every operation the configuration sends.

    Async, so kopf runs it on its event loop at once, not queued behind the timers in its
    handler threads; the blocking work runs in the webhook's own threads, within a deadline
    counted from the review's arrival (admission.admit; D5)."""
    operation = kwargs.get("operation")  # kopf passes it; its handler protocol omits it
    answer = await admission.admit(
        body, operation=operation, dryrun=dryrun, config=config_of(memo), logger=logger,
        received=http_endpoint.review_received(),
    )  # fmt: skip
    warnings.extend(answer.warnings)
    if answer.ops:
        patch.fns.append(lambda target: jsonpatch.apply_patch(target, answer.ops, in_place=True))
