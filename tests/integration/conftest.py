"""Shared fixtures for integration tests: a real tansu broker, optionally behind a fault proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.broker import ProxiedBroker, TansuBroker
from support.fault_proxy import FaultProxy


@pytest.fixture
def tansu_broker() -> Iterator[TansuBroker]:
    """A fresh in-memory tansu broker on a free loopback port; ``.bootstrap`` to connect."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    """A fresh broker that clients reach only through a fault proxy.

    ``.bootstrap`` is the proxy's address (also the advertised one), ``.proxy`` controls
    faults (``cut``/``hang``/``restore``), ``.broker`` is the ``TansuBroker`` (``suspend``/
    ``resume`` for a hung process; ``direct_address`` bypasses the proxy).
    """
    with ProxiedBroker() as proxied:
        yield proxied


@pytest.fixture
def fault_proxy(proxied_broker: ProxiedBroker) -> FaultProxy:
    """The fault proxy in front of ``proxied_broker``."""
    return proxied_broker.proxy
