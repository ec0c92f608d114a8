"""The agents' figures from their Prometheus expositions: backlog, and "cannot drain".

Pure parsing of the text the agents serve (``act/agent_scrape.py`` fetches it). The metrics'
names come from the contract, not from the agent's code: the operator image does not carry the
agent's dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from durable_producer.contract import (
    BACKLOG_METRIC,
    CANNOT_DRAIN_METRIC,
    FORWARD_RATE_METRICS,
    INGEST_RATE_METRICS,
)

SCRAPED = (BACKLOG_METRIC, CANNOT_DRAIN_METRIC, *INGEST_RATE_METRICS, *FORWARD_RATE_METRICS)

@dataclass(frozen=True)
class CannotDrain:
    """One agent whose ingest exceeds the forward rate it sustains: (records/s, bytes/s)."""

    agent: str
    ingest: tuple[float, float]
    forward: tuple[float, float]

    def describe(self) -> str:
        def rate(figures: tuple[float, float]) -> str:
            return f"{figures[0]:,.0f} records/s ({figures[1] / 1e6:,.2f} MB/s)"

        return (
            f"{self.agent}: ingest {rate(self.ingest)} exceeds the forward rate sustained"
            f" under load {rate(self.forward)}"
        )


@dataclass(frozen=True)
class AgentFigures:
    """What the agents that answered said; ``answered`` 0: nothing is known."""

    answered: int = 0
    backlog_bytes: int | None = None
    cannot_drain: list[CannotDrain] = field(default_factory=list)


def parse_samples(exposition: str, names: Iterable[str] = SCRAPED) -> dict[str, float]:
    """The first sample of each of ``names`` in a Prometheus text exposition."""
    wanted = set(names)
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        name = parts[0].split("{", 1)[0] if parts else ""
        if len(parts) >= 2 and name in wanted and name not in found:
            try:
                found[name] = float(parts[1])
            except ValueError:
                continue
    return found


def parse_backlog_bytes(exposition: str) -> int | None:
    """The backlog gauge from a Prometheus text exposition, or None when absent."""
    backlog = parse_samples(exposition, [BACKLOG_METRIC]).get(BACKLOG_METRIC)
    return None if backlog is None else int(backlog)


def _pair(samples: Mapping[str, float], names: tuple[str, str]) -> tuple[float, float]:
    return samples.get(names[0], 0.0), samples.get(names[1], 0.0)


def agent_figures(answers: Mapping[str, str]) -> AgentFigures:
    """``answers``: each answering agent's exposition, by its name (pod or URL)."""
    backlogs: list[int] = []
    cannot_drain: list[CannotDrain] = []
    for agent, exposition in sorted(answers.items()):
        samples = parse_samples(exposition)
        if BACKLOG_METRIC in samples:
            backlogs.append(int(samples[BACKLOG_METRIC]))
        if samples.get(CANNOT_DRAIN_METRIC, 0.0) >= 1.0:
            cannot_drain.append(
                CannotDrain(
                    agent,
                    _pair(samples, INGEST_RATE_METRICS),
                    _pair(samples, FORWARD_RATE_METRICS),
                )
            )
    return AgentFigures(len(answers), sum(backlogs) if backlogs else None, cannot_drain)
