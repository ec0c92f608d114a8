"""The local Kafka helpers live in the package (the demo uses them too); tests import them here."""

from durable_producer.local.broker import (
    SINGLE_NODE_PROPERTIES,
    KafkaBroker,
    ProxiedBroker,
    running_broker,
    suspended,
)
from durable_producer.local.kafka_cluster import KafkaCluster, PartitionState
from durable_producer.local.kafka_node import KafkaNode, KafkaNotInstalled
from durable_producer.local.ports import LOOPBACK, free_port
from durable_producer.local.topics import ConsumedRecord, consume_all, create_topic

__all__ = [
    "LOOPBACK",
    "SINGLE_NODE_PROPERTIES",
    "ConsumedRecord",
    "KafkaBroker",
    "KafkaCluster",
    "KafkaNode",
    "KafkaNotInstalled",
    "PartitionState",
    "ProxiedBroker",
    "consume_all",
    "create_topic",
    "free_port",
    "running_broker",
    "suspended",
]
