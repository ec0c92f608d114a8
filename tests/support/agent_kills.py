"""kill -9 of a real agent process under load, restarted on the same volume: the loop the crash
tests share (what they assert differs)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from durable_producer.local.agent_process import AgentProcess

from .cluster_load import ProducerLoad

POSSIBLE = "durable_agent_possible_duplicates_total"


@dataclass
class KillRun:
    loads: list[ProducerLoad]
    unflushed: list[int]
    """Records each client still held when it stopped (0: every record answered)."""
    counted_possible: float
    """``durable_agent_possible_duplicates_total`` summed over every run of the agent."""


def kill_under_load(
    agent: AgentProcess, topic: str, partitions: int, rate: int, pauses: Iterable[float]
) -> KillRun:
    """Two idempotent clients produce ``rate`` records a second each through the running
    ``agent``; after each pause it is SIGKILLed and restarted. The clients stop 2 s after the
    last restart; the agent is left running."""
    counted = 0.0
    loads = [
        ProducerLoad(f"c{n}", agent.bootstrap, topic, partitions, rate).start() for n in range(2)
    ]
    try:
        for pause in pauses:
            time.sleep(pause)
            counted += agent.metric(POSSIBLE)
            agent.restart()
        time.sleep(2.0)
    finally:
        unflushed = [load.stop() for load in loads]
    return KillRun(loads, unflushed, counted + agent.metric(POSSIBLE))
