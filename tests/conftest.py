"""Project-wide pytest configuration."""

from __future__ import annotations

import pytest

from support.outcome import CALL_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Record whether the test's call failed (support.outcome.call_failed reads it)."""
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report
