"""Helpers shared by the durable-kafka integration tests: where Spark writes, where tests read.

By default the data source writes to a real buffer agent process (``durable-agent run``)
that forwards through a fault proxy to a Kafka broker, as in an injected pod. Set
``DURABLE_KAFKA_TESTS_ENDPOINT=broker`` to write straight to the broker instead (then
the tests check the data source alone).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import kmock

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


EMULATED_RESOURCES = {
    "v1/pods": "Pod",
    "v1/configmaps": "ConfigMap",
    "v1/services": "Service",
    "v1/persistentvolumeclaims": "PersistentVolumeClaim",
    "v1/events": "Event",
}


class Emulator:
    """kmock's Kubernetes emulator on its own event loop thread."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop, emulator: Any) -> None:
        self.url = url
        self.loop = loop
        self._emulator = emulator

    def posted(self, path_suffix: str) -> list[dict[str, Any]]:
        async def snapshot() -> list[dict[str, Any]]:
            return [
                request.data
                for request in self._emulator
                if str(request.method.value).upper() == "POST"
                and request.url.path.endswith(path_suffix)
            ]

        return asyncio.run_coroutine_threadsafe(snapshot(), self.loop).result(timeout=10)

    def create(self, path: str, body: dict[str, Any]) -> None:
        """POST ``body`` to the emulator, as kubectl create would."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status in (200, 201)

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "any-token"}}],
                    "contexts": [
                        {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
                    ],
                    "current-context": "emulator",
                }
            )
        )
        return path


@contextmanager
def running_emulator() -> Iterator[Emulator]:
    """kmock's emulator on a free loopback port in a background thread; stopped on exit."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulated, kmock.Server(emulated) as server:
            for resource, kind in EMULATED_RESOURCES.items():
                emulated.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=True)
            url = f"http://127.0.0.1:{server.port}"
            state.update(stop=stop, api=Emulator(url, asyncio.get_running_loop(), emulated))
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    if not ready.wait(timeout=10):
        raise TimeoutError("the Kubernetes emulator did not start")
    api: Emulator = state["api"]
    try:
        yield api
    finally:
        api.loop.call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=10)
