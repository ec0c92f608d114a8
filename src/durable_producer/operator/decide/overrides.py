"""Pure: a pod's own settings for its agent, from its annotations, validated.

A pod with the opt-in label may carry, next to it (names in contract.py):

- ``agent.durable.dev/inject: "false"``: an explicit opt-out. The pod gets no agent, no volume
  and no env, and the pool's audit does not report it.
- ``agent.durable.dev/cpu-request``, ``cpu-limit``, ``memory-request``, ``memory-limit``: the
  agent container's resources for this pod, each instead of the same amount in
  ``spec.agent.resources``.
- ``agent.durable.dev/fsync-policy``: ``always``, ``interval`` or ``never``, instead of
  ``spec.fsync.policy`` (the interval stays ``spec.fsync.intervalMs``).
- ``agent.durable.dev/log-level``: the agent's ``--log-level`` (DEBUG, INFO, WARNING, ERROR).

Every value is checked, and so is every other annotation under the ``agent.durable.dev/``
prefix (a misspelt name would otherwise be ignored in silence): the webhook refuses a pod
whose annotations are wrong, with one message per problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from durable_producer.contract import (
    AGENT_LOG_LEVELS,
    CPU_LIMIT_ANNOTATION,
    CPU_REQUEST_ANNOTATION,
    FSYNC_POLICIES,
    FSYNC_POLICY_ANNOTATION,
    INJECT_ANNOTATION,
    LOG_LEVEL_ANNOTATION,
    MEMORY_LIMIT_ANNOTATION,
    MEMORY_REQUEST_ANNOTATION,
    POD_OVERRIDE_PREFIX,
)
from durable_producer.operator.decide.kube_objects import annotations_of
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import QUANTITY_PATTERN, parse_quantity

INJECT_VALUES = ("true", "false")
# annotation -> (requests|limits, cpu|memory)
RESOURCE_ANNOTATIONS: dict[str, tuple[str, str]] = {
    CPU_REQUEST_ANNOTATION: ("requests", "cpu"),
    CPU_LIMIT_ANNOTATION: ("limits", "cpu"),
    MEMORY_REQUEST_ANNOTATION: ("requests", "memory"),
    MEMORY_LIMIT_ANNOTATION: ("limits", "memory"),
}
KNOWN_ANNOTATIONS = (
    INJECT_ANNOTATION,
    *RESOURCE_ANNOTATIONS,
    FSYNC_POLICY_ANNOTATION,
    LOG_LEVEL_ANNOTATION,
)
_QUANTITY = re.compile(QUANTITY_PATTERN)


@dataclass(frozen=True)
class PodOverrides:
    """What a pod's annotations change about its agent (nothing, by default)."""

    resources: dict[str, dict[str, str]] = field(default_factory=dict)  # requests/limits
    fsync_policy: str | None = None
    log_level: str | None = None


def opted_out(pod: Mapping[str, Any]) -> bool:
    """Whether the pod says ``agent.durable.dev/inject: "false"`` (exactly that value)."""
    return annotations_of(pod).get(INJECT_ANNOTATION) == "false"


def _choice(name: str, value: str, choices: tuple[str, ...], problems: list[str]) -> str | None:
    normalized = value.upper() if choices == AGENT_LOG_LEVELS else value
    if normalized in choices:
        return normalized
    problems.append(f"annotation {name}: {value!r} is not one of {', '.join(choices)}")
    return None


def _resources(annotations: Mapping[str, Any], problems: list[str]) -> dict[str, dict[str, str]]:
    resources: dict[str, dict[str, str]] = {}
    for name, (kind, resource) in RESOURCE_ANNOTATIONS.items():
        value = annotations.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not _QUANTITY.match(value):
            problems.append(
                f"annotation {name}: {value!r} is not a Kubernetes quantity such as 250m or 256Mi"
            )
            continue
        resources.setdefault(kind, {})[resource] = value
    return resources


def pod_overrides(pod: Mapping[str, Any]) -> PodOverrides | list[str]:
    """The pod's overrides, or every problem with its ``agent.durable.dev/`` annotations."""
    annotations = annotations_of(pod)
    problems = [
        f"annotation {name} is not known (known: {', '.join(KNOWN_ANNOTATIONS)}): fix its"
        " spelling or remove it"
        for name in sorted(annotations)
        if name.startswith(POD_OVERRIDE_PREFIX) and name not in KNOWN_ANNOTATIONS
    ]
    inject = annotations.get(INJECT_ANNOTATION)
    if inject is not None:
        _choice(INJECT_ANNOTATION, str(inject), INJECT_VALUES, problems)
    resources = _resources(annotations, problems)
    fsync = annotations.get(FSYNC_POLICY_ANNOTATION)
    log_level = annotations.get(LOG_LEVEL_ANNOTATION)
    overrides = PodOverrides(
        resources=resources,
        fsync_policy=(
            None
            if fsync is None
            else _choice(FSYNC_POLICY_ANNOTATION, str(fsync), FSYNC_POLICIES, problems)
        ),
        log_level=(
            None
            if log_level is None
            else _choice(LOG_LEVEL_ANNOTATION, str(log_level), AGENT_LOG_LEVELS, problems)
        ),
    )
    return problems or overrides


def _limit_below_request(resources: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    problems = []
    for resource in ("cpu", "memory"):
        request, limit = requests.get(resource), limits.get(resource)
        if request and limit and parse_quantity(limit) < parse_quantity(request):
            problems.append(
                f"the agent's {resource} limit {limit} is below its request {request} (with the"
                f" pod's {POD_OVERRIDE_PREFIX} annotations): raise the limit or lower the request"
            )
    return problems


def effective_spec(spec: DurableProducerSpec, overrides: PodOverrides) -> DurableProducerSpec | str:
    """The DurableProducer's spec as this pod's agent gets it, or why that cannot be."""
    if not overrides.resources and overrides.fsync_policy is None:
        return spec
    data = spec.model_dump(by_alias=True)
    resources = data["agent"]["resources"]
    for kind, amounts in overrides.resources.items():
        resources[kind] = {**(resources.get(kind) or {}), **amounts}
    if overrides.fsync_policy is not None:
        data["fsync"]["policy"] = overrides.fsync_policy
    problems = _limit_below_request(resources)
    if problems:
        return "; ".join(problems)
    try:
        return DurableProducerSpec.model_validate(data)
    except ValidationError as error:
        details = "; ".join(detail["msg"] for detail in error.errors(include_url=False))
        return f"the pod's {POD_OVERRIDE_PREFIX} annotations give an invalid agent: {details}"
