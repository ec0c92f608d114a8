"""kopf handlers for DurableProducer: thin wrappers around the pure functions in reconcile.py.

Run with::

    kopf run -m durable_producer.operator.handlers --standalone --all-namespaces \\
        --liveness=http://0.0.0.0:8080/healthz
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

import kopf

from durable_producer.operator import reconcile
from durable_producer.operator.model import GROUP, PLURAL, VERSION
from durable_producer.operator.settings import OperatorTuning

FINALIZER = f"{GROUP}/finalizer"

# Every Kubernetes API resource and verb the operator uses, as (apiGroup, resource, verbs).
# The Helm chart's ClusterRole is written from this list; keep them in step. The integration
# tests record every request the running operator makes and check it is covered here.
KUBERNETES_API_ACCESS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # Watching DurableProducers, and kopf's finalizer and progress annotations on them.
    (GROUP, PLURAL, ("list", "watch", "patch")),
    # Writing conditions, sizes and figures.
    (GROUP, f"{PLURAL}/status", ("patch",)),
    # kopf: Warning events for invalid specs and handler failures.
    ("", "events", ("create",)),
    # kopf: noticing when the CRD is installed or removed while the operator runs.
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
)

RESOURCE = (GROUP, VERSION, PLURAL)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Our own finalizer name, progress kept in annotations (status is ours), sane timeouts."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    tuning = OperatorTuning.from_environ(os.environ)
    # The API server ends each watch after server_timeout (kopf then re-lists and resumes);
    # the client gives up on a silent connection a little after that.
    settings.watching.server_timeout = tuning.watch_server_timeout
    settings.watching.client_timeout = tuning.watch_client_timeout
    settings.watching.connect_timeout = tuning.connect_timeout
    settings.networking.request_timeout = tuning.request_timeout
    settings.networking.connect_timeout = tuning.connect_timeout


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
def reconcile_durable_producer(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, logger: logging.Logger, **_: Any
) -> None:
    """Compute the desired status and patch what differs. Never raises on a bad spec.

    A bad spec is reported in the status; an unexpected error in the pure code is a bug that
    retrying cannot fix, so it fails the handler permanently (until the next change).
    """
    current_status = dict(body.get("status") or {})
    try:
        outcome = reconcile.desired_status(
            body.get("spec"), current_status, meta.get("generation"), datetime.now(UTC)
        )
    except Exception as error:
        raise kopf.PermanentError(f"reconcile failed: {error!r}") from error
    changes = reconcile.status_patch(current_status, outcome.status)
    if changes:
        patch.status.update(changes)
    if outcome.problem is not None:
        logger.warning(outcome.problem)
        kopf.warn(body, reason=outcome.problem_reason or "Problem", message=outcome.problem)


@kopf.on.delete(*RESOURCE)
def finalize_durable_producer(name: str, namespace: str, logger: logging.Logger, **_: Any) -> None:
    """Runs before the object goes (our finalizer holds it until then).

    Nothing is attached or buffered yet at this stage of the project; draining buffer
    volumes before releasing them belongs here once the PVC pool exists.
    """
    logger.info("DurableProducer %s/%s released", namespace, name)


# The webhook, the volume pool, drain Jobs, the pod audit and the Spark templates register
# their own handlers; importing them here lets `kopf run -m durable_producer.operator.handlers`
# load everything.
from durable_producer.operator import spark_handlers, webhook_handlers  # noqa: E402, F401
