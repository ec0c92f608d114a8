"""Project-wide pytest configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.client_leaks import ClientLeaks
from support.outcome import CALL_FAILED, call_failed
from support.threads import live_librdkafka_clients

_LEAKS = ClientLeaks()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Record whether the test's call failed (support.outcome.call_failed reads it)."""
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def librdkafka_clients_destroyed(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that passed but left librdkafka clients alive fails (support.client_leaks).

    pytest sets up the wider-scoped fixtures a test names first (the clients they make are in
    the count before it), then this one, an autouse function-scoped fixture, before the test's
    other function-scoped fixtures, and tears it down after them. A wider-scoped fixture a test
    fetches inside its body (``request.getfixturevalue``) is set up after it: a client such a
    fixture makes for the whole module or session counts against that test."""
    before = live_librdkafka_clients()
    yield
    left = _LEAKS.after(request.node.nodeid, before)
    if left and not call_failed(request):
        pytest.fail(
            f"{left} librdkafka client(s) left alive by this test: destroy each client it "
            "makes (serve or purge its deliveries, drop the last reference; "
            'docs/development.md, "librdkafka clients end before the process does")',
            pytrace=False,
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """List the tests that left librdkafka clients alive in this process."""
    lines = _LEAKS.summary()
    if lines:
        terminalreporter.section("librdkafka clients left alive")
        for line in lines:
            terminalreporter.write_line(line)
