"""The DurableProducer CustomResourceDefinition, generated from the pydantic models.

``python -m durable_producer.operator.crd`` prints the CRD YAML; the committed
``crds/durableproducers.durable.dev.yaml`` must equal that output (a unit test checks it).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml
from pydantic import BaseModel

from durable_producer.operator.decide import sizing
from durable_producer.operator.model import model
from durable_producer.operator.model.quantities import MIB

CRD_NAME = f"{model.PLURAL}.{model.GROUP}"
CRD_FILE_NAME = f"{CRD_NAME}.yaml"

# JSON-schema keywords that a structural openAPIV3Schema may carry over from pydantic's output.
_KEPT_KEYWORDS = (
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "required",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
)

JsonSchema = dict[str, Any]


def _without_nulls(value: Any) -> Any:
    """Drop None entries from defaults: Kubernetes defaults must not contain nulls."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _structural(node: JsonSchema, definitions: dict[str, JsonSchema]) -> JsonSchema:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node.

    Inlines ``$ref``s, turns ``Optional[X]`` (anyOf X|null) into X, drops titles and
    ``additionalProperties: false`` (the API server prunes or, with kubectl's default
    strict field validation, rejects unknown fields instead).
    """
    merged = dict(node)
    any_of = merged.pop("anyOf", None)
    if any_of is not None:
        not_null = [option for option in any_of if option.get("type") != "null"]
        if len(not_null) != 1:
            raise ValueError(f"cannot express a union of {not_null} in a structural schema")
        merged = {**not_null[0], **merged}
    reference = merged.pop("$ref", None)
    if reference is not None:
        target = definitions[reference.removeprefix("#/$defs/")]
        merged = {**target, **merged}
        # The referencing field's description wins over the model's docstring.
        if "description" in node:
            merged["description"] = node["description"]
    result: JsonSchema = {key: merged[key] for key in _KEPT_KEYWORDS if key in merged}
    if result.get("default", ...) is None:
        del result["default"]  # "absent" is how an optional field says "not set"
    elif "default" in result:
        result["default"] = _without_nulls(result["default"])
    if "properties" in merged:
        result["properties"] = {
            name: _structural(child, definitions) for name, child in merged["properties"].items()
        }
    if "items" in merged:
        result["items"] = _structural(merged["items"], definitions)
    if "type" not in result:
        raise ValueError(f"structural schemas need a type on every node: {node}")
    return result


def model_schema(model_class: type[BaseModel]) -> JsonSchema:
    """The structural openAPIV3Schema of one pydantic model."""
    raw = model_class.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


STORAGE_SIZE_MESSAGE = (
    "spec.storage.size is too small for two WAL segments (spec.agent.segmentSizeMib),"
    " the agent's reserve and the filesystem's overhead"
)


def storage_size_rule(spec: JsonSchema) -> JsonSchema:
    """CEL: spec.storage.size holds two WAL segments, the agent's reserve and the filesystem.

    The exact test is the agent's space budget (volume_budget; reconcile reports InvalidSpec
    with the numbers). This rule is a lower bound of it, ``2 * segment + C`` MiB, with C the
    smallest margin over every segment size the schema allows, so it never refuses a size the
    budget accepts. Quantities in CEL need Kubernetes 1.29+.

    The API server estimates each rule's cost before it accepts the CRD, and a string built at
    run time (``string(int) + 'Mi'``) counts as unbounded: ``quantity()`` of one, or a message
    concatenating one, put the CRD over its budget by more than 100x and the API server refused
    it (NEW-1). So the bound is built as a number (``quantity('0').add(bytes)``) and the message
    names the formula, with the figure for the default segment size written out.
    """
    segment_schema = spec["properties"]["agent"]["properties"]["segmentSizeMib"]
    sizes = range(segment_schema["minimum"], segment_schema["maximum"] + 1)
    margin = sizing.minimum_size_margin_mib(sizes)
    segment = (
        "(has(self.agent) && has(self.agent.segmentSizeMib) ? self.agent.segmentSizeMib"
        f" : {segment_schema['default']})"
    )
    minimum_bytes = f"({sizing.SEGMENTS_ON_DISK} * {segment} + {margin}) * {MIB}"
    default_minimum = sizing.SEGMENTS_ON_DISK * segment_schema["default"] + margin
    return {
        "rule": "!has(self.storage) || !has(self.storage.size)"
        f" || quantity(self.storage.size).compareTo(quantity('0').add({minimum_bytes})) >= 0",
        "message": STORAGE_SIZE_MESSAGE,
        "messageExpression": "'spec.storage.size ' + self.storage.size + ' is too small: it"
        f" must be at least {sizing.SEGMENTS_ON_DISK} x spec.agent.segmentSizeMib + {margin} MiB"
        f" ({default_minimum}Mi with the default {segment_schema['default']} MiB segments) for"
        " two WAL segments, the agent reserve and the filesystem overhead'",
        "fieldPath": ".storage.size",
    }


LABEL_VALUE_MAX_LENGTH = 63
"""Kubernetes' limit on a label value; the DurableProducer's name is one (pods' and volumes'
``durable.dev/producer`` and pool labels)."""


def name_length_rule() -> JsonSchema:
    """CEL: a name longer than a label value is refused at create, not found unusable later
    (every pod labelled with it refused, no volume labelled for it) (review D10)."""
    return {
        "rule": f"size(self.metadata.name) <= {LABEL_VALUE_MAX_LENGTH}",
        "message": f"metadata.name must be at most {LABEL_VALUE_MAX_LENGTH} characters: pods"
        " name their DurableProducer in a label, and a label value is at most"
        f" {LABEL_VALUE_MAX_LENGTH} characters",
    }


def resource_schema() -> JsonSchema:
    """The openAPIV3Schema of the whole DurableProducer object."""
    spec = model_schema(model.DurableProducerSpec)
    spec["description"] = "Desired state: how much to buffer and where to forward it."
    spec["x-kubernetes-validations"] = [storage_size_rule(spec)]
    status = model_schema(model.DurableProducerStatus)
    status["description"] = "Observed state, written by the operator."
    return {
        "type": "object",
        "description": "Durable producer-side buffering in front of Kafka for opted-in pods.",
        "required": ["spec"],
        "x-kubernetes-validations": [name_length_rule()],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


PRINTER_COLUMNS: list[JsonSchema] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Size", "type": "string", "jsonPath": ".status.bufferSize"},
    {"name": "Runway", "type": "integer", "jsonPath": ".status.runwaySeconds", "priority": 1},
    {"name": "Pods", "type": "integer", "jsonPath": ".status.attachedPods"},
    {"name": "Backlog", "type": "integer", "jsonPath": ".status.backlogBytes"},
    {"name": "Outdated", "type": "integer", "jsonPath": ".status.outdatedAgents"},
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition() -> JsonSchema:
    """The complete apiextensions.k8s.io/v1 CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": model.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": model.KIND,
                "listKind": f"{model.KIND}List",
                "plural": model.PLURAL,
                "singular": model.SINGULAR,
                "shortNames": list(model.SHORT_NAMES),
            },
            "versions": [
                {
                    "name": model.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": resource_schema()},
                }
            ],
        },
    }


def render_yaml() -> str:
    """The CRD as the YAML text committed in crds/."""
    header = (
        "# Generated by `python -m durable_producer.operator.crd` from"
        " durable_producer/operator/model/model.py.\n# Do not edit by hand.\n"
    )
    body: str = yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100)
    return header + body


def strict_schema(schema: JsonSchema) -> JsonSchema:
    """A copy that rejects unknown fields, like kubectl's default strict field validation.

    Structural CRD schemas may not say ``additionalProperties: false``; a client-side
    validator (jsonschema) needs it to catch typos the API server would reject.
    The free-form ``metadata`` object is left open.
    """
    strict = copy.deepcopy(schema)

    def close(node: JsonSchema, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False
            for name, child in node["properties"].items():
                if path or name != "metadata":
                    close(child, f"{path}.{name}")
        if "items" in node:
            close(node["items"], f"{path}[]")

    close(strict, "")
    return strict


def main() -> None:
    sys.stdout.write(render_yaml())


if __name__ == "__main__":
    main()
