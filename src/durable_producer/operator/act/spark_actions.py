"""Keeping a DurableProducer's Spark pod templates ConfigMap rendered (spark_templates.py decides).

``handle_spark_templates`` reads the ConfigMap, carries out the planned action and returns
the status change that records the ConfigMap's name in ``status.sparkTemplatesConfigMap``.
It runs on create, on every change and on operator start (resume), so a spec change
re-renders the templates and a restart repairs a ConfigMap edited or deleted meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.operator.act.api_access import SPARK_TEMPLATES_USER_AGENT
from durable_producer.operator.act.cluster import cluster, ignore_statuses
from durable_producer.operator.decide import reconcile, spark_templates
from durable_producer.operator.decide.spark_templates import TemplatesAction, TemplatesActionKind

STATUS_FIELD = "sparkTemplatesConfigMap"
RETRY_DELAY_SECONDS = 10


def _apply(namespace: str, action: TemplatesAction) -> None:
    api = cluster(SPARK_TEMPLATES_USER_AGENT)
    if action.kind is TemplatesActionKind.CREATE and action.body is not None:
        api.create_configmap(namespace, action.body)
    elif action.kind is TemplatesActionKind.PATCH and action.body is not None:
        api.patch_configmap(namespace, action.name, action.body)
    elif action.kind is TemplatesActionKind.DELETE:
        ignore_statuses(partial(api.delete_configmap, namespace, action.name), 404)


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


def handle_spark_templates(producer: Mapping[str, Any], logger: kopf.Logger) -> dict[str, Any]:
    """Create, re-render or remove the templates ConfigMap; the status changes (merge patch)."""
    metadata = producer.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return {}  # the ConfigMap goes with its owner
    spec = reconcile.parse_spec(producer.get("spec"))
    if isinstance(spec, str):
        return {}  # the reconcile handler reports the invalid spec
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    recorded = (producer.get("status") or {}).get(STATUS_FIELD)
    if not spark_templates.wanted(spec) and not recorded:
        return {}  # nothing rendered, nothing to remove: no API access needed
    try:
        configmap = spark_templates.configmap_name(name)
    except ValueError as error:
        raise kopf.PermanentError(str(error)) from error
    try:
        existing = cluster(SPARK_TEMPLATES_USER_AGENT).read_configmap(namespace, configmap)
    except ApiException as error:
        raise api_failure(error, "read", namespace, configmap) from error
    action = spark_templates.plan_templates(producer, spec, existing)
    try:
        _apply(namespace, action)
    except ApiException as error:
        raise api_failure(error, str(action.kind), namespace, configmap) from error
    if action.kind is not TemplatesActionKind.NOTHING:
        logger.info("Spark pod templates ConfigMap %s: %s", action.name, action.kind)
    value = action.name if spark_templates.wanted(spec) else None
    return {STATUS_FIELD: value} if recorded != value else {}
