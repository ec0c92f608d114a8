"""Helpers shared by the durable-kafka integration tests: where Spark writes, where tests read.

By default the data source writes to a real buffer agent process (``durable-agent run``)
that forwards through a fault proxy to a Kafka broker, as in an injected pod. Set
``DURABLE_KAFKA_TESTS_ENDPOINT=broker`` to write straight to the broker instead (then
the tests check the data source alone).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from durable_producer.local.agent_process import AgentProcess as LocalAgentProcess
from support.broker import ProxiedBroker, create_topic

ENDPOINT_ENV = "DURABLE_KAFKA_TESTS_ENDPOINT"
LOOPBACK = "127.0.0.1"


def endpoint_mode() -> str:
    """``agent`` (default) or ``broker``."""
    mode = os.environ.get(ENDPOINT_ENV, "agent")
    if mode not in ("agent", "broker"):
        raise ValueError(f"{ENDPOINT_ENV} must be 'agent' or 'broker', got {mode!r}")
    return mode


class AgentProcess(LocalAgentProcess):
    """``durable-agent run`` on a free loopback port with a temporary data directory."""

    def __init__(self, kafka_bootstrap: str) -> None:
        self._data_dir = tempfile.TemporaryDirectory(prefix="durable-agent-")
        super().__init__(Path(self._data_dir.name) / "volume", kafka_bootstrap)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.stop(timeout=30)
        finally:
            super().__exit__(exc_type, exc, traceback)
            self._data_dir.cleanup()


@dataclass(frozen=True)
class KafkaEndpoint:
    """Where the data source writes (``write_bootstrap``) and where tests read back."""

    write_bootstrap: str
    read_bootstrap: str
    kafka: ProxiedBroker
    agent: AgentProcess | None

    @property
    def through_agent(self) -> bool:
        return self.agent is not None

    def new_topic(self, partitions: int = 2) -> str:
        topic = f"spark-{uuid.uuid4().hex[:12]}"
        create_topic(self.read_bootstrap, topic, partitions)
        return topic
