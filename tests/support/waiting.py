"""Polling until a condition holds, the waits every test uses: ``wait_for`` (until a
predicate is truthy), ``wait_for_async`` (the same on an event loop) and ``wait_until_still``
(until a reading stops changing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Fails the test with ``what`` (or the predicate's repr) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not (value := _poll(predicate, deadline, timeout, what)):
        time.sleep(interval)
    return value


async def wait_for_async(
    predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.01, what: str = ""
) -> T:
    """``wait_for`` on an event loop: the loop runs its other tasks between polls."""
    deadline = time.monotonic() + timeout
    while not (value := _poll(predicate, deadline, timeout, what)):
        await asyncio.sleep(interval)
    return value


def _poll(predicate: Callable[[], T], deadline: float, timeout: float, what: str) -> T:
    """``predicate()``; fails the test if that is falsy and ``deadline`` has passed."""
    value = predicate()
    if not value and time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
    return value


def wait_until_still(
    read: Callable[[], T],
    quiet_s: float,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "",
) -> T:
    """Poll ``read`` until its value has not changed for ``quiet_s`` seconds; return it.

    For a count that late answers may still move (acknowledgements of requests sent before a
    fault): the value a test then holds steady. Fails after ``timeout`` seconds of change.
    """
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while True:
        time.sleep(interval)
        current, now = read(), time.monotonic()
        if current != value:
            value, since = current, now
        elif now - since >= quiet_s:
            return value
        if now > deadline:
            raise AssertionError(f"{what or read} still changing after {timeout}s (last {value!r})")
