"""The local broker helpers live in the package (the demo uses them too); tests import them here."""

from durable_producer.local.broker import (
    ProxiedBroker,
    TansuBroker,
    running_broker,
    suspended,
    tansu_binary,
)
from durable_producer.local.ports import LOOPBACK, free_port
from durable_producer.local.topics import ConsumedRecord, consume_all, create_topic

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
