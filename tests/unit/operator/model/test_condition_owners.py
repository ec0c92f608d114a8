"""Every condition type has exactly one writer (review D7), with the volume pool on or off."""

from __future__ import annotations

import pytest

from durable_producer.operator.model import conditions


@pytest.mark.parametrize("volume_pool", [True, False])
def test_every_condition_type_has_one_writer(volume_pool: bool) -> None:
    writers = [conditions.reconcile_conditions(volume_pool), conditions.DELETION_CONDITIONS]
    if volume_pool:
        writers.append(conditions.POOL_CONDITIONS)  # no pool timer runs with the pool off
    every_type = {condition for condition, _, _ in conditions.REASONS}
    if not volume_pool:
        every_type -= {conditions.BACKLOG_CANNOT_DRAIN}  # the pool timer's figures only

    owned = [t for types in writers for t in types]
    assert sorted(owned) == sorted(set(owned)), "a type with two writers"
    assert set(owned) == every_type


def test_a_writer_compares_and_applies_only_its_own_types() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Reconciled"}
    degraded = {"type": "Degraded", "status": "False", "reason": "AsExpected"}
    stale_degraded = {**degraded, "status": "True", "reason": "VolumePoolProblem"}

    assert conditions.owned([ready, degraded], conditions.RECONCILE_CONDITIONS) == [ready]
    assert not conditions.owned_differ([ready, degraded], [ready, stale_degraded],
                                       conditions.RECONCILE_CONDITIONS)
    assert conditions.owned_differ([ready, degraded], [ready, stale_degraded],
                                   conditions.POOL_CONDITIONS)
