"""Shared fixtures for integration tests: real Apache Kafka (KRaft) brokers.

- ``kafka_broker`` (session): one single-node broker for the whole run; tests share it, so
  each test makes its own topics with ``new_topic``. Do not kill or suspend it: a test that
  hurts its broker takes ``proxied_broker`` or its own ``KafkaBroker``.
- ``new_topic`` (per test): ``new_topic(partitions=1, config=None, bootstrap=None)`` creates a
  topic named after the test, unique in the run, on ``kafka_broker`` unless ``bootstrap``
  says otherwise, and returns its name.
- ``kafka_cluster`` (per test, over one 3-node cluster for the session, started by the first
  test that asks for it): RF 3, ``min.insync.replicas=2``. Tests may kill, stop or suspend its
  nodes: afterwards every node is started again and every partition's ISR waited full.
- ``proxied_broker`` (per test): a fresh broker that clients reach only through a fault
  proxy; ``fault_proxy`` is that proxy.
- ``control_plane`` (session) and ``kube_namespace`` (per test): the local Kubernetes control
  plane and a fresh namespace on it (support/kube_cluster.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.broker import KafkaBroker, KafkaCluster, ProxiedBroker
from support.fault_proxy import FaultProxy
from support.kafka_fixtures import TopicFactory, started
from support.kube_cluster import control_plane, kube_namespace

__all__ = ["control_plane", "kube_namespace"]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The run's single-node Kafka broker (started at first use); ``.bootstrap`` to connect."""
    with started(KafkaBroker) as broker:
        yield broker


@pytest.fixture
def new_topic(request: pytest.FixtureRequest) -> TopicFactory:
    """Creates topics unique to this test (on ``kafka_broker`` by default)."""

    def default_bootstrap() -> str:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        return broker.bootstrap

    return TopicFactory(request.node.name, default_bootstrap)


@pytest.fixture(scope="session")
def kafka_cluster_session() -> Iterator[KafkaCluster]:
    with started(KafkaCluster) as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster(kafka_cluster_session: KafkaCluster) -> Iterator[KafkaCluster]:
    """The run's 3-node cluster, healed after the test (every node up, every ISR full)."""
    kafka_cluster_session.heal()
    yield kafka_cluster_session
    kafka_cluster_session.heal()


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    """A fresh broker that clients reach only through a fault proxy.

    ``.bootstrap`` is the proxy's address (also the advertised one), ``.proxy`` controls
    faults (``cut``/``hang``/``restore``), ``.broker`` is the ``KafkaBroker`` (``kill``/
    ``start``, ``suspend``/``resume``; ``direct_address`` bypasses the proxy).
    """
    with started(ProxiedBroker) as proxied:
        yield proxied


@pytest.fixture
def fault_proxy(proxied_broker: ProxiedBroker) -> FaultProxy:
    """The fault proxy in front of ``proxied_broker``."""
    return proxied_broker.proxy
