"""kill -9 of a real agent process under load, restarted on the same volume: the loop the crash
tests share (what they assert differs)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from durable_producer.buffer_agent.forward.publisher import POSSIBLE_DUPLICATES_LOG
from durable_producer.local.agent_process import AgentProcess

from .cluster_load import ProducerLoad

COUNTED = re.compile(
    re.escape(POSSIBLE_DUPLICATES_LOG).replace("%d", r"(\d+)").replace("%s", r"(\w+)")
)


@dataclass
class KillRun:
    loads: list[ProducerLoad]
    unflushed: list[int]
    """Records each client still held when it stopped (0: every record answered)."""


def kill_under_load(
    agent: AgentProcess,
    topic: str,
    partitions: int,
    rate: int,
    pauses: Iterable[float],
    prefix: str = "",
) -> KillRun:
    """Two idempotent clients produce ``rate`` records a second each through the running
    ``agent``; after each pause it is SIGKILLed and restarted. The clients stop 2 s after the
    last restart; the agent is left running (count its possible duplicates once it stopped:
    :func:`counted_possible_duplicates`). ``prefix`` starts the clients' names (``c0``, ``c1``):
    runs against one topic need names of their own."""
    loads = [
        ProducerLoad(f"{prefix}c{n}", agent.bootstrap, topic, partitions, rate).start()
        for n in range(2)
    ]
    try:
        for pause in pauses:
            time.sleep(pause)
            agent.restart()
        time.sleep(2.0)
    finally:
        unflushed = [load.stop() for load in loads]
    return KillRun(loads, unflushed)


def counted_possible_duplicates(agent: AgentProcess) -> int:
    """Records the agent's runs counted as possible duplicates, from its log: every run's lines,
    the final stop's flush included when called after :meth:`AgentProcess.stop`. The metric
    restarts at 0 and would miss what a run counted between the last scrape and its SIGKILL;
    the log line is written before the records it counts are sent again."""
    return sum(int(match.group(1)) for match in COUNTED.finditer(agent.log_path.read_text()))
