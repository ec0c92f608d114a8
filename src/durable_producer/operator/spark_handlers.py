"""kopf handler that keeps each DurableProducer's Spark pod templates ConfigMap rendered.

Thin: spark_templates.py decides; this reads the ConfigMap, carries out the decision and
records the ConfigMap's name in ``status.sparkTemplatesConfigMap``. Runs on create, on every
change and on operator start (resume), so a spec change re-renders the templates and a
restart repairs a ConfigMap edited or deleted meanwhile. Loaded with the other handlers
(handlers.py imports this module).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from durable_producer.operator import reconcile, spark_templates
from durable_producer.operator.kube_client import api_client
from durable_producer.operator.model import GROUP, PLURAL, VERSION
from durable_producer.operator.spark_templates import TemplatesActionKind

STATUS_FIELD = "sparkTemplatesConfigMap"
# Its own User-Agent, so audit logs (and tests) tell these requests from the volume pool's.
USER_AGENT = "durable-producer-operator/spark-templates"
RETRY_DELAY_SECONDS = 10

# Kubernetes API access of this module, in the form of handlers.KUBERNETES_API_ACCESS; the
# chart grants it with rbac.features.sparkPodTemplates.
SPARK_TEMPLATES_API_ACCESS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "configmaps", ("get", "create", "patch", "delete")),
)

RESOURCE = (GROUP, VERSION, PLURAL)


_core_api: kubernetes.client.CoreV1Api | None = None
_core_api_lock = threading.Lock()


def core_api() -> kubernetes.client.CoreV1Api:
    """One API client per process: in-cluster configuration, else the kubeconfig."""
    global _core_api
    with _core_api_lock:
        if _core_api is None:
            _core_api = kubernetes.client.CoreV1Api(api_client(USER_AGENT))
        return _core_api


def _read_configmap(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        response = core_api().read_namespaced_config_map(name, namespace, _preload_content=False)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    found: dict[str, Any] = json.loads(response.data or b"null")
    return found


def _apply(namespace: str, action: spark_templates.TemplatesAction) -> None:
    core = core_api()
    if action.kind is TemplatesActionKind.CREATE:
        core.create_namespaced_config_map(namespace, action.body, _preload_content=False)
    elif action.kind is TemplatesActionKind.PATCH:
        core.patch_namespaced_config_map(
            action.name,
            namespace,
            action.body,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
    elif action.kind is TemplatesActionKind.DELETE:
        try:
            core.delete_namespaced_config_map(action.name, namespace, _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                raise


def api_failure(
    error: ApiException, doing: str, namespace: str, configmap: str
) -> kopf.PermanentError | kopf.TemporaryError:
    """Missing RBAC will not fix itself (until the next change); anything else is retried."""
    if error.status == 403:
        return kopf.PermanentError(
            f"the operator may not {doing} ConfigMap {namespace}/{configmap}: enable the"
            " chart's rbac.features.sparkPodTemplates, or set spec.spark.executorTemplate and"
            " spec.spark.driverTemplate to false"
        )
    return kopf.TemporaryError(
        f"cannot {doing} ConfigMap {namespace}/{configmap}: HTTP {error.status} {error.reason}",
        delay=RETRY_DELAY_SECONDS,
    )


@kopf.on.resume(*RESOURCE, id="spark-templates")
@kopf.on.create(*RESOURCE, id="spark-templates")
@kopf.on.update(*RESOURCE, id="spark-templates")
def render_spark_templates(
    body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any
) -> None:
    """Create, re-render or remove the templates ConfigMap; record its name in status."""
    metadata = body.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return  # the ConfigMap goes with its owner
    spec = reconcile.parse_spec(body.get("spec"))
    if isinstance(spec, str):
        return  # the reconcile handler reports the invalid spec
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    recorded = (body.get("status") or {}).get(STATUS_FIELD)
    if not spark_templates.wanted(spec) and not recorded:
        return  # nothing rendered, nothing to remove: no API access needed
    try:
        configmap = spark_templates.configmap_name(name)
    except ValueError as error:
        raise kopf.PermanentError(str(error)) from error
    try:
        existing = _read_configmap(namespace, configmap)
    except ApiException as error:
        raise api_failure(error, "read", namespace, configmap) from error
    action = spark_templates.plan_templates(body, spec, existing)
    try:
        _apply(namespace, action)
    except ApiException as error:
        raise api_failure(error, str(action.kind), namespace, configmap) from error
    if action.kind is not TemplatesActionKind.NOTHING:
        logger.info("Spark pod templates ConfigMap %s: %s", action.name, action.kind)
    value = action.name if spark_templates.wanted(spec) else None
    if recorded != value:
        patch.status[STATUS_FIELD] = value
