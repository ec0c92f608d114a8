"""The conditions and reasons a user can see on a DurableProducer: defined once, here.

docs/operator.md has a table with every (condition, reason) below; a unit test checks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

READY = "Ready"
DEGRADED = "Degraded"
DELETING = "Deleting"
RECONCILIATION_PAUSED = "ReconciliationPaused"
BACKLOG_CANNOT_DRAIN = "BacklogCannotDrain"

# The CRD's limit on a condition's message (status.conditions[].message maxLength, as
# metav1.Condition). A longer one makes the API server refuse the whole status write (422) and
# the status would stay as it was for good; messages are cut to it (capped_message).
MAX_CONDITION_MESSAGE = 32768

REASON_RECONCILED = "Reconciled"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_STORAGE_CLASS_NOT_FOUND = "StorageClassNotFound"
REASON_AS_EXPECTED = "AsExpected"
REASON_RUNWAY_BELOW_TARGET = "RunwayBelowTarget"
REASON_VERY_LARGE_VOLUME = "VeryLargeVolume"
REASON_VOLUMES_BELOW_SPEC = "VolumesBelowSpec"
REASON_POOL_PROBLEM = "VolumePoolProblem"
REASON_DRAINING = "DrainingVolumes"
REASON_BACKLOG_HELD = "BacklogHeld"
REASON_PAUSED = "PauseAnnotation"
REASON_RESUMED = "Resumed"
REASON_INGEST_ABOVE_FORWARD_RATE = "IngestAboveForwardRate"
REASON_FORWARDING_KEEPS_UP = "ForwardingKeepsUp"
REASON_NO_AGENT_FIGURES = "NoAgentFigures"

# (condition, status, reason) -> what it means; docs/operator.md explains each.
REASONS: dict[tuple[str, str, str], str] = {
    (READY, "True", REASON_RECONCILED): "the spec is valid and the buffer size is computed",
    (READY, "False", REASON_INVALID_SPEC): "the spec cannot be used; the message says why",
    (READY, "False", REASON_STORAGE_CLASS_NOT_FOUND): (
        "spec.storage.storageClassName names no StorageClass: volumes could not be provisioned"
    ),
    (DEGRADED, "True", REASON_RUNWAY_BELOW_TARGET): (
        "spec.storage.size survives a shorter outage than spec.outageSeconds"
    ),
    (DEGRADED, "True", REASON_VERY_LARGE_VOLUME): (
        "the computed size is larger than many storage classes provision"
    ),
    (DEGRADED, "True", REASON_VOLUMES_BELOW_SPEC): (
        "volumes in use are smaller than the spec asks: their runway is shorter"
    ),
    (DEGRADED, "True", REASON_POOL_PROBLEM): (
        "the volume pool has a problem: Pending volumes, failed drains, pods without an agent"
    ),
    (DEGRADED, "False", REASON_AS_EXPECTED): "nothing is known to be wrong",
    (DELETING, "True", REASON_DRAINING): "being deleted: waiting for pods to end and drains",
    (DELETING, "True", REASON_BACKLOG_HELD): (
        "being deleted, but volumes that may hold backlog cannot be drained: held until"
        " drained or abandoned"
    ),
    (RECONCILIATION_PAUSED, "True", REASON_PAUSED): (
        "the pause annotation is set: no reconcile, pool work or drain on deletion (pause.py)"
    ),
    (RECONCILIATION_PAUSED, "False", REASON_RESUMED): "the pause annotation was removed",
    (BACKLOG_CANNOT_DRAIN, "True", REASON_INGEST_ABOVE_FORWARD_RATE): (
        "an agent takes in more than it can forward: its backlog grows until the buffer fills"
    ),
    (BACKLOG_CANNOT_DRAIN, "False", REASON_FORWARDING_KEEPS_UP): (
        "every agent that answered forwards at least what it takes in"
    ),
    (BACKLOG_CANNOT_DRAIN, "Unknown", REASON_NO_AGENT_FIGURES): "no agent answered",
}


# One writer per condition type (review D7). Each writes its types by server-side apply under
# its own field manager, always all of them: the API server merges the list by type
# (listType=map), so a write never touches another writer's types, and a type its writer no
# longer sends is removed. The reconcile handler (and the resync timer, which reconciles):
RECONCILE_CONDITIONS = frozenset({READY, RECONCILIATION_PAUSED})
# The pool timer: Degraded holds the pool's problems next to what the spec gives, so with
# the volume pool on it is the pool timer's; with the pool off (no timer) reconcile's.
POOL_CONDITIONS = frozenset({DEGRADED, BACKLOG_CANNOT_DRAIN})
# The delete handler.
DELETION_CONDITIONS = frozenset({DELETING})


def reconcile_conditions(volume_pool: bool) -> frozenset[str]:
    """The condition types the reconcile handler writes: Degraded too without the pool."""
    return RECONCILE_CONDITIONS if volume_pool else RECONCILE_CONDITIONS | {DEGRADED}


def owned(conditions: Iterable[Mapping[str, Any]], types: Iterable[str]) -> list[dict[str, Any]]:
    """The conditions of ``types`` among ``conditions`` (what one writer applies), in order."""
    wanted = frozenset(types)
    return [dict(c) for c in conditions if c.get("type") in wanted]


def owned_differ(
    current: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]], types: Iterable[str]
) -> bool:
    """Whether ``desired`` changes any condition of ``types`` (then the writer applies)."""
    def by_type(conditions: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        return {str(c.get("type")): c for c in owned(conditions, types)}

    return by_type(current) != by_type(desired)


def capped_message(message: str) -> str:
    """``message`` within MAX_CONDITION_MESSAGE characters, saying how much was cut."""
    if len(message) <= MAX_CONDITION_MESSAGE:
        return message
    tail = f" ... ({len(message)} characters in all; the rest is in the operator's log)"
    return message[: MAX_CONDITION_MESSAGE - len(tail)] + tail
