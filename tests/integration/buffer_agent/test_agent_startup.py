"""The agent answers ``/healthz`` while its WAL opens, and ``/readyz`` once it is open.

Opening reads every frame on the volume (``wal/recovery``): seconds for a few hundred thousand
one-record frames, minutes for a large backlog on a slow disk. The pod's startup probe gives
``/healthz`` two minutes; an agent that served it only once the WAL was open was killed by the
kubelet before it got there, and recovered again, for ever. A real agent process over a WAL of
1,500,000 one-record frames written before it starts (about 0.4 s to open here, 20-25 probes
answered meanwhile; 600,000 left only 7-8 once opening read segments as runs of numbers, and
200,000 only 5 before that). Written without a producer-state snapshot, so the ingest then
replays every frame for the clients' sequences (seconds; a running agent snapshots every 5 s,
which bounds that replay after a crash), while ``/readyz`` still says not ready.

No broker: the agent forwards to an address nothing listens on. What is checked (the order of
``/healthz``, the WAL's open and ``/readyz``) happens before the agent talks to Kafka, and with
nothing forwarded the backlog figure the probes read stays where the open put it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog
from durable_producer.buffer_agent.wal.frame import AppendItem
from durable_producer.local.agent_process import AgentProcess
from support.ingest_harness import record_batch
from support.waiting import wait_for

pytestmark = pytest.mark.integration

FRAMES = 1_500_000
UNREACHABLE_KAFKA = "127.0.0.1:1"


def test_healthz_answers_while_the_wal_opens_and_readyz_once_it_is_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    payload = record_batch([b"v" * 200])
    config = WalConfig(max_bytes=2 << 30, fsync=FsyncPolicy.NEVER)
    batch = [AppendItem("orders", 0, payload, 1)] * 10_000
    with WriteAheadLog.open(data / "wal", config) as wal:
        for _ in range(FRAMES // len(batch)):
            wal.append_many(batch)
    agent = AgentProcess(data, UNREACHABLE_KAFKA, extra_args=["--default-partitions", "1"])
    agent.launch()  # not started by a with-block: that waits until it is ready
    try:
        while_opening: list[tuple[int | None, float]] = []  # (/readyz, backlog) when healthy

        def ready() -> bool:
            if agent._status("/healthz") == 200:
                readiness = agent._status("/readyz")
                if readiness == 200:
                    return True
                while_opening.append((readiness, agent.metric("durable_agent_backlog_records")))
            return False

        started = time.monotonic()
        wait_for(ready, timeout=120, interval=0.01, what="the agent ready")
        print(f"\nready after {time.monotonic() - started:.1f} s; {len(while_opening)} probes"
              f" answered before it, {while_opening.count((503, 0.0))} while the WAL"
              " opened")  # fmt: skip
        backlog = agent.metric("durable_agent_backlog_records")
    finally:
        agent.close()
    # /healthz answered while the WAL was still opening: the figures published once it is
    # open were not there yet, and /readyz said not ready
    assert (503, 0.0) in while_opening, while_opening[:5]
    assert backlog == FRAMES
    log = agent.log_path.read_text()
    assert "opening the WAL" in log and "WAL open in" in log, log[-2000:]
