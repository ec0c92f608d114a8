"""How big a buffer volume must be, and how long an outage a given size survives.

The formula (documented with a worked example in docs/sizing.md)::

    data     = peak_rate * (outage + checkpoint_interval) * (1 + headroom)
    size     = ceil_to_GiB(data + 2 * segment_size + reserve), at least 1 GiB
    runway   = (size - 2 * segment_size - reserve) / (peak_rate * (1 + headroom))
               - checkpoint_interval, in whole seconds, never negative

- outage + checkpoint_interval: what piles up while Kafka is away, plus the data that
  Kafka has acknowledged but the last checkpoint does not yet cover (it cannot be
  deleted until the next checkpoint).
- headroom: WAL framing overhead and bursts above the stated peak.
- 2 segments: the segment being written and the one being deleted are both on disk.
- reserve: filesystem metadata, checkpoint and metadata files, quarantined segments.

All arithmetic is exact (integers); a computed size always buys at least the outage asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_producer.operator.model import DurableProducerSpec
from durable_producer.operator.quantities import GIB, MIB, describe_rate, format_bytes, parse_bytes

FILESYSTEM_RESERVE_BYTES = 512 * MIB
MINIMUM_VOLUME_BYTES = 1 * GIB
SEGMENTS_ON_DISK = 2


@dataclass(frozen=True)
class SizingInputs:
    """Everything the size depends on, in plain units."""

    peak_bytes_per_second: int
    outage_seconds: int
    checkpoint_interval_ms: int
    headroom_percent: int
    segment_size_bytes: int
    override_bytes: int | None = None

    @classmethod
    def from_spec(cls, spec: DurableProducerSpec) -> SizingInputs:
        override = spec.storage.size
        return cls(
            peak_bytes_per_second=spec.throughput.peak_bytes_per_second,
            outage_seconds=spec.outage_seconds,
            checkpoint_interval_ms=spec.checkpoint_interval_ms,
            headroom_percent=spec.storage.headroom_percent,
            segment_size_bytes=spec.agent.segment_size_mib * MIB,
            override_bytes=parse_bytes(override) if override is not None else None,
        )

    @property
    def fixed_overhead_bytes(self) -> int:
        return SEGMENTS_ON_DISK * self.segment_size_bytes + FILESYSTEM_RESERVE_BYTES


@dataclass(frozen=True)
class SizingResult:
    """The chosen volume size, what it buys, and a warning when it buys too little."""

    size_bytes: int
    computed_size_bytes: int
    runway_seconds: int
    override_applied: bool
    warning: str | None

    @property
    def size_quantity(self) -> str:
        return format_bytes(self.size_bytes)


def outage_window_bytes(inputs: SizingInputs) -> int:
    """Bytes written at peak rate during the outage plus one checkpoint interval, with headroom."""
    window_ms = inputs.outage_seconds * 1000 + inputs.checkpoint_interval_ms
    scaled = inputs.peak_bytes_per_second * window_ms * (100 + inputs.headroom_percent)
    return -(-scaled // (1000 * 100))


def required_size_bytes(inputs: SizingInputs) -> int:
    """The computed volume size: whole GiB, never below MINIMUM_VOLUME_BYTES."""
    needed = outage_window_bytes(inputs) + inputs.fixed_overhead_bytes
    whole_gib = -(-needed // GIB) * GIB
    return max(MINIMUM_VOLUME_BYTES, whole_gib)


def runway_seconds(size_bytes: int, inputs: SizingInputs) -> int:
    """Whole seconds of outage at peak rate that a volume of size_bytes survives."""
    usable = size_bytes - inputs.fixed_overhead_bytes
    if usable <= 0:
        return 0
    bytes_per_ms_scaled = (100 + inputs.headroom_percent) * inputs.peak_bytes_per_second
    window_ms = usable * 1000 * 100 // bytes_per_ms_scaled
    return max(0, (window_ms - inputs.checkpoint_interval_ms) // 1000)


def size_buffer(inputs: SizingInputs) -> SizingResult:
    """Choose the volume size (the override if given) and report the runway it buys."""
    computed = required_size_bytes(inputs)
    size = inputs.override_bytes if inputs.override_bytes is not None else computed
    runway = runway_seconds(size, inputs)
    warning = None
    if runway < inputs.outage_seconds:
        warning = (
            f"spec.storage.size {format_bytes(size)} survives only {runway}s of outage at"
            f" {describe_rate(inputs.peak_bytes_per_second)}, less than spec.outageSeconds"
            f" {inputs.outage_seconds}s; remove spec.storage.size to use the computed"
            f" {format_bytes(computed)}, or set it to at least that"
        )
    return SizingResult(
        size_bytes=size,
        computed_size_bytes=computed,
        runway_seconds=runway,
        override_applied=inputs.override_bytes is not None,
        warning=warning,
    )
