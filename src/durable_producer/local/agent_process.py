"""Run ``durable-agent run`` as a child process and read its metrics."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from .ports import LOOPBACK, free_port
from .process import ManagedProcess


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {"name{labels}": value} (comments skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


class AgentProcess(ManagedProcess):
    """One agent on a free port with its own data directory; ``restart``/``kill`` for chaos.

    Leaving a with-block kills it; ``stop`` lets it drain first (SIGTERM). The log
    (``log_path``, by default beside the data directory) is kept.
    """

    name = "agent"
    ready_timeout = 30.0
    log_tail_size = 4000

    def __init__(
        self,
        data_dir: Path,
        kafka_bootstrap: str,
        *,
        extra_args: list[str] | None = None,
        port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.kafka_bootstrap = kafka_bootstrap
        self.extra_args = list(extra_args or [])
        self.port = port or free_port()
        self.metrics_port = free_port()
        super().__init__(log_path or self.data_dir.parent / f"agent-{self.port}.log")

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "durable_producer.buffer_agent.cli",
            "run",
            "--data-dir",
            str(self.data_dir),
            "--kafka-bootstrap",
            self.kafka_bootstrap,
            "--listen",
            self.bootstrap,
            "--metrics-listen",
            f"{LOOPBACK}:{self.metrics_port}",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1")

    def start(self, timeout: float | None = None) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return super().start(timeout)

    def is_ready(self) -> bool:
        return self._status("/readyz") == 200

    def _status(self, path: str) -> int | None:
        try:
            url = f"http://{LOOPBACK}:{self.metrics_port}{path}"
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return None

    def metrics(self) -> dict[str, float]:
        url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return parse_metrics(response.read().decode())

    def metric(self, name: str) -> float:
        """The sum of every sample of ``name`` (all its labels; ``name_total`` for a
        counter)."""
        return sum(
            value
            for sample, value in self.metrics().items()
            if sample == name or sample.startswith(name + "{")
        )

    def restart(self, timeout: float | None = None) -> None:
        """SIGKILL, then start again on the same ports and data directory."""
        self.kill()
        self.start(timeout)
