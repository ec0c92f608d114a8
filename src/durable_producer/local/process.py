"""What every part of the embedded default shares: a with-block that always cleans up, and a
child process that is started, waited for until ready, stopped or killed the same way.

``poll_until`` is the one ready-wait: the processes, topic creation and the demo use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

READY_POLL_INTERVAL = 0.05
KILL_WAIT_SECONDS = 30.0


def poll_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = READY_POLL_INTERVAL
) -> bool:
    """Call ``predicate`` every ``interval`` seconds until it returns true (then ``True``) or
    ``timeout`` seconds have passed (then ``False``). Exceptions it raises propagate."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class Managed(ABC):
    """Something a with-block starts and always closes, also when the block fails."""

    @abstractmethod
    def start(self) -> Self:
        """Start it and return it once it is ready to use."""

    @abstractmethod
    def close(self) -> None:
        """End it now and release what it holds; safe to call more than once."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class ManagedProcess(Managed):
    """A child process that writes to a log file.

    Subclasses give the command line (``command``) and one readiness probe (``is_ready``).
    ``start`` waits until the probe passes and kills the child if it exits or never gets
    ready, so a failed start leaves nothing running. ``stop`` is the graceful end (SIGTERM,
    then SIGKILL after ``timeout``), ``kill`` the crash, ``close`` (and leaving a with-block)
    kills and deletes a log the process was given no path for.
    """

    name: ClassVar[str] = "process"
    """Used in error messages and in the temporary log file's name."""
    ready_timeout: ClassVar[float] = 30.0
    log_tail_size: ClassVar[int] = 4000
    new_session: ClassVar[bool] = False
    """Start the child in its own session (signals to the test's group do not reach it)."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._temporary_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path

    @abstractmethod
    def command(self) -> list[str]:
        """The child's command line."""

    @abstractmethod
    def is_ready(self) -> bool:
        """One readiness probe; called every few milliseconds while the child starts."""

    def environment(self) -> dict[str, str] | None:
        """The child's environment (``None``: this process's own)."""
        return None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float | None = None) -> Self:
        """Launch the child and wait until it is ready (``timeout`` defaults to the class's)."""
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def launch(self) -> None:
        """Start the child without waiting for it (``wait_ready`` waits): processes that only
        get ready together, such as the voters of a quorum, are launched first."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self.process.pid})")
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=self.new_session,
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Return once ``is_ready``; raise ``RuntimeError`` if the child exits first and
        ``TimeoutError`` after ``timeout`` seconds (both with the end of its log)."""
        process = self.process
        if process is None:
            raise RuntimeError(f"{self.name} was never started")
        limit = self.ready_timeout if timeout is None else timeout

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {process.returncode}:\n{self.log_tail()}"
                )
            return self.is_ready()

        if not poll_until(ready, timeout=limit):
            raise TimeoutError(f"{self.name} not ready after {limit}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait up to ``timeout`` s (then SIGKILL); the exit code, or ``None``
        if it was never started."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def kill(self) -> None:
        """SIGKILL and reap (a SIGCONT first, so a suspended child goes at once too)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.kill()
        process.wait(timeout=KILL_WAIT_SECONDS)

    def close(self) -> None:
        self.kill()
        if self._temporary_log:
            self.log_path.unlink(missing_ok=True)

    def log_tail(self, size: int | None = None) -> str:
        """The last ``size`` characters of the child's log ("" if there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-(self.log_tail_size if size is None else size) :]
