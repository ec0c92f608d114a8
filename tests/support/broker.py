"""The local broker helpers live in the package (the demo uses them too); tests import them here."""

from durable_producer.local.broker import (
    LOOPBACK,
    ConsumedRecord,
    ProxiedBroker,
    TansuBroker,
    consume_all,
    create_topic,
    free_port,
    running_broker,
    suspended,
    tansu_binary,
)

__all__ = [
    "LOOPBACK",
    "ConsumedRecord",
    "ProxiedBroker",
    "TansuBroker",
    "consume_all",
    "create_topic",
    "free_port",
    "running_broker",
    "suspended",
    "tansu_binary",
]
