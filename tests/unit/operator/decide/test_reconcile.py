"""Pure reconciliation: desired status from (spec, status, generation, now)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_producer.operator.decide import reconcile
from durable_producer.operator.decide.kube_objects import format_time, parse_time
from durable_producer.operator.decide.reconcile import (
    DEGRADED,
    READY,
    REASON_AS_EXPECTED,
    REASON_INVALID_SPEC,
    REASON_RECONCILED,
    REASON_RUNWAY_BELOW_TARGET,
    desired_status,
    set_condition,
    status_patch,
)
from durable_producer.operator.model.model import DurableProducerSpec

T0 = datetime(2026, 11, 22, 1, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
SPEC: dict[str, Any] = {
    "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
    "throughput": {"peakBytesPerSecond": 5 * 2**20},
}


def find(status: dict[str, Any], condition_type: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == condition_type)


def test_valid_spec_is_ready_with_size_runway_and_generation() -> None:
    outcome = desired_status(SPEC, {}, 3, T0)
    status = outcome.status
    assert outcome.problem is None and outcome.problem_reason is None
    assert status["observedGeneration"] == 3
    assert status["bufferSize"] == "23Gi"  # docs/sizing.md's worked example
    assert status["runwaySeconds"] == 3640
    # No agent has answered yet: the backlog is unknown, not 0 (the pool timer publishes it).
    assert status["attachedPods"] == 0 and "backlogBytes" not in status
    ready = find(status, READY)
    assert ready == {
        "type": READY,
        "status": "True",
        "reason": REASON_RECONCILED,
        "message": "buffer volumes of 23Gi survive 3640s of Kafka outage at peak rate",
        "lastTransitionTime": "2026-11-22T01:00:00Z",
        "observedGeneration": 3,
    }
    assert find(status, DEGRADED)["status"] == "False"
    assert find(status, DEGRADED)["reason"] == REASON_AS_EXPECTED


def test_transition_time_kept_while_status_unchanged_and_moved_on_change() -> None:
    first = desired_status(SPEC, {}, 1, T0).status
    again = desired_status({**SPEC, "outageSeconds": 7200}, first, 2, T1).status
    assert find(again, READY)["lastTransitionTime"] == "2026-11-22T01:00:00Z"
    assert find(again, READY)["observedGeneration"] == 2
    assert again["bufferSize"] == "46Gi"

    broken = desired_status({**SPEC, "outageSeconds": 0}, again, 3, T1).status
    assert find(broken, READY)["status"] == "False"
    assert find(broken, READY)["lastTransitionTime"] == "2026-11-22T01:05:00Z"


def test_invalid_spec_names_the_field_and_what_to_do() -> None:
    spec = {**SPEC, "throughput": {"peakBytesPerSecond": -5}, "fsync": {"policy": "sometimes"}}
    outcome = desired_status(spec, {}, 4, T0)
    ready = find(outcome.status, READY)
    assert ready["status"] == "False"
    assert ready["reason"] == REASON_INVALID_SPEC
    assert ready["message"] == outcome.problem
    assert outcome.problem_reason == REASON_INVALID_SPEC
    assert (
        "spec.throughput.peakBytesPerSecond: Input should be greater than or equal to 1"
        in (ready["message"])
    )
    assert "(got -5)" in ready["message"]
    assert "spec.fsync.policy: Input should be 'always', 'interval' or 'never'" in ready["message"]
    assert "Fix the DurableProducer and apply it again" in ready["message"]
    assert (
        "`kubectl explain durableproducers.spec.throughput.peakBytesPerSecond`"
        in (ready["message"])
    )
    assert outcome.status["observedGeneration"] == 4


def test_invalid_spec_keeps_the_size_already_in_use() -> None:
    good = desired_status(SPEC, {}, 1, T0).status
    bad = desired_status({**SPEC, "kafka": {}}, good, 2, T1).status
    assert bad["bufferSize"] == good["bufferSize"]
    assert bad["runwaySeconds"] == good["runwaySeconds"]
    assert "spec.kafka.bootstrapServers is required: add it" in find(bad, READY)["message"]


def test_missing_spec_is_invalid_not_an_exception() -> None:
    outcome = desired_status(None, None, None, T0)
    ready = find(outcome.status, READY)
    assert ready["reason"] == REASON_INVALID_SPEC
    assert "observedGeneration" not in ready
    assert "observedGeneration" not in outcome.status


def test_short_override_is_degraded_but_ready() -> None:
    spec = {**SPEC, "storage": {"size": "16Gi"}}
    outcome = desired_status(spec, {}, 1, T0)
    assert outcome.status["bufferSize"] == "16Gi"
    assert outcome.status["runwaySeconds"] == 2503
    assert find(outcome.status, READY)["status"] == "True"
    degraded = find(outcome.status, DEGRADED)
    assert degraded["status"] == "True"
    assert degraded["reason"] == REASON_RUNWAY_BELOW_TARGET
    assert degraded["message"] == outcome.problem
    assert outcome.problem_reason == REASON_RUNWAY_BELOW_TARGET
    assert "use the computed 23Gi" in degraded["message"]


def test_figures_owned_by_other_reconcilers_are_preserved() -> None:
    current = {"attachedPods": 7, "backlogBytes": 1234}
    status = desired_status(SPEC, current, 1, T0).status
    assert status["attachedPods"] == 7
    assert status["backlogBytes"] == 1234


def test_other_conditions_are_left_alone() -> None:
    foreign = {
        "type": "PodsAudited",
        "status": "True",
        "reason": "AllAttached",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    status = desired_status(SPEC, {"conditions": [foreign]}, 1, T0).status
    assert status["conditions"][0] == foreign
    assert [c["type"] for c in status["conditions"]] == ["PodsAudited", READY, DEGRADED]


def test_reconciling_twice_patches_nothing_the_second_time() -> None:
    first = desired_status(SPEC, {}, 1, T0).status
    assert status_patch({}, first) == first
    second = desired_status(SPEC, first, 1, T1).status
    assert status_patch(first, second) == {}


def test_status_patch_contains_only_changes() -> None:
    current = {"bufferSize": "6Gi", "runwaySeconds": 10, "attachedPods": 2}
    desired = {"bufferSize": "7Gi", "runwaySeconds": 10}
    assert status_patch(current, desired) == {"bufferSize": "7Gi"}


@given(
    statuses=st.lists(st.sampled_from(["True", "False", "Unknown"]), min_size=1, max_size=6),
)
def test_transition_time_changes_exactly_when_status_changes(statuses: list[str]) -> None:
    conditions: list[dict[str, Any]] = []
    previous_status = None
    previous_time = None
    for step, value in enumerate(statuses):
        now = T0 + timedelta(seconds=step)
        conditions = set_condition(conditions, READY, value, "Because", "", step, now)
        (ready,) = conditions
        if value == previous_status:
            assert ready["lastTransitionTime"] == previous_time
        else:
            assert ready["lastTransitionTime"] == format_time(now)
        previous_status, previous_time = value, ready["lastTransitionTime"]


def test_format_time_is_utc_rfc3339() -> None:
    two_hours_east = timezone(timedelta(hours=2))
    moment = datetime(2026, 11, 22, 5, 4, 5, 999999, tzinfo=two_hours_east)
    assert format_time(moment) == "2026-11-22T03:04:05Z"
    assert parse_time("2026-11-22T03:04:05Z") == moment.replace(microsecond=0)
    assert parse_time("yesterday") is None and parse_time(None) is None


def test_every_reason_is_documented_in_the_operator_guide() -> None:
    """The conditions table lists every (condition, status, reason) a user can see."""
    guide = (Path(__file__).resolve().parents[4] / "docs" / "operator.md").read_text()
    section = guide[guide.index("## Conditions and reasons") :]
    rows = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", section, re.MULTILINE))
    for condition, status, reason in reconcile.REASONS:
        assert f"`{reason}`" in guide, f"docs/operator.md does not explain reason {reason}"
        assert (condition, status, reason) in rows, (condition, status, reason)
    assert rows == set(reconcile.REASONS), "the table lists a reason the code never sets"


def deployed(size: str, in_use: int, *, fits: bool) -> dict[str, Any]:
    return {"size": size, "fitsSpec": fits, "inUse": in_use, "claimed": 0, "free": 0,
            "draining": 0}


def test_runway_is_the_smallest_volume_in_use_after_a_spec_change() -> None:
    """Defect: after raising the throughput, pods ran on the old 6Gi volumes while the status
    claimed the runway of the new size."""
    spec = {**SPEC, "throughput": {"peakBytesPerSecond": 5 * 2**20}}  # 23Gi for an hour
    current = {"deployedVolumes": [deployed("6Gi", 2, fits=False), deployed("23Gi", 1, fits=True)]}

    outcome = desired_status(spec, current, 2, T0)

    status = outcome.status
    assert status["bufferSize"] == "23Gi"
    assert 800 < status["runwaySeconds"] < 1000  # what 6Gi buys at 5 MiB/s, not 3640
    degraded = find(status, DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", "VolumesBelowSpec")
    assert "volumes of 6Gi still in use" in degraded["message"]
    assert f"only {status['runwaySeconds']}s" in degraded["message"]
    assert degraded["observedGeneration"] == 2
    assert outcome.problem == degraded["message"]

    # Only free (not used) small volumes left: the spec's runway again.
    current = {"deployedVolumes": [{**deployed("6Gi", 0, fits=False), "free": 2}]}
    status = desired_status(spec, current, 2, T0).status
    assert status["runwaySeconds"] == 3640
    assert find(status, DEGRADED)["reason"] == REASON_AS_EXPECTED


def test_a_computed_size_too_large_for_most_storage_is_degraded() -> None:
    spec = {**SPEC, "throughput": {"peakBytesPerSecond": 10 * 2**30}}

    outcome = desired_status(spec, {}, 1, T0)

    assert find(outcome.status, READY)["status"] == "True"
    degraded = find(outcome.status, DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", "VeryLargeVolume")
    assert outcome.status["bufferSize"] in degraded["message"]
    assert outcome.problem_reason == "VeryLargeVolume"


@pytest.mark.parametrize(("generation", "status", "behind"), [
    (2, {"observedGeneration": 1}, True),
    (2, {}, True),  # never reconciled
    (2, {"observedGeneration": 2}, False),
    (2, {"observedGeneration": 3}, False),  # never "behind" backwards
    (None, {"observedGeneration": 1}, False),  # no generation to compare (an emulator)
    (1, None, True),
])  # fmt: skip
def test_is_behind_compares_the_generation_with_what_status_observed(
    generation: int | None, status: dict[str, int] | None, behind: bool
) -> None:
    assert reconcile.is_behind(generation, status) is behind


def test_a_missing_storage_class_is_not_ready_and_the_resync_looks_again() -> None:
    """Review D8: a StorageClass the cluster lacks gave Ready=True; pods then waited for
    volumes never provisioned. Sizes and Degraded are those of the valid spec."""
    spec = {**SPEC, "storage": {"storageClassName": "fast-ssd"}}
    missing = reconcile.desired_status(spec, {}, 2, T0, missing_storage_class="fast-ssd")
    ready = next(c for c in missing.status["conditions"] if c["type"] == "Ready")

    assert (ready["status"], ready["reason"]) == ("False", "StorageClassNotFound")
    assert "'fast-ssd' names no StorageClass" in ready["message"]
    assert missing.problem == ready["message"]
    assert missing.status["bufferSize"] == reconcile.desired_status(spec, {}, 2, T0).status[
        "bufferSize"]
    assert reconcile.awaits_storage_class(missing.status)

    found = reconcile.desired_status(spec, missing.status, 2, T0)
    assert not reconcile.awaits_storage_class(found.status)
    assert next(c for c in found.status["conditions"] if c["type"] == "Ready")["status"] == "True"


def test_a_spec_invalid_only_in_its_spark_section_still_drains() -> None:
    """A container name from before the CRD checked it made the whole spec invalid, and the
    pool then started no drain Job: the backlog of its ended pods stayed on their volumes."""
    raw = {"kafka": {"bootstrapServers": ["kafka:9092"]},
           "throughput": {"peakBytesPerSecond": 1000},
           "spark": {"containerName": "my.spark"}}  # fmt: skip
    assert isinstance(reconcile.parse_spec(raw), str)
    drains = reconcile.pool_spec(raw)
    assert isinstance(drains, DurableProducerSpec), drains
    assert drains.kafka.bootstrap_servers == ["kafka:9092"]
    raw["kafka"] = {"bootstrapServers": []}  # a drain cannot do without the Kafka section
    assert isinstance(reconcile.pool_spec(raw), str)
