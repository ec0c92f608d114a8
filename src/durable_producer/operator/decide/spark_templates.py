"""Pure rendering of a DurableProducer's Spark-on-Kubernetes pod templates into a ConfigMap.

Spark builds its executor (and, optionally, driver) pods from these templates. They carry
what Spark cannot be told otherwise:

- the opt-in label, so the mutating webhook attaches the agent sidecar and a pool volume;
- the agent's address in the Spark container's env (the webhook sets it too, but the
  template makes it visible before admission, e.g. to ``kubectl apply --dry-run``);
- a termination grace period long enough for the agent to drain (the same minimum the
  webhook enforces, ``agent_container.MINIMUM_GRACE_SECONDS``).

The agent itself is not in the template: the webhook adds it, so the sidecar always matches
the DurableProducer's current spec. spark_actions.py reads the existing ConfigMap, calls
``plan_templates`` and carries out the returned action. The names the Spark conf helper looks
for (ConfigMap suffix, template keys, container names) come from the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from durable_producer.contract import (
    BOOTSTRAP_ENV,
    BOOTSTRAP_TWIN_ENV,
    DEFAULT_DRIVER_CONTAINER,
    DRIVER_TEMPLATE_KEY,
    EXECUTOR_TEMPLATE_KEY,
    GROUP,
    PRODUCER_LABEL,
    SPARK_TEMPLATES_CONFIGMAP_SUFFIX,
)
from durable_producer.operator.decide import agent_container, pod_mutation
from durable_producer.operator.decide.kube_objects import Object
from durable_producer.operator.decide.manifests import owner_reference
from durable_producer.operator.model.model import DurableProducerSpec

TEMPLATES_FOR_LABEL = f"{GROUP}/spark-templates-for"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "durable-producer-operator"
MAX_CONFIGMAP_NAME_LENGTH = 253

class TemplatesActionKind(StrEnum):
    NOTHING = "nothing"
    CREATE = "create"
    PATCH = "patch"
    DELETE = "delete"


@dataclass(frozen=True)
class TemplatesAction:
    """What to do to the templates ConfigMap; ``body`` is the manifest or merge patch."""

    kind: TemplatesActionKind
    name: str
    body: dict[str, Any] | None = None


def configmap_name(producer_name: str) -> str:
    """The ConfigMap name the Spark conf helper looks up (spark_integration.cluster)."""
    name = f"{producer_name}{SPARK_TEMPLATES_CONFIGMAP_SUFFIX}"
    if len(name) > MAX_CONFIGMAP_NAME_LENGTH:
        raise ValueError(
            f"DurableProducer name {producer_name!r} is too long for its Spark templates"
            f" ConfigMap {name[:40]}...: use a name of at most"
            f" {MAX_CONFIGMAP_NAME_LENGTH - len(name) + len(producer_name)} characters"
        )
    return name


def pod_template(producer_name: str, spec: DurableProducerSpec, container: str) -> dict[str, Any]:
    """A Pod manifest Spark uses as the base of the pods it creates (no image: Spark sets it)."""
    address = pod_mutation.bootstrap_address(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {PRODUCER_LABEL: producer_name}},
        "spec": {
            "terminationGracePeriodSeconds": agent_container.MINIMUM_GRACE_SECONDS,
            "containers": [
                {
                    "name": container,
                    "env": [
                        {"name": BOOTSTRAP_ENV, "value": address},
                        {"name": BOOTSTRAP_TWIN_ENV, "value": address},
                    ],
                }
            ],
        },
    }


def rendered_templates(producer_name: str, spec: DurableProducerSpec) -> dict[str, str]:
    """The ConfigMap's data: template file name -> YAML text (deterministic, for idempotence)."""
    templates: dict[str, dict[str, Any]] = {}
    if spec.spark.executor_template:
        templates[EXECUTOR_TEMPLATE_KEY] = pod_template(
            producer_name, spec, spec.spark.container_name
        )
    if spec.spark.driver_template:
        templates[DRIVER_TEMPLATE_KEY] = pod_template(producer_name, spec, DEFAULT_DRIVER_CONTAINER)
    return {key: yaml.safe_dump(template, sort_keys=False) for key, template in templates.items()}


def templates_configmap(producer: Object, spec: DurableProducerSpec) -> dict[str, Any] | None:
    """The ConfigMap manifest, owned by the DurableProducer; None when no template is wanted."""
    metadata = producer.get("metadata") or {}
    name = str(metadata.get("name"))
    data = rendered_templates(name, spec)
    if not data:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(name),
            "namespace": metadata.get("namespace"),
            "labels": {TEMPLATES_FOR_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [owner_reference(producer)],
        },
        "data": data,
    }


def configmap_patch(existing: Object, desired: Object) -> dict[str, Any] | None:
    """The JSON merge patch that makes ``existing`` render ``desired``; None when it does.

    Labels are merged (others' labels stay), owner references and data are replaced: a
    template key no longer wanted is removed with a null.
    """
    patch: dict[str, Any] = {}
    have_meta = existing.get("metadata") or {}
    want_meta = desired["metadata"]
    have_labels = have_meta.get("labels") or {}
    labels = {k: v for k, v in want_meta["labels"].items() if have_labels.get(k) != v}
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    if have_meta.get("ownerReferences") != want_meta["ownerReferences"]:
        patch.setdefault("metadata", {})["ownerReferences"] = want_meta["ownerReferences"]
    have_data = existing.get("data") or {}
    want_data = desired["data"]
    data: dict[str, str | None] = {k: v for k, v in want_data.items() if have_data.get(k) != v}
    data.update({key: None for key in have_data if key not in want_data})
    if data:
        patch["data"] = data
    return patch or None


def plan_templates(
    producer: Object, spec: DurableProducerSpec, existing: Object | None
) -> TemplatesAction:
    """Create, patch, delete or leave the templates ConfigMap (``existing``: as last read)."""
    name = configmap_name(str((producer.get("metadata") or {}).get("name")))
    desired = templates_configmap(producer, spec)
    if desired is None:
        if existing is None or not _rendered_by_us(existing, producer):
            return TemplatesAction(TemplatesActionKind.NOTHING, name)
        return TemplatesAction(TemplatesActionKind.DELETE, name)
    if existing is None:
        return TemplatesAction(TemplatesActionKind.CREATE, name, desired)
    patch = configmap_patch(existing, desired)
    if patch is None:
        return TemplatesAction(TemplatesActionKind.NOTHING, name)
    return TemplatesAction(TemplatesActionKind.PATCH, name, patch)


def _rendered_by_us(configmap: Object, producer: Object) -> bool:
    """Only a ConfigMap owned by this DurableProducer is ever deleted."""
    uid = (producer.get("metadata") or {}).get("uid")
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("uid") == uid for owner in owners)


def wanted(spec: DurableProducerSpec) -> bool:
    """Whether the spec asks for any template (else the ConfigMap should not exist)."""
    return spec.spark.executor_template or spec.spark.driver_template
