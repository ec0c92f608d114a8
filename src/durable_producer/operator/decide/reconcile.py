"""Pure reconciliation: (spec, current status, generation, now) -> desired status.

Nothing here talks to Kubernetes; the reconcile handler in handlers.py patches what this
returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from durable_producer.operator.decide.kube_objects import format_time
from durable_producer.operator.decide.sizing import (
    SizingInputs,
    runway_seconds,
    size_buffer,
    size_problem,
)
from durable_producer.operator.model.conditions import (
    DEGRADED,
    READY,
    REASON_AS_EXPECTED,
    REASON_INVALID_SPEC,
    REASON_RECONCILED,
    REASON_RUNWAY_BELOW_TARGET,
    REASON_STORAGE_CLASS_NOT_FOUND,
    REASON_VOLUMES_BELOW_SPEC,
    REASONS,
    capped_message,
)
from durable_producer.operator.model.model import PATTERN_DESCRIPTIONS, PLURAL, DurableProducerSpec
from durable_producer.operator.model.quantities import format_bytes, parse_bytes

__all__ = [
    "DEGRADED",
    "READY",
    "REASONS",
    "REASON_AS_EXPECTED",
    "REASON_INVALID_SPEC",
    "REASON_RECONCILED",
    "REASON_RUNWAY_BELOW_TARGET",
    "ReconcileOutcome",
    "awaits_storage_class",
    "desired_status",
    "is_behind",
    "parse_spec",
    "set_condition",
    "status_patch",
    "storage_class_missing",
]

StatusDict = dict[str, Any]


@dataclass(frozen=True)
class ReconcileOutcome:
    """The desired status, plus the problem (if any) worth a Kubernetes Warning event."""

    status: StatusDict
    problem: str | None = None
    problem_reason: str | None = None


def _field_path(location: Sequence[int | str]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _describe_error(error: ErrorDetails) -> str:
    path = _field_path(error["loc"])
    if error["type"] == "missing":
        return f"{path} is required: add it"
    if error["type"] == "extra_forbidden":
        return f"{path} is not a known field: remove it or fix its spelling"
    if error["type"] == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern", "")
        expected = PATTERN_DESCRIPTIONS.get(pattern, f"a string matching {pattern}")
        return f"{path} must be {expected} (got {error['input']!r})"
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message} (got {error['input']!r})"


def describe_validation_error(error: ValidationError) -> str:
    """One message that says which fields are wrong and what to do about each."""
    problems = [_describe_error(detail) for detail in error.errors(include_url=False)]
    first_field = _field_path(error.errors()[0]["loc"]).removeprefix("spec")
    explain = f"kubectl explain {PLURAL}.spec{first_field.split('[')[0]}"
    return (
        f"invalid spec: {'; '.join(problems)}. Fix the DurableProducer and apply it again"
        f" (see `{explain}`)."
    )


def parse_spec(raw_spec: Mapping[str, Any] | None) -> DurableProducerSpec | str:
    """The validated spec, or a message explaining exactly what is wrong with it."""
    if not raw_spec:
        return "invalid spec: spec is required: add spec.kafka and spec.throughput."
    try:
        spec = DurableProducerSpec.model_validate(dict(raw_spec))
    except ValidationError as error:
        return describe_validation_error(error)
    problem = size_problem(SizingInputs.from_spec(spec))
    if problem is not None:
        # What the CRD's CEL rule cannot tell: the agent's exact space budget.
        return (
            f"invalid spec: {problem}. Fix the DurableProducer and apply it again"
            f" (see `kubectl explain {PLURAL}.spec.storage.size`)."
        )
    return spec


def pool_spec(raw_spec: Mapping[str, Any] | None) -> DurableProducerSpec | str:
    """The spec as the volume pool reads it: ``spec.spark`` (the Spark templates) plays no part
    in draining or growing volumes, so a stored spec invalid only there (a container name
    from before the CRD checked it) still drains its pods' backlogs."""
    spec = parse_spec(raw_spec)
    if isinstance(spec, str) and raw_spec and "spark" in raw_spec:
        without_spark = parse_spec({k: v for k, v in raw_spec.items() if k != "spark"})
        if not isinstance(without_spark, str):
            return without_spark
    return spec


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Conditions with one type replaced; lastTransitionTime kept while its status is unchanged.

    The message is capped to what the CRD accepts (conditions.capped_message)."""
    previous = next((c for c in conditions if c.get("type") == condition_type), None)
    transition_time = format_time(now)
    if previous is not None and previous.get("status") == status:
        transition_time = previous.get("lastTransitionTime") or transition_time
    updated: dict[str, Any] = {
        "type": condition_type,
        "status": status,
        "reason": reason,
        "message": capped_message(message),
        "lastTransitionTime": transition_time,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    replaced = [dict(c) if c.get("type") != condition_type else updated for c in conditions]
    if previous is None:
        replaced.append(updated)
    return replaced


def smallest_volume_in_use(status: Mapping[str, Any]) -> int | None:
    """Bytes of the smallest volume pods use, from ``status.deployedVolumes`` (pool timer)."""
    sizes = [
        parse_bytes(str(group["size"]))
        for group in status.get("deployedVolumes") or []
        if (group.get("inUse") or 0) + (group.get("claimed") or 0) > 0 and group.get("size")
    ]
    return min(sizes) if sizes else None


def _volumes_below_spec(
    inputs: SizingInputs, size_bytes: int, smallest_in_use: int | None
) -> tuple[int, str] | None:
    """The runway of smaller volumes still in use, and a message, when it falls short."""
    if smallest_in_use is None or smallest_in_use >= size_bytes:
        return None
    runway = runway_seconds(smallest_in_use, inputs)
    if runway >= inputs.outage_seconds:
        return None
    return runway, (
        f"volumes of {format_bytes(smallest_in_use)} still in use are smaller than the"
        f" {format_bytes(size_bytes)} the spec asks for and survive only {runway}s of outage at"
        f" peak rate, less than spec.outageSeconds {inputs.outage_seconds}s; new pods get"
        " volumes that fit, so this ends as the old pods are replaced"
    )


def storage_class_missing(name: str) -> str:
    """Ready's message when ``spec.storage.storageClassName`` names no StorageClass."""
    return (
        f"spec.storage.storageClassName {name!r} names no StorageClass in the cluster: buffer"
        " volumes of that class would stay Pending, and the opted-in pods waiting for them"
        " would not start. Create the StorageClass, or set spec.storage.storageClassName to"
        " one that exists (`kubectl get storageclass`; leave it out for the cluster default);"
        " the operator checks again every pool interval"
    )


