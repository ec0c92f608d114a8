"""The sizing function: properties, exact figures, and the worked example in docs/sizing.md."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_producer import volume_budget
from durable_producer.contract import DEFAULT_MAX_BATCH_BYTES
from durable_producer.operator.decide import reconcile
from durable_producer.operator.decide.sizing import (
    LARGE_VOLUME_BYTES,
    MINIMUM_VOLUME_BYTES,
    SizingInputs,
    max_buffer_bytes,
    minimum_volume_bytes,
    needed_wal_bytes,
    outage_window_bytes,
    required_size_bytes,
    runway_seconds,
    size_buffer,
    size_problem,
    volume_budget_of,
    wal_bytes,
)
from durable_producer.operator.model import quantities
from durable_producer.operator.model.conditions import (
    REASON_RUNWAY_BELOW_TARGET,
    REASON_VERY_LARGE_VOLUME,
)
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import GIB, MIB, TIB

SIZING_DOC = Path(__file__).resolve().parents[4] / "docs" / "sizing.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)

inputs_strategy = st.builds(
    SizingInputs,
    peak_bytes_per_second=st.integers(min_value=1, max_value=10 * GIB),
    outage_seconds=st.integers(min_value=1, max_value=30 * 24 * 3600),
    checkpoint_interval_ms=st.integers(min_value=100, max_value=600_000),
    headroom_percent=st.integers(min_value=0, max_value=400),
    segment_size_bytes=st.integers(min_value=1, max_value=1024).map(lambda mib: mib * MIB),
)
GROWING_FIELDS = (
    "peak_bytes_per_second",
    "outage_seconds",
    "checkpoint_interval_ms",
    "headroom_percent",
    "segment_size_bytes",
)


@given(inputs=inputs_strategy, field=st.sampled_from(GROWING_FIELDS), factor=st.integers(1, 8))
def test_size_is_monotonic_in_every_input(inputs: SizingInputs, field: str, factor: int) -> None:
    bigger = dataclasses.replace(inputs, **{field: getattr(inputs, field) * factor + 1})
    assert required_size_bytes(bigger) >= required_size_bytes(inputs)


@given(inputs=inputs_strategy)
def test_size_is_whole_gib_never_below_minimum_and_buys_the_outage(inputs: SizingInputs) -> None:
    result = size_buffer(inputs)
    assert result.size_bytes % GIB == 0
    assert result.size_bytes >= MINIMUM_VOLUME_BYTES
    assert wal_bytes(result.size_bytes, inputs) >= needed_wal_bytes(inputs)
    assert result.runway_seconds >= inputs.outage_seconds
    assert not result.override_applied
    if result.size_bytes <= LARGE_VOLUME_BYTES:
        assert result.warning is None
    else:
        assert result.warning_reason == REASON_VERY_LARGE_VOLUME


@given(inputs=inputs_strategy)
def test_computed_size_is_the_smallest_whole_gib_that_fits(inputs: SizingInputs) -> None:
    size = required_size_bytes(inputs)
    if size > MINIMUM_VOLUME_BYTES:
        assert wal_bytes(size - GIB, inputs) < needed_wal_bytes(inputs)


@given(inputs=inputs_strategy, override_gib=st.integers(min_value=1, max_value=100_000))
def test_override_is_respected_and_warned_about_when_short(
    inputs: SizingInputs, override_gib: int
) -> None:
    result = size_buffer(dataclasses.replace(inputs, override_bytes=override_gib * GIB))
    assert result.size_bytes == override_gib * GIB
    assert result.override_applied
    assert result.computed_size_bytes == required_size_bytes(inputs)
    assert result.runway_seconds == runway_seconds(override_gib * GIB, inputs)
    if result.runway_seconds < inputs.outage_seconds:
        assert result.warning is not None
        assert result.warning_reason == REASON_RUNWAY_BELOW_TARGET
        assert f"less than spec.outageSeconds {inputs.outage_seconds}s" in result.warning
        assert quantities.format_bytes(result.computed_size_bytes) in result.warning
    else:
        assert result.warning is None  # a size given explicitly is never "too large"


@given(inputs=inputs_strategy, size=st.integers(min_value=0, max_value=2**50), extra=st.integers(0))
def test_runway_grows_with_size_and_is_never_negative(
    inputs: SizingInputs, size: int, extra: int
) -> None:
    assert 0 <= runway_seconds(size, inputs) <= runway_seconds(size + extra, inputs)


def test_runway_is_zero_when_overhead_fills_the_volume() -> None:
    inputs = SizingInputs(MIB, 60, 1000, 25, 64 * MIB)
    smallest = minimum_volume_bytes(64 * MIB, DEFAULT_MAX_BATCH_BYTES)
    assert runway_seconds(smallest, inputs) == 0  # the WAL's two segments, nothing more
    assert runway_seconds(smallest - MIB, inputs) == 0  # no WAL at all
    assert runway_seconds(0, inputs) == 0


def test_tiny_rate_gets_the_minimum_volume() -> None:
    result = size_buffer(SizingInputs(1, 1, 100, 0, MIB))
    assert result.size_bytes == MINIMUM_VOLUME_BYTES
    assert result.size_quantity == "1Gi"


EXAMPLE = SizingInputs(
    peak_bytes_per_second=5 * MIB,
    outage_seconds=3600,
    checkpoint_interval_ms=5000,
    headroom_percent=25,
    segment_size_bytes=64 * MIB,
)


def worked_example_values(inputs: SizingInputs) -> dict[str, str]:
    """Every figure of the worked example in docs/sizing.md, from the functions."""
    result = size_buffer(inputs)
    budget = volume_budget_of(result.size_bytes, inputs)
    return {
        "peak rate": str(inputs.peak_bytes_per_second),
        "outage window": str((inputs.outage_seconds * 1000 + inputs.checkpoint_interval_ms)
                             // 1000),
        "data": str(outage_window_bytes(inputs)),
        "WAL needed": str(needed_wal_bytes(inputs)),
        "size": result.size_quantity,
        "usable": str(budget.usable_bytes),
        "reserve": str(budget.reserve_bytes),
        "WAL": str(budget.wal_bytes),
        "runway": str(result.runway_seconds),
    }


def doc_value(step: str) -> str:
    """The backticked value of one row of the worked-example table in docs/sizing.md."""
    match = re.search(rf"^\| {re.escape(step)} \| `([^`]+)`", SIZING_DOC.read_text(), re.MULTILINE)
    assert match is not None, f"row {step!r} missing from docs/sizing.md"
    return match.group(1)


def test_worked_example_in_docs_matches_the_function() -> None:
    expected = worked_example_values(EXAMPLE)
    documented = {step: doc_value(step) for step in expected}
    assert documented == expected, (
        "docs/sizing.md's worked example is stale (volume_budget's figures changed?): use "
        + ", ".join(f"{step} `{value}`" for step, value in expected.items())
    )

    overridden = size_buffer(dataclasses.replace(EXAMPLE, override_bytes=16 * GIB))
    text = " ".join(SIZING_DOC.read_text().split())
    assert overridden.warning is not None
    assert f"runway drops to `{overridden.runway_seconds}` s" in text
    assert " ".join(overridden.warning.split()) in text.replace("> ", "")


# Defect: a small storage.size gave a Ready producer whose agent could not start
# (--max-buffer-bytes = size - 512 MiB was negative, or below two segments).


@pytest.mark.parametrize("size", ["0", "5Mi", "100Mi"])
def test_a_size_that_holds_no_wal_is_an_invalid_spec_with_the_numbers(size: str) -> None:
    spec = {"kafka": {"bootstrapServers": ["kafka:9092"]},
            "throughput": {"peakBytesPerSecond": 5 * MIB}, "storage": {"size": size}}
    minimum = minimum_volume_bytes(64 * MIB, DEFAULT_MAX_BATCH_BYTES)

    parsed = reconcile.parse_spec(spec)

    assert isinstance(parsed, str), f"storage.size {size} was accepted"
    assert f"spec.storage.size {size} cannot hold the agent's WAL" in parsed
    assert f"at least {quantities.format_bytes(minimum)}" in parsed
    assert "usable bytes" in parsed and str(64 * MIB) in parsed  # the budget's own figures
    outcome = reconcile.desired_status(spec, {}, 1, T0)
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")


def test_a_size_beyond_what_a_volume_can_be_is_an_invalid_spec() -> None:
    """100Ei at 1 B/s gave status.runwaySeconds 9.1e19, beyond the int64 the API server
    takes: every status write of that producer was refused."""
    spec = {"kafka": {"bootstrapServers": ["kafka:9092"]},
            "throughput": {"peakBytesPerSecond": 1}, "storage": {"size": "100Ei"}}
    parsed = reconcile.parse_spec(spec)
    assert isinstance(parsed, str) and "is more than a volume can be" in parsed, parsed
    spec["storage"] = {"size": "8Ei"}  # 2**63 bytes: one more than an int64 holds
    assert isinstance(reconcile.parse_spec(spec), str)
    spec["storage"] = {"size": "7Ei"}
    status = reconcile.desired_status(spec, {}, 1, T0).status
    assert 0 < status["runwaySeconds"] < 2**63


@given(size_mib=st.integers(min_value=1, max_value=4096), segment_mib=st.integers(1, 1024))
def test_every_size_accepted_gives_the_agent_a_wal_it_accepts(
    size_mib: int, segment_mib: int
) -> None:
    """What the operator accepts, the agent's own budget accepts, and the other way round."""
    inputs = SizingInputs(MIB, 60, 1000, 25, segment_mib * MIB, override_bytes=size_mib * MIB)
    minimum = minimum_volume_bytes(segment_mib * MIB, DEFAULT_MAX_BATCH_BYTES)
    problem = size_problem(inputs)
    if size_mib * MIB >= minimum:
        assert problem is None
        budget = volume_budget.wal_budget(
            volume_budget.usable_bytes(size_mib * MIB), segment_mib * MIB, DEFAULT_MAX_BATCH_BYTES
        )
        assert wal_bytes(size_mib * MIB, inputs) == budget.wal_bytes >= 2 * segment_mib * MIB
    else:
        assert problem is not None
        with pytest.raises(volume_budget.BudgetError):
            volume_budget.wal_budget(
                volume_budget.usable_bytes(size_mib * MIB), segment_mib * MIB,
                DEFAULT_MAX_BATCH_BYTES,
            )


