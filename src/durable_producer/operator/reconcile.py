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

from durable_producer.operator.kube_objects import format_time
from durable_producer.operator.model import PATTERN_DESCRIPTIONS, PLURAL, DurableProducerSpec
from durable_producer.operator.sizing import SizingInputs, size_buffer

READY = "Ready"
DEGRADED = "Degraded"

REASON_RECONCILED = "Reconciled"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_RUNWAY_BELOW_TARGET = "RunwayBelowTarget"
REASON_AS_EXPECTED = "AsExpected"

# What each condition reason means; docs/operator.md explains the same list (a test checks).
REASONS: dict[str, str] = {
    REASON_RECONCILED: "Ready=True: the spec is valid and the buffer size is computed.",
    REASON_INVALID_SPEC: "Ready=False: the spec cannot be used; the message names the field.",
    REASON_RUNWAY_BELOW_TARGET: (
        "Degraded=True: spec.storage.size survives a shorter outage than spec.outageSeconds."
    ),
    REASON_AS_EXPECTED: "Degraded=False: nothing is known to be wrong.",
}

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
        return DurableProducerSpec.model_validate(dict(raw_spec))
    except ValidationError as error:
        return describe_validation_error(error)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Conditions with one type replaced; lastTransitionTime kept while its status is unchanged."""
    previous = next((c for c in conditions if c.get("type") == condition_type), None)
    transition_time = format_time(now)
    if previous is not None and previous.get("status") == status:
        transition_time = previous.get("lastTransitionTime") or transition_time
    updated: dict[str, Any] = {
        "type": condition_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition_time,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    replaced = [dict(c) if c.get("type") != condition_type else updated for c in conditions]
    if previous is None:
        replaced.append(updated)
    return replaced


def desired_status(
    raw_spec: Mapping[str, Any] | None,
    current_status: Mapping[str, Any] | None,
    generation: int | None,
    now: datetime,
) -> ReconcileOutcome:
    """The status the object should have for this spec and generation."""
    current = dict(current_status or {})
    conditions: list[dict[str, Any]] = [dict(c) for c in current.get("conditions") or []]
    status: StatusDict = {
        "observedGeneration": generation,
        "bufferSize": current.get("bufferSize"),
        "runwaySeconds": current.get("runwaySeconds"),
        "attachedPods": current.get("attachedPods", 0),
        "backlogBytes": current.get("backlogBytes", 0),
    }
    spec = parse_spec(raw_spec)
    if isinstance(spec, str):
        status["conditions"] = set_condition(
            conditions, READY, "False", REASON_INVALID_SPEC, spec, generation, now
        )
        return ReconcileOutcome(
            status=_without_none(status), problem=spec, problem_reason=REASON_INVALID_SPEC
        )

    sizing = size_buffer(SizingInputs.from_spec(spec))
    status["bufferSize"] = sizing.size_quantity
    status["runwaySeconds"] = sizing.runway_seconds
    ready_message = (
        f"buffer volumes of {sizing.size_quantity} survive {sizing.runway_seconds}s"
        " of Kafka outage at peak rate"
    )
    conditions = set_condition(
        conditions, READY, "True", REASON_RECONCILED, ready_message, generation, now
    )
    if sizing.warning is not None:
        conditions = set_condition(
            conditions,
            DEGRADED,
            "True",
            REASON_RUNWAY_BELOW_TARGET,
            sizing.warning,
            generation,
            now,
        )
    else:
        conditions = set_condition(
            conditions, DEGRADED, "False", REASON_AS_EXPECTED, "", generation, now
        )
    status["conditions"] = conditions
    return ReconcileOutcome(
        status=_without_none(status),
        problem=sizing.warning,
        problem_reason=REASON_RUNWAY_BELOW_TARGET if sizing.warning else None,
    )


def _without_none(status: StatusDict) -> StatusDict:
    return {key: value for key, value in status.items() if value is not None}


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> StatusDict:
    """The JSON merge patch of the keys that differ; keys owned by others are left alone.

    Empty when nothing changed, so repeated reconciles of the same state patch nothing.
    """
    current = current or {}
    return {key: value for key, value in desired.items() if current.get(key) != value}
