"""How kopf is set up when the operator starts, from the settings read at that moment.

Replicas (the chart runs two or more): every replica serves the admission webhook, and kopf's
peering (``kopf run --peering=NAME``, a ClusterKopfPeering or per-namespace KopfPeering
object) lets only one of them run the handlers at a time. kopf pauses a replica while a peer
of higher priority is alive, and keeps serving webhooks while paused. The priority is the
replica's start time, earliest first (``leadership_priority``): the replica that has led the
longest keeps leading, a restarted or new one waits, so a rolling update hands over once.
A leader that stops cleanly removes its record at once; one that dies (kill -9, a lost node)
is taken over when its record expires: ``DURABLE_PRODUCER_PEERING_LIFETIME_SECONDS``.
"""

from __future__ import annotations

import logging

import kopf

from durable_producer.contract import GROUP, PRODUCER_LABEL
from durable_producer.operator import http_endpoint, metrics
from durable_producer.operator.act import admission
from durable_producer.operator.settings import (
    WEBHOOK_CERT_FILE_ENV,
    WEBHOOK_KEY_FILE_ENV,
    OperatorConfig,
)

FINALIZER = f"{GROUP}/finalizer"
# A DurableProducer marked for deletion keeps kopf's finalizer until its timers (pool, resync)
# have exited. A timer's run in progress (a sync function in a thread) cannot exit at once, and
# kopf looks again only after settings.background.cancellation_polling: 60 s by default, so a
# deletion that met a pool run waited a minute for nothing. Look again after a second.
TIMER_EXIT_POLL_SECONDS = 1.0
# kopf's threads for sync handlers (reconcile, the pool and resync timers of every
# DurableProducer); its default is min(32, CPUs + 4), which depends on the node. The webhook
# has threads of its own (admission.ADMISSION_WORKERS) and scrapes run in a bounded pool
# (agent_scrape), so these only pace the timers: a run waits for a thread, never a review.
HANDLER_WORKERS = 16
_NANOSECONDS_PER_MICROSECOND = 1000


def leadership_priority(started_at_ns: int) -> int:
    """kopf peering priority of a replica started at ``started_at_ns`` (epoch, ns): minus the
    start time in microseconds, so the earliest-started live replica has the highest."""
    return -(started_at_ns // _NANOSECONDS_PER_MICROSECOND)


def configure_peering(
    settings: kopf.OperatorSettings, config: OperatorConfig, started_at_ns: int
) -> None:
    """Priority by start time (unless given on the command line) and the record's lifetime;
    keep-alives are not logged. Without --peering (``--standalone``) kopf ignores these."""
    if settings.peering.priority == 0:
        settings.peering.priority = leadership_priority(started_at_ns)
    settings.peering.lifetime = config.serving.peering_lifetime_seconds
    settings.peering.stealth = True


def configure_kopf(
    settings: kopf.OperatorSettings, config: OperatorConfig, logger: kopf.Logger
) -> None:
    """Our own finalizer name, progress kept in annotations (status is ours), sane timeouts,
    a fixed number of handler threads, and the webhook server with the mounted certificate
    (the chart owns its configuration)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    tuning = config.tuning
    # The API server ends each watch after server_timeout (kopf then re-lists and resumes);
    # the client gives up on a silent connection a little after that.
    settings.watching.server_timeout = tuning.watch_server_timeout
    settings.watching.client_timeout = tuning.watch_client_timeout
    settings.watching.connect_timeout = tuning.connect_timeout
    settings.networking.request_timeout = tuning.request_timeout
    settings.networking.connect_timeout = tuning.connect_timeout
    settings.background.cancellation_polling = TIMER_EXIT_POLL_SECONDS
    settings.execution.max_workers = HANDLER_WORKERS
    settings.admission.managed = None
    if not config.features.volume_pool:
        # No volumes to give: the webhook is not served (the chart renders no configuration).
        settings.admission.server = admission.NoWebhookServer()
        return
    # Only opted-in pods are watched (their last status: clean_shutdowns.py), selected by the
    # API server rather than every pod of the cluster sent to be filtered here.
    settings.watching.label_selectors["v1", "pods"] = PRODUCER_LABEL
    settings.admission.server = admission.webhook_server(config.webhook)
    http_endpoint.READINESS.webhook_expected = config.webhook.enabled
    if not config.webhook.enabled:
        logger.warning(
            "no webhook certificate configured (%s, %s): pods are not mutated",
            WEBHOOK_CERT_FILE_ENV,
            WEBHOOK_KEY_FILE_ENV,
        )


def serve_endpoint(config: OperatorConfig, logger: kopf.Logger) -> None:
    """Start /metrics and /readyz when a port is configured (the chart always sets one)."""
    metrics.configure(config.pool_interval_seconds)
    serving = config.serving
    if serving.metrics_port is None:
        logger.info("no metrics port configured: /metrics and /readyz are not served")
        return
    try:
        http_endpoint.start(serving.metrics_addr, serving.metrics_port)
    except OSError as error:
        logger.error(
            "cannot serve /metrics and /readyz on port %s: %s; this replica never reports"
            " ready",
            serving.metrics_port,
            error,
        )
