"""Pausing reconciliation by annotation (pause.py): the condition and its transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_producer.contract import PAUSE_ANNOTATION
from durable_producer.operator.decide import pause
from durable_producer.operator.model import conditions

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("value", "paused"), [
    ("true", True), ("True", True), ("false", False), ("", False), (None, False)])
def test_only_true_pauses(value: str | None, paused: bool) -> None:
    annotations = {} if value is None else {PAUSE_ANNOTATION: value}

    assert pause.is_paused({"metadata": {"annotations": annotations}}) is paused


def test_the_annotation_is_outside_kopfs_own_prefix() -> None:
    """kopf ignores changes to annotations under its storage prefix (durable.dev/): a pause
    there would never trigger the update handler."""
    assert not PAUSE_ANNOTATION.startswith("durable.dev/")


def test_pausing_sets_the_condition_once() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
             "lastTransitionTime": "2025-01-01T00:00:00Z"}

    paused = pause.paused_conditions([ready], True, 3, NOW)
    assert paused is not None
    again = pause.paused_conditions(paused, True, 3, NOW + timedelta(minutes=1))

    (condition,) = [c for c in paused if c["type"] == pause.PAUSED_CONDITION]
    assert (condition["status"], condition["reason"]) == ("True", conditions.REASON_PAUSED)
    assert PAUSE_ANNOTATION in condition["message"]
    assert ready in paused
    assert again is None


def test_resuming_turns_it_false_and_never_paused_objects_get_none() -> None:
    paused = pause.paused_conditions([], True, 1, NOW)

    resumed = pause.resumed_status({"bufferSize": "2Gi", "conditions": paused}, 2, NOW)
    untouched = pause.resumed_status({"bufferSize": "2Gi", "conditions": []}, 2, NOW)

    (condition,) = resumed["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", conditions.REASON_RESUMED)
    assert condition["observedGeneration"] == 2
    assert resumed["bufferSize"] == "2Gi"
    assert untouched == {"bufferSize": "2Gi", "conditions": []}


@pytest.mark.parametrize(("annotation", "condition", "stale"), [
    (None, None, False),  # never paused
    ("true", None, True),  # paused, not shown yet
    ("true", "True", False),
    (None, "True", True),  # resumed, still shown
    (None, "False", False),
    ("true", "False", True),
])  # fmt: skip
def test_the_pause_condition_is_stale_when_it_disagrees_with_the_annotation(
    annotation: str | None, condition: str | None, stale: bool
) -> None:
    body: dict[str, object] = {"metadata": {"annotations": {}}, "status": {"conditions": []}}
    if annotation is not None:
        body["metadata"] = {"annotations": {PAUSE_ANNOTATION: annotation}}
    if condition is not None:
        body["status"] = {"conditions": [{"type": pause.PAUSED_CONDITION, "status": condition}]}
    assert pause.condition_is_stale(body) is stale