def test_max_buffer_bytes_is_the_wal_share_of_the_agent_budget() -> None:
    spec = DurableProducerSpec.model_validate(
        {"kafka": {"bootstrapServers": ["kafka:9092"]},
         "throughput": {"peakBytesPerSecond": 5 * MIB}, "storage": {"size": "600Mi"}})

    expected = volume_budget.wal_budget(
        volume_budget.usable_bytes(600 * MIB), 64 * MIB, DEFAULT_MAX_BATCH_BYTES
    ).wal_bytes

    assert max_buffer_bytes(spec) == expected >= 2 * 64 * MIB


def test_a_volume_larger_than_storage_provisions_is_warned_about() -> None:
    """Defect: 10 GiB/s for an hour sized a 45064Gi volume without a word."""
    huge = SizingInputs(10 * GIB, 3600, 5000, 25, 64 * MIB)

    result = size_buffer(huge)

    assert result.size_bytes > LARGE_VOLUME_BYTES == 16 * TIB
    assert result.warning_reason == REASON_VERY_LARGE_VOLUME
    assert result.warning is not None and result.size_quantity in result.warning
    assert "spec.throughput.peakBytesPerSecond" in result.warning
    # Chosen on purpose: a size given explicitly is the user's call.
    chosen = size_buffer(dataclasses.replace(huge, override_bytes=result.size_bytes))
    assert chosen.warning is None
    assert size_buffer(EXAMPLE).warning is None


@pytest.mark.parametrize(
    ("quantity", "expected_bytes"),
    [("20Gi", 20 * GIB), ("10G", 10**10), ("1.5Gi", 3 * GIB // 2), ("1500m", 2), ("512", 512)],
)
def test_parse_bytes(quantity: str, expected_bytes: int) -> None:
    assert quantities.parse_bytes(quantity) == expected_bytes


@pytest.mark.parametrize("bad", ["", "Gi", "20GB", "-1Gi", "1.Gi"])
def test_parse_bytes_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantities.parse_bytes(bad)


@pytest.mark.parametrize(
    ("size", "expected"), [(23 * GIB, "23Gi"), (640 * MIB, "640Mi"), (1536, "1536"), (7, "7")]
)
def test_format_bytes(size: int, expected: str) -> None:
    assert quantities.format_bytes(size) == expected
    assert quantities.parse_bytes(expected) == size
