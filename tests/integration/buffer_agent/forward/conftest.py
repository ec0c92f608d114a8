"""Fixtures of the forwarder's tests against Apache Kafka (the shared ones are a level up)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import WriteAheadLog
from support.broker import ProxiedBroker
from support.kafka_fixtures import started
from support.producer_state import FORGETFUL_PROPERTIES
from support.wal_helpers import forwarding_wal


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The agent's volume: the WAL in ``wal/``, the forwarder's state and dead letters beside."""
    return tmp_path / "data"


@pytest.fixture
def wal(data_dir: Path) -> Iterator[WriteAheadLog]:
    """A WAL for forwarding with the default limits (a test module's own ``wal`` overrides it)."""
    with forwarding_wal(data_dir / "wal") as log:
        yield log


@pytest.fixture
def forgetful_broker() -> Iterator[ProxiedBroker]:
    """A broker behind the fault proxy that forgets an idle producer after
    ``producer_state.EXPIRATION_MS``."""
    with started(lambda: ProxiedBroker(properties=FORGETFUL_PROPERTIES)) as proxied:
        yield proxied
