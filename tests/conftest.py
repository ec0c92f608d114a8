"""Project-wide pytest configuration."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from support.client_leaks import ClientLeaks
from support.outcome import CALL_FAILED

_LEAKS = ClientLeaks()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Record whether the test's call failed (support.outcome.call_failed reads it)."""
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Count the librdkafka clients alive before and after each test (support.client_leaks)."""
    before = _LEAKS.before()
    try:
        return (yield)
    finally:
        _LEAKS.after(item.nodeid, before)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """List the tests that left librdkafka clients alive in this process."""
    lines = _LEAKS.summary()
    if lines:
        terminalreporter.section("librdkafka clients left alive")
        for line in lines:
            terminalreporter.write_line(line)
