"""The sizing function: properties, exact figures, and the worked example in docs/sizing.md."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_producer.operator import quantities
from durable_producer.operator.quantities import GIB, MIB
from durable_producer.operator.sizing import (
    FILESYSTEM_RESERVE_BYTES,
    MINIMUM_VOLUME_BYTES,
    SizingInputs,
    outage_window_bytes,
    required_size_bytes,
    runway_seconds,
    size_buffer,
)

SIZING_DOC = Path(__file__).resolve().parents[3] / "docs" / "sizing.md"

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
    assert result.size_bytes >= outage_window_bytes(inputs) + inputs.fixed_overhead_bytes
    assert result.runway_seconds >= inputs.outage_seconds
    assert result.warning is None and not result.override_applied


@given(inputs=inputs_strategy)
def test_computed_size_is_the_smallest_whole_gib_that_fits(inputs: SizingInputs) -> None:
    size = required_size_bytes(inputs)
    if size > MINIMUM_VOLUME_BYTES:
        assert size - GIB < outage_window_bytes(inputs) + inputs.fixed_overhead_bytes


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
        assert f"less than spec.outageSeconds {inputs.outage_seconds}s" in result.warning
        assert quantities.format_bytes(result.computed_size_bytes) in result.warning
    else:
        assert result.warning is None


@given(inputs=inputs_strategy, size=st.integers(min_value=0, max_value=2**50), extra=st.integers(0))
def test_runway_grows_with_size_and_is_never_negative(
    inputs: SizingInputs, size: int, extra: int
) -> None:
    assert 0 <= runway_seconds(size, inputs) <= runway_seconds(size + extra, inputs)


def test_runway_is_zero_when_overhead_fills_the_volume() -> None:
    inputs = SizingInputs(MIB, 60, 1000, 25, 64 * MIB)
    assert runway_seconds(FILESYSTEM_RESERVE_BYTES + 128 * MIB, inputs) == 0
    assert runway_seconds(GIB // 2, inputs) == 0


def test_tiny_rate_gets_the_minimum_volume() -> None:
    result = size_buffer(SizingInputs(1, 1, 100, 0, MIB))
    assert result.size_bytes == MINIMUM_VOLUME_BYTES
    assert result.size_quantity == "1Gi"


def doc_value(step: str) -> str:
    """The backticked value of one row of the worked-example table in docs/sizing.md."""
    match = re.search(rf"^\| {re.escape(step)} \| `([^`]+)`", SIZING_DOC.read_text(), re.MULTILINE)
    assert match is not None, f"row {step!r} missing from docs/sizing.md"
    return match.group(1)


def test_worked_example_in_docs_matches_the_function() -> None:
    inputs = SizingInputs(
        peak_bytes_per_second=int(doc_value("peak rate")),
        outage_seconds=3600,
        checkpoint_interval_ms=5000,
        headroom_percent=25,
        segment_size_bytes=64 * MIB,
    )
    result = size_buffer(inputs)
    window_ms = inputs.outage_seconds * 1000 + inputs.checkpoint_interval_ms
    assert int(doc_value("outage window")) * 1000 == window_ms
    assert int(doc_value("data")) == outage_window_bytes(inputs)
    assert int(doc_value("fixed overhead")) == inputs.fixed_overhead_bytes
    assert int(doc_value("needed")) == outage_window_bytes(inputs) + inputs.fixed_overhead_bytes
    assert doc_value("size") == result.size_quantity
    assert int(doc_value("runway")) == result.runway_seconds

    overridden = size_buffer(dataclasses.replace(inputs, override_bytes=16 * GIB))
    text = " ".join(SIZING_DOC.read_text().split())
    assert overridden.warning is not None
    assert f"runway drops to `{overridden.runway_seconds}` s" in text
    assert " ".join(overridden.warning.split()) in text.replace("> ", "")


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
