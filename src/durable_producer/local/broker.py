"""The embedded default broker: one Apache Kafka node (KRaft, combined mode) for the demo, most
tests and the benchmarks; ``ProxiedBroker`` puts a ``FaultProxy`` in front of one.

``KafkaBroker`` is a single node, so every internal topic has replication factor 1 and
``min.insync.replicas`` is 1. Topics are not created on request
(``auto.create.topics.enable=false``, as most managed clusters run): create them with
``create_topic``; a client that names a missing topic gets UNKNOWN_TOPIC_OR_PARTITION, as it
would there. ``auto_create_topics=True`` gives Kafka's own default for the tests of that path.

The broker keeps its data on disk until it is closed: ``kill()`` (kill -9) and ``start()``
again is a broker crash and restart with nothing lost that it had acknowledged to ``acks=all``
(it fsyncs nothing itself, but the page cache survives the process).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Self

from .fault_proxy import FaultProxy
from .kafka_node import JVM_OPTIONS, KafkaNode
from .ports import LOOPBACK, free_port
from .process import Managed

# The topic helpers and ports have their own modules; tests also import them from here.
from .topics import ConsumedRecord, consume_all, create_topic

__all__ = [
    "LOOPBACK",
    "SINGLE_NODE_PROPERTIES",
    "ConsumedRecord",
    "KafkaBroker",
    "ProxiedBroker",
    "consume_all",
    "create_topic",
    "free_port",
    "running_broker",
    "suspended",
]

SINGLE_NODE_PROPERTIES: Mapping[str, str] = {
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}
"""Replication settings a one-node cluster needs (the defaults of 3 leave transactions and
consumer groups waiting for replicas that never come)."""


class KafkaBroker(KafkaNode):
    """One Kafka node that is its own quorum; use as a context manager.

    ``advertise`` ("host:port") is the address put in metadata responses, so that clients
    keep going through a fault proxy after bootstrap. ``properties`` override server settings
    (e.g. ``{"message.max.bytes": "1000"}``); ``jvm_options`` the JVM's (``KafkaNode``).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        advertise: str | None = None,
        auto_create_topics: bool = False,
        properties: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = JVM_OPTIONS,
    ) -> None:
        settings = {
            **SINGLE_NODE_PROPERTIES,
            "auto.create.topics.enable": "true" if auto_create_topics else "false",
            **(properties or {}),
        }
        super().__init__(
            1, client_port=port, advertise=advertise, properties=settings, jvm_options=jvm_options
        )


class ProxiedBroker(Managed):
    """A broker reachable only through a ``FaultProxy`` (it advertises the proxy's address).

    ``proxy`` cuts, hangs or restores the path; ``broker`` is the ``KafkaBroker`` itself
    (``kill``/``start``, ``suspend``/``resume``); ``direct_address`` bypasses the proxy.
    """

    def __init__(
        self,
        *,
        auto_create_topics: bool = False,
        properties: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = JVM_OPTIONS,
    ) -> None:
        self.proxy = FaultProxy()
        self.broker: KafkaBroker | None = None
        self._auto_create_topics = auto_create_topics
        self._properties = properties
        self._jvm_options = jvm_options

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_address(self) -> str:
        assert self.broker is not None
        return self.broker.direct_address

    def start(self) -> Self:
        self.proxy.start()
        try:
            self.broker = KafkaBroker(
                advertise=self.proxy.address,
                auto_create_topics=self._auto_create_topics,
                properties=self._properties,
                jvm_options=self._jvm_options,
            )
            self.proxy.target = self.broker.direct_address
            self.broker.start()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self) -> None:
        try:
            self.proxy.stop()
        finally:
            if self.broker is not None:
                self.broker.close()

    def close(self) -> None:
        self.stop()


@contextmanager
def running_broker(
    *, advertise: str | None = None, auto_create_topics: bool = False
) -> Iterator[KafkaBroker]:
    with KafkaBroker(advertise=advertise, auto_create_topics=auto_create_topics) as broker:
        yield broker


@contextmanager
def suspended(broker: KafkaNode) -> Iterator[None]:
    """SIGSTOP the broker for the duration of the block; always SIGCONT afterwards."""
    broker.suspend()
    try:
        yield
    finally:
        broker.resume()
