"""Run ``durable-agent run`` as a child process and read its metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from .broker import LOOPBACK, free_port


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


class AgentProcess:
    """One agent on a free port with its own data directory; ``restart``/``kill`` for chaos."""

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
        self.log_path = log_path or self.data_dir.parent / f"agent-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

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

    def start(self, timeout: float = 30.0) -> AgentProcess:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(
                f"agent {self.bootstrap} is already running (pid {self.process.pid})"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed on stop
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        log.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"agent exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self._get("/readyz") == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"agent not ready after {timeout}s:\n{self.log_tail()}")

    def _get(self, path: str) -> int | None:
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

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the crash the WAL must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait: the agent drains until its deadline and exits."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def restart(self, timeout: float = 30.0) -> None:
        self.kill()
        self.start(timeout)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
