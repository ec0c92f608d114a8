"""The "cannot drain" condition of a real agent: set while ingest exceeds what forwarding
sustains, cleared once ingest falls below it. Not timed: the test waits for each state.

A real agent process forwards to a 3-broker mock cluster whose brokers answer every request
2 s late (``broker_set_rtt``), so the forwarder sustains a few MB/s; a paced producer offers
the agent more than that, then a tenth of the forward rate the agent measured.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.mock_cluster import MockCluster
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "firehose"
VALUE = b"v" * 1000
CANNOT_DRAIN = "durable_agent_backlog_cannot_drain"
FORWARD_RATE = "durable_agent_forward_rate_records_per_second"
INGEST_RATE = "durable_agent_ingest_rate_records_per_second"


class PacedLoad:
    """Produces ``rate`` records/s to the agent on a thread until ``stop``."""

    def __init__(self, bootstrap: str, rate: float) -> None:
        self.rate = rate
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            burst = max(1, int(self.rate / 100))
            for _ in range(burst):
                try:
                    self._producer.produce(TOPIC, VALUE)
                except BufferError:
                    self._producer.poll(0.01)
            self._producer.poll(0)
            due += burst / self.rate
            self._stop.wait(max(0.0, due - time.monotonic()))

    def __enter__(self) -> PacedLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)


def test_cannot_drain_appears_above_the_sustained_forward_rate_and_clears_below(
    tmp_path: Path,
) -> None:
    with MockCluster(brokers=3) as cluster:
        cluster.topic_create(TOPIC, partitions=1)
        with AgentProcess(tmp_path / "volume", cluster.bootstrap) as agent:
            metrics = agent.metrics
            assert metrics().get(CANNOT_DRAIN) == 0.0, "an idle agent can always drain"
            with cluster.slow(2000):
                load = PacedLoad(agent.bootstrap, rate=8_000)
                with load:
                    wait_for(
                        lambda: metrics().get(CANNOT_DRAIN) == 1.0,
                        timeout=150,
                        interval=1.0,
                        what="the agent to report that its backlog cannot drain",
                    )
                    figures = metrics()
                    assert 0 < figures[FORWARD_RATE] < figures[INGEST_RATE], figures
                    assert figures["durable_agent_time_to_drain_seconds"] == float("inf")
                    load.rate = max(50.0, figures[FORWARD_RATE] / 10)
                    wait_for(
                        lambda: metrics().get(CANNOT_DRAIN) == 0.0,
                        timeout=150,
                        interval=1.0,
                        what="the condition to clear once ingest is below the forward rate",
                    )
                    figures = metrics()
                    assert figures[INGEST_RATE] < figures[FORWARD_RATE], figures
            assert "backlog cannot drain" in agent.log_tail(100_000)
