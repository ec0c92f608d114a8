"""The embedded default's process base: ready-wait, and cleanup even when a start fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durable_producer.local.process import ManagedProcess, poll_until

SLEEPER = [sys.executable, "-c", "import sys, time; print('child up', flush=True); time.sleep(60)"]


class Sleeper(ManagedProcess):
    """A child that runs until killed; ready once ``probes`` probes have been made."""

    name = "sleeper"
    ready_timeout = 10.0

    def __init__(
        self, *, probes: int = 1, argv: list[str] | None = None, log_path: Path | None = None
    ) -> None:
        super().__init__(log_path)
        self.probes_needed = probes
        self.probes = 0
        self.argv = argv or SLEEPER

    def command(self) -> list[str]:
        return self.argv

    def is_ready(self) -> bool:
        self.probes += 1
        return self.probes >= self.probes_needed


def test_poll_until_returns_true_once_the_predicate_holds_and_false_at_the_timeout() -> None:
    calls = iter(range(100))
    assert poll_until(lambda: next(calls) >= 3, timeout=5, interval=0.001)
    assert not poll_until(lambda: False, timeout=0.05, interval=0.01)


def test_start_waits_for_the_probe_and_the_with_block_kills_and_deletes_a_temporary_log() -> None:
    with Sleeper(probes=3) as sleeper:
        assert sleeper.probes == 3
        assert sleeper.running
        log_path = sleeper.log_path
        assert poll_until(lambda: "child up" in sleeper.log_tail(), timeout=10)
    assert not sleeper.running
    assert not log_path.exists()


def test_a_child_that_never_gets_ready_is_killed_and_its_temporary_log_removed() -> None:
    sleeper = Sleeper(probes=10**9)
    with pytest.raises(TimeoutError, match=r"sleeper not ready after 0\.5s"):
        sleeper.start(timeout=0.5)
    assert sleeper.process is not None
    assert sleeper.process.returncode is not None, "the child must not outlive a failed start"
    assert not sleeper.log_path.exists()


def test_a_child_that_exits_during_start_is_reported_with_its_exit_code(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"]
    sleeper = Sleeper(probes=10**9, argv=argv, log_path=tmp_path / "child.log")
    with pytest.raises(RuntimeError, match=r"sleeper exited with 3:\nbad flag"):
        sleeper.start()
    assert (tmp_path / "child.log").exists(), "a log the caller named is kept"


def test_an_exception_in_the_with_block_still_kills_the_child() -> None:
    sleeper = Sleeper()
    with pytest.raises(ValueError), sleeper:
        raise ValueError("test failure")
    assert not sleeper.running


def test_stop_terminates_gracefully_and_a_second_start_is_refused_while_running(
    tmp_path: Path,
) -> None:
    with Sleeper(log_path=tmp_path / "child.log") as sleeper:
        with pytest.raises(RuntimeError, match="already running"):
            sleeper.start()
        assert sleeper.stop(timeout=10) == -15  # SIGTERM
        assert sleeper.stop() == -15
        sleeper.start()
        assert sleeper.running
    assert not sleeper.running
