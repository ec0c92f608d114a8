"""The forward rate the forwarder sustains under load, and whether the backlog can drain (pure).

Measured, never configured. About once a second the agent gives ``DrainWindow.update`` its
totals (records and WAL bytes accepted from clients, acknowledged by Kafka), how many WAL
frames wait outside the forwarder's in-flight window (read, not yet handed to the Kafka
client) and whether Kafka is delivering. An interval between two samples is *under load*
when frames waited at both ends and Kafka was delivering: the forwarder then forwarded as
fast as it and Kafka could, so what it forwarded is its **sustained forward rate**. Rates are
taken over the last ``window_s`` seconds; the sustained rate keeps its last measurement while
the forwarder is not under load (keeping up, idle, or Kafka unreachable), and is unknown
(``measured`` False) until the forwarder has been under load for ``min_loaded_s``.

**Cannot drain** (the backlog grows for as long as ingest stays where it is): set when, over
the window, the forwarder was under load for at least ``min_loaded_s``, the frames waiting
grew, and ingest exceeded the sustained forward rate by more than ``margin``. Cleared when
no frame waits any more (the forwarder caught up) or when ingest over the window falls below
the sustained rate less ``margin``; in between it keeps its value (hysteresis). An idle agent
never has frames waiting, so it never reports it; an outage alone does not set it (nothing
is delivered, so no interval is under load), it shows in the forwarder's state instead.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW_S = 30.0
MIN_LOADED_S = 10.0
MARGIN = 0.05


@dataclass(frozen=True, slots=True)
class RateSample:
    """Totals at one moment (monotonic seconds)."""

    at: float
    ingest_records: int
    ingest_bytes: int
    forwarded_records: int
    forwarded_bytes: int
    waiting_frames: int
    """WAL frames not yet handed to the Kafka client (outside the in-flight window)."""
    delivering: bool
    """Kafka acknowledged records recently (the forwarder's state is ``delivering``)."""


@dataclass(frozen=True, slots=True)
class Rates:
    records_per_s: float = 0.0
    bytes_per_s: float = 0.0

    def describe(self) -> str:
        return f"{self.records_per_s:,.0f} records/s ({self.bytes_per_s / 1e6:,.2f} MB/s)"


@dataclass(frozen=True, slots=True)
class DrainOutlook:
    """What one update concluded."""

    ingest: Rates
    """Accepted from clients, over the window."""
    forward: Rates
    """Sustained forward rate (last measured under load; zeros while ``measured`` is False)."""
    measured: bool
    keeping_up: bool
    """No frame waits outside the in-flight window now."""
    delivering: bool
    cannot_drain: bool

    @property
    def message(self) -> str:
        verb = "exceeds" if self.cannot_drain else "is within"
        return (
            f"ingest {self.ingest.describe()} {verb} the forward rate sustained under load"
            f" {self.forward.describe()}"
        )

    def net_fill_bytes_per_s(self) -> float:
        """How fast the backlog grows: 0 while the forwarder keeps up, ingest less the
        sustained forward rate while Kafka delivers, all of ingest while it does not."""
        if self.keeping_up:
            return 0.0
        if not self.delivering:
            return self.ingest.bytes_per_s
        return self.ingest.bytes_per_s - self.forward.bytes_per_s

    def time_to_drain_s(self, backlog_records: int) -> float:
        """Seconds until ``backlog_records`` are forwarded at the sustained forward rate while
        ingest goes on at its rate (after Kafka returns, during an outage): 0 while the
        forwarder keeps up, +Inf if it cannot drain, NaN while the rate is not measured."""
        if self.keeping_up or backlog_records <= 0:
            return 0.0
        if not self.measured:
            return math.nan
        net = self.forward.records_per_s - self.ingest.records_per_s
        if self.cannot_drain or net <= 0:
            return math.inf
        return backlog_records / net


class DrainWindow:
    """The samples of the last ``window_s`` and the decision kept between updates."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        min_loaded_s: float = MIN_LOADED_S,
        margin: float = MARGIN,
    ) -> None:
        if not 0 < min_loaded_s <= window_s:
            raise ValueError(f"min_loaded_s {min_loaded_s} must be in (0, {window_s}]")
        self.window_s = window_s
        self.min_loaded_s = min_loaded_s
        self.margin = margin
        self._samples: deque[RateSample] = deque()
        self._forward = Rates()
        self._measured = False
        self._cannot_drain = False

    def update(self, sample: RateSample) -> DrainOutlook:
        samples = self._samples
        if samples and sample.at <= samples[-1].at:
            return self._outlook(sample, self._ingest_rate())
        samples.append(sample)
        while len(samples) > 2 and sample.at - samples[1].at >= self.window_s:
            samples.popleft()
        loaded_s, loaded_ingest, loaded_forward = self._loaded()
        ingest = self._ingest_rate()
        if loaded_s >= self.min_loaded_s:
            self._forward = loaded_forward
            self._measured = True
        caught_up = sample.waiting_frames == 0
        below = self._measured and ingest.bytes_per_s < self._forward.bytes_per_s * (
            1 - self.margin
        )
        if caught_up or below:
            self._cannot_drain = False
        elif (
            loaded_s >= self.min_loaded_s
            and sample.waiting_frames > samples[0].waiting_frames
            and loaded_ingest.bytes_per_s > loaded_forward.bytes_per_s * (1 + self.margin)
        ):
            self._cannot_drain = True
        return self._outlook(sample, ingest)

    def _outlook(self, sample: RateSample, ingest: Rates) -> DrainOutlook:
        return DrainOutlook(
            ingest=ingest,
            forward=self._forward,
            measured=self._measured,
            keeping_up=sample.waiting_frames == 0,
            delivering=sample.delivering,
            cannot_drain=self._cannot_drain,
        )

    def _ingest_rate(self) -> Rates:
        first, last = self._samples[0], self._samples[-1]
        elapsed = last.at - first.at
        if elapsed <= 0:
            return Rates()
        return Rates(
            (last.ingest_records - first.ingest_records) / elapsed,
            (last.ingest_bytes - first.ingest_bytes) / elapsed,
        )

    def _loaded(self) -> tuple[float, Rates, Rates]:
        """Seconds under load in the window, and ingest and forward rates over them."""
        seconds = 0.0
        ingest = [0, 0]
        forward = [0, 0]
        previous: RateSample | None = None
        for sample in self._samples:
            if (
                previous is not None
                and previous.waiting_frames > 0
                and sample.waiting_frames > 0
                and sample.delivering
            ):
                seconds += sample.at - previous.at
                ingest[0] += sample.ingest_records - previous.ingest_records
                ingest[1] += sample.ingest_bytes - previous.ingest_bytes
                forward[0] += sample.forwarded_records - previous.forwarded_records
                forward[1] += sample.forwarded_bytes - previous.forwarded_bytes
            previous = sample
        if seconds <= 0:
            return 0.0, Rates(), Rates()
        return (
            seconds,
            Rates(ingest[0] / seconds, ingest[1] / seconds),
            Rates(forward[0] / seconds, forward[1] / seconds),
        )
