"""How big a buffer volume must be, and how long an outage a given size survives.

The formula (documented with a worked example in docs/sizing.md)::

    data      = peak_rate * (outage + checkpoint_interval) * (1 + headroom)
    wal(size) = volume_budget.wal_budget(volume_budget.usable_bytes(size), segment, max_batch)
    size      = the smallest whole GiB (at least 1 GiB) whose wal(size) >= data + 2 * segment
    runway    = (wal(size) - 2 * segment) / (peak_rate * (1 + headroom)) - checkpoint_interval,
                in whole seconds, never negative

- outage + checkpoint_interval: what piles up while Kafka is away, plus the data that
  Kafka has acknowledged but the last checkpoint does not yet cover (it cannot be
  deleted until the next checkpoint).
- headroom: WAL framing overhead and bursts above the stated peak.
- 2 segments: the segment being written and the one being deleted are both on disk.
- wal(size): the WAL size limit the agent gets (``--max-buffer-bytes``). It is what is left of
  the volume once the filesystem's own overhead and the agent's reserve for its other files
  are taken off: ``durable_producer.volume_budget`` decides both, for the operator and the
  agent alike, so the size computed here and the space the agent uses cannot disagree.

All arithmetic is exact (integers); a computed size always buys at least the outage asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from durable_producer import volume_budget
from durable_producer.contract import DEFAULT_MAX_BATCH_BYTES
from durable_producer.operator.model.conditions import (
    REASON_RUNWAY_BELOW_TARGET,
    REASON_VERY_LARGE_VOLUME,
)
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import (
    GIB,
    MIB,
    TIB,
    describe_rate,
    format_bytes,
    parse_bytes,
)

MINIMUM_VOLUME_BYTES = 1 * GIB
SEGMENTS_ON_DISK = 2
# Above this a computed size is warned about: many block storage classes provision no bigger
# volume, and a size this large usually comes from a peak rate or outage typed too large.
LARGE_VOLUME_BYTES = 16 * TIB
# A volume's bytes are a signed 64-bit integer in Kubernetes (and status.runwaySeconds, which
# a larger size at 1 B/s overflowed: the API server refused every status write).
MAX_VOLUME_BYTES = 2**63 - 1


@dataclass(frozen=True)
class SizingInputs:
    """Everything the size depends on, in plain units."""

    peak_bytes_per_second: int
    outage_seconds: int
    checkpoint_interval_ms: int
    headroom_percent: int
    segment_size_bytes: int
    override_bytes: int | None = None
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES

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
            max_batch_bytes=max_batch_bytes(spec),
        )


def max_batch_bytes(spec: DurableProducerSpec) -> int:
    """The largest batch the spec's agent takes (``largest_batch_bytes``)."""
    return largest_batch_bytes(spec.agent.segment_size_mib * MIB)


def largest_batch_bytes(segment_size_bytes: int) -> int:
    """Kafka's default, or one segment where that is less (a WAL frame fits in a segment; the
    agent refuses a larger ``--max-batch-bytes``)."""
    return min(DEFAULT_MAX_BATCH_BYTES, segment_size_bytes)


@dataclass(frozen=True)
class SizingResult:
    """The chosen volume size, what it buys, and a warning (with its reason) when it is odd."""

    size_bytes: int
    computed_size_bytes: int
    runway_seconds: int
    override_applied: bool
    warning: str | None
    warning_reason: str | None = None

    @property
    def size_quantity(self) -> str:
        return format_bytes(self.size_bytes)


def _smallest(fits: Callable[[int], bool], start: int) -> int:
    """The smallest n >= start with fits(n), for a predicate that stays true once true."""
    low, high = start, max(start, 1)
    while not fits(high):
        low, high = high + 1, high * 2
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return high


def volume_budget_of(size_bytes: int, inputs: SizingInputs) -> volume_budget.VolumeBudget:
    """How a volume of ``size_bytes`` is split (raises volume_budget.BudgetError if too small)."""
    return volume_budget.wal_budget(
        volume_budget.usable_bytes(size_bytes), inputs.segment_size_bytes, inputs.max_batch_bytes
    )


def wal_bytes(size_bytes: int, inputs: SizingInputs) -> int:
    """The WAL size limit a volume of ``size_bytes`` gives the agent; 0 when it holds none."""
    try:
        return volume_budget_of(size_bytes, inputs).wal_bytes
    except volume_budget.BudgetError:
        return 0


def max_buffer_bytes(spec: DurableProducerSpec) -> int:
    """The agent's ``--max-buffer-bytes`` for the spec's volume size (the WAL's share)."""
    inputs = SizingInputs.from_spec(spec)
    return wal_bytes(size_buffer(inputs).size_bytes, inputs)


