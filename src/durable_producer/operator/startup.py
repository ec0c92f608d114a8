"""How kopf is set up when the operator starts, from the settings read at that moment."""

from __future__ import annotations

import logging

import kopf

from durable_producer.contract import GROUP
from durable_producer.operator import admission
from durable_producer.operator.settings import (
    WEBHOOK_CERT_FILE_ENV,
    WEBHOOK_KEY_FILE_ENV,
    OperatorConfig,
)

FINALIZER = f"{GROUP}/finalizer"


def configure_kopf(
    settings: kopf.OperatorSettings, config: OperatorConfig, logger: kopf.Logger
) -> None:
    """Our own finalizer name, progress kept in annotations (status is ours), sane timeouts,
    and the webhook server with the mounted certificate (the chart owns its configuration)."""
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
    settings.admission.managed = None
    if not config.features.volume_pool:
        # No volumes to give: the webhook is not served (the chart renders no configuration).
        settings.admission.server = admission.NoWebhookServer()
    else:
        settings.admission.server = admission.webhook_server(config.webhook)
        if not config.webhook.enabled:
            logger.warning(
                "no webhook certificate configured (%s, %s): pods are not mutated",
                WEBHOOK_CERT_FILE_ENV,
                WEBHOOK_KEY_FILE_ENV,
            )
