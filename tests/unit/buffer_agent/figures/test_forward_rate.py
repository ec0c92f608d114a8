"""The sustained forward rate and the "cannot drain" decision (figures/forward_rate.py)."""

from __future__ import annotations

import math
import random

import pytest

from durable_producer.buffer_agent.figures.forward_rate import DrainWindow, RateSample

RECORD_BYTES = 200
FRAME_RECORDS = 500


class Simulation:
    """An agent whose forwarder moves at most ``capacity`` records/s while Kafka delivers."""

    def __init__(self, capacity: float, jitter: float = 0.0, seed: int = 1) -> None:
        self.window = DrainWindow()
        self.capacity = capacity
        self.jitter = jitter
        self.random = random.Random(seed)
        self.now = 0.0
        self.ingested = 0.0
        self.forwarded = 0.0

    def run(self, seconds: int, ingest: float, *, kafka_up: bool = True) -> list[bool]:
        """One sample a second; returns the decisions."""
        decisions = []
        for _ in range(seconds):
            noise = 1 + self.random.uniform(-self.jitter, self.jitter)
            self.now += 1.0
            self.ingested += ingest * noise
            backlog = self.ingested - self.forwarded
            can_move = self.capacity * noise if kafka_up else 0.0
            self.forwarded += min(backlog, can_move)
            waiting = int((self.ingested - self.forwarded) // FRAME_RECORDS)
            outlook = self.window.update(
                RateSample(
                    at=self.now,
                    ingest_records=int(self.ingested),
                    ingest_bytes=int(self.ingested) * RECORD_BYTES,
                    forwarded_records=int(self.forwarded),
                    forwarded_bytes=int(self.forwarded) * RECORD_BYTES,
                    waiting_frames=waiting,
                    delivering=kafka_up,
                )
            )
            decisions.append(outlook.cannot_drain)
        self.outlook = outlook
        return decisions


def test_ingest_above_the_sustained_rate_sets_it_and_falling_below_clears_it() -> None:
    agent = Simulation(capacity=10_000, jitter=0.1)
    assert not any(agent.run(60, ingest=5_000)), "keeping up"
    assert agent.outlook.keeping_up and not agent.outlook.measured
    decisions = agent.run(60, ingest=13_000)
    assert decisions[-1], "ingest 1.3x what forwarding sustains"
    assert agent.outlook.forward.records_per_s == pytest.approx(10_000, rel=0.05)
    assert agent.outlook.ingest.records_per_s == pytest.approx(13_000, rel=0.05)
    assert "exceeds" in agent.outlook.message and "10,0" in agent.outlook.message
    assert agent.outlook.time_to_drain_s(1_000_000) == math.inf
    decisions = agent.run(120, ingest=6_000)
    assert not decisions[-1], "ingest well below: the backlog drains"
    assert agent.outlook.keeping_up
    assert agent.outlook.time_to_drain_s(0) == 0.0


def test_once_set_it_holds_within_the_margin_and_never_flaps() -> None:
    agent = Simulation(capacity=10_000, jitter=0.2, seed=7)
    agent.run(60, ingest=12_000)
    assert agent.outlook.cannot_drain
    decisions = agent.run(120, ingest=10_000 * 1.02)
    assert all(decisions), "within the margin: the decision holds"


def test_an_idle_agent_and_one_that_keeps_up_never_report_it() -> None:
    idle = Simulation(capacity=10_000)
    assert not any(idle.run(300, ingest=0))
    busy = Simulation(capacity=10_000, jitter=0.3, seed=3)
    assert not any(busy.run(300, ingest=9_000))


def test_an_outage_alone_does_not_set_it_and_time_to_drain_uses_the_measured_rate() -> None:
    agent = Simulation(capacity=10_000, jitter=0.05)
    agent.run(60, ingest=2_000)
    assert not agent.outlook.measured
    assert agent.outlook.time_to_drain_s(10) == 0.0, "keeping up"
    assert not any(agent.run(30, ingest=5_000, kafka_up=False))
    assert math.isnan(agent.outlook.time_to_drain_s(10)), "no rate measured under load yet"
    assert agent.outlook.net_fill_bytes_per_s() == pytest.approx(5_000 * RECORD_BYTES, rel=0.1)
    decisions = agent.run(15, ingest=5_000)  # Kafka is back: the backlog drains at 10k/s
    assert not any(decisions)
    assert agent.outlook.measured
    assert agent.outlook.forward.records_per_s == pytest.approx(10_000, rel=0.1)
    backlog = 100_000
    assert agent.outlook.time_to_drain_s(backlog) == pytest.approx(backlog / 5_000, rel=0.2)


def test_window_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="min_loaded_s"):
        DrainWindow(window_s=10, min_loaded_s=20)