def outage_window_bytes(inputs: SizingInputs) -> int:
    """Bytes written at peak rate during the outage plus one checkpoint interval, with headroom."""
    window_ms = inputs.outage_seconds * 1000 + inputs.checkpoint_interval_ms
    scaled = inputs.peak_bytes_per_second * window_ms * (100 + inputs.headroom_percent)
    return -(-scaled // (1000 * 100))


def needed_wal_bytes(inputs: SizingInputs) -> int:
    """What the WAL must hold: the outage window plus the two segments on disk."""
    return outage_window_bytes(inputs) + SEGMENTS_ON_DISK * inputs.segment_size_bytes


def required_size_bytes(inputs: SizingInputs) -> int:
    """The computed volume size: the smallest whole GiB, at least MINIMUM_VOLUME_BYTES, whose
    WAL holds the outage window."""
    needed = needed_wal_bytes(inputs)
    first = max(MINIMUM_VOLUME_BYTES // GIB, -(-needed // GIB))
    return _smallest(lambda gib: wal_bytes(gib * GIB, inputs) >= needed, first) * GIB


def minimum_volume_bytes(segment_size_bytes: int, max_batch_bytes: int) -> int:
    """The smallest volume, in whole MiB, that holds a WAL of two segments beside the reserve."""
    inputs = SizingInputs(1, 1, 100, 0, segment_size_bytes, max_batch_bytes=max_batch_bytes)
    first = -(-SEGMENTS_ON_DISK * segment_size_bytes // MIB)
    return _smallest(lambda mib: wal_bytes(mib * MIB, inputs) > 0, first) * MIB


def minimum_size_margin_mib(segment_sizes_mib: Iterable[int]) -> int:
    """The largest C such that every volume the budget accepts is at least 2 segments + C MiB,
    whatever the segment size (the CRD's CEL rule checks this necessary condition)."""
    return min(
        minimum_volume_bytes(segment * MIB, largest_batch_bytes(segment * MIB)) // MIB
        - SEGMENTS_ON_DISK * segment
        for segment in segment_sizes_mib
    )


def runway_seconds(size_bytes: int, inputs: SizingInputs) -> int:
    """Whole seconds of outage at peak rate that a volume of size_bytes survives."""
    room = wal_bytes(size_bytes, inputs) - SEGMENTS_ON_DISK * inputs.segment_size_bytes
    if room <= 0:
        return 0
    bytes_per_ms_scaled = (100 + inputs.headroom_percent) * inputs.peak_bytes_per_second
    window_ms = room * 1000 * 100 // bytes_per_ms_scaled
    return max(0, (window_ms - inputs.checkpoint_interval_ms) // 1000)


def size_problem(inputs: SizingInputs) -> str | None:
    """Why spec.storage.size cannot be used at all (the agent would not start), or None."""
    if inputs.override_bytes is None:
        return None
    if inputs.override_bytes > MAX_VOLUME_BYTES:
        return (
            f"spec.storage.size {format_bytes(inputs.override_bytes)} is more than a volume can"
            " be (Kubernetes counts a volume's bytes in a signed 64-bit integer: less than"
            " 8Ei);"
            " set a size your storage provides, or remove it to use the computed"
            f" {format_bytes(required_size_bytes(inputs))}"
        )
    try:
        volume_budget_of(inputs.override_bytes, inputs)
    except volume_budget.BudgetError as error:
        minimum = minimum_volume_bytes(inputs.segment_size_bytes, inputs.max_batch_bytes)
        return (
            f"spec.storage.size {format_bytes(inputs.override_bytes)} cannot hold the agent's"
            f" WAL: after the filesystem's overhead, {error}. Set spec.storage.size to at least"
            f" {format_bytes(minimum)} (with segments of {inputs.segment_size_bytes // MIB} MiB,"
            f" spec.agent.segmentSizeMib), or remove it to use the computed"
            f" {format_bytes(required_size_bytes(inputs))}"
        )
    return None


def _warning(inputs: SizingInputs, size: int, computed: int, runway: int) -> tuple[str, str] | None:
    if runway < inputs.outage_seconds:
        return REASON_RUNWAY_BELOW_TARGET, (
            f"spec.storage.size {format_bytes(size)} survives only {runway}s of outage at"
            f" {describe_rate(inputs.peak_bytes_per_second)}, less than spec.outageSeconds"
            f" {inputs.outage_seconds}s; remove spec.storage.size to use the computed"
            f" {format_bytes(computed)}, or set it to at least that"
        )
    if inputs.override_bytes is None and size > LARGE_VOLUME_BYTES:
        return REASON_VERY_LARGE_VOLUME, (
            f"the computed volume size {format_bytes(size)} ({inputs.outage_seconds}s of outage"
            f" at {describe_rate(inputs.peak_bytes_per_second)} per pod) is larger than"
            f" {format_bytes(LARGE_VOLUME_BYTES)}, more than many storage classes provision for"
            " one volume: check spec.throughput.peakBytesPerSecond and spec.outageSeconds, or"
            " set spec.storage.size if your storage provides volumes this large"
        )
    return None


def size_buffer(inputs: SizingInputs) -> SizingResult:
    """Choose the volume size (the override if given) and report the runway it buys."""
    computed = required_size_bytes(inputs)
    size = inputs.override_bytes if inputs.override_bytes is not None else computed
    runway = runway_seconds(size, inputs)
    warning = _warning(inputs, size, computed, runway)
    return SizingResult(
        size_bytes=size,
        computed_size_bytes=computed,
        runway_seconds=runway,
        override_applied=inputs.override_bytes is not None,
        warning=warning[1] if warning else None,
        warning_reason=warning[0] if warning else None,
    )
