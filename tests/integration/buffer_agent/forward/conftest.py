"""Fixtures of the forwarder's tests against Apache Kafka (the shared ones are a level up)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.broker import ProxiedBroker
from support.kafka_fixtures import started
from support.producer_state import FORGETFUL_PROPERTIES


@pytest.fixture
def forgetful_broker() -> Iterator[ProxiedBroker]:
    """A broker behind the fault proxy that forgets an idle producer after
    ``producer_state.EXPIRATION_MS``."""
    with started(lambda: ProxiedBroker(properties=FORGETFUL_PROPERTIES)) as proxied:
        yield proxied