def awaits_storage_class(status: Mapping[str, Any] | None) -> bool:
    """Whether Ready says the spec's StorageClass was missing (the resync timer checks again)."""
    conditions = (status or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == READY), {})
    return ready.get("reason") == REASON_STORAGE_CLASS_NOT_FOUND


def desired_status(
    raw_spec: Mapping[str, Any] | None,
    current_status: Mapping[str, Any] | None,
    generation: int | None,
    now: datetime,
    missing_storage_class: str | None = None,
) -> ReconcileOutcome:
    """The status the object should have for this spec and generation.

    ``runwaySeconds`` is the runway of the smallest volume in use when that is shorter than
    what the spec's size buys (``status.deployedVolumes``, published by the pool timer).
    ``missing_storage_class``: the spec's StorageClass, which the API server says does not
    exist (Ready=False StorageClassNotFound; sizes and Degraded as for any valid spec).
    """
    current = dict(current_status or {})
    conditions: list[dict[str, Any]] = [dict(c) for c in current.get("conditions") or []]
    status: StatusDict = {
        "observedGeneration": generation,
        "bufferSize": current.get("bufferSize"),
        "runwaySeconds": current.get("runwaySeconds"),
        "attachedPods": current.get("attachedPods", 0),
        # The pool timer's, from the agents; unknown (absent) until one answers.
        "backlogBytes": current.get("backlogBytes"),
    }
    spec = parse_spec(raw_spec)
    if isinstance(spec, str):
        status["conditions"] = set_condition(
            conditions, READY, "False", REASON_INVALID_SPEC, spec, generation, now
        )
        return ReconcileOutcome(
            status=_without_none(status), problem=spec, problem_reason=REASON_INVALID_SPEC
        )

    inputs = SizingInputs.from_spec(spec)
    sizing = size_buffer(inputs)
    status["bufferSize"] = sizing.size_quantity
    status["runwaySeconds"] = sizing.runway_seconds
    ready_message = (
        f"buffer volumes of {sizing.size_quantity} survive {sizing.runway_seconds}s"
        " of Kafka outage at peak rate"
    )
    if missing_storage_class is None:
        conditions = set_condition(
            conditions, READY, "True", REASON_RECONCILED, ready_message, generation, now
        )
    else:
        conditions = set_condition(
            conditions, READY, "False", REASON_STORAGE_CLASS_NOT_FOUND,
            storage_class_missing(missing_storage_class), generation, now,
        )  # fmt: skip
    warning, reason = sizing.warning, sizing.warning_reason
    below = _volumes_below_spec(inputs, sizing.size_bytes, smallest_volume_in_use(current))
    if below is not None:
        status["runwaySeconds"] = min(sizing.runway_seconds, below[0])
        if warning is None:
            warning, reason = below[1], REASON_VOLUMES_BELOW_SPEC
    if warning is not None and reason is not None:
        conditions = set_condition(conditions, DEGRADED, "True", reason, warning, generation, now)
    else:
        conditions = set_condition(
            conditions, DEGRADED, "False", REASON_AS_EXPECTED, "", generation, now
        )
    status["conditions"] = conditions
    if missing_storage_class is not None:
        problem = storage_class_missing(missing_storage_class)
        return ReconcileOutcome(_without_none(status), problem, REASON_STORAGE_CLASS_NOT_FOUND)
    return ReconcileOutcome(status=_without_none(status), problem=warning, problem_reason=reason)


def _without_none(status: StatusDict) -> StatusDict:
    return {key: value for key, value in status.items() if value is not None}


def is_behind(generation: int | None, status: Mapping[str, Any] | None) -> bool:
    """Whether ``metadata.generation`` is newer than what the status says was reconciled.

    Level-triggered: the resync timer reconciles whenever this holds, whatever events kopf
    saw (or believed handled) in between."""
    if not isinstance(generation, int):
        return False
    observed = (status or {}).get("observedGeneration")
    return not isinstance(observed, int) or observed < generation


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> StatusDict:
    """The JSON merge patch of the keys that differ; keys owned by others are left alone.

    Empty when nothing changed, so repeated reconciles of the same state patch nothing.
    """
    current = current or {}
    return {key: value for key, value in desired.items() if current.get(key) != value}
