"""Errors raised by the durable-kafka data source; each message says what to do about it."""

from __future__ import annotations


class DurableKafkaError(Exception):
    """Base class of every durable-kafka error."""


class SinkOptionError(DurableKafkaError, ValueError):
    """An option of the data source has an invalid value."""


class SinkSchemaError(DurableKafkaError, ValueError):
    """The DataFrame's columns do not match Spark's Kafka sink columns."""


class NullValueError(DurableKafkaError, ValueError):
    """A column holds a null where the sink cannot accept one."""


class InvalidPartitionError(DurableKafkaError, ValueError):
    """The ``partition`` column holds a negative number."""


class AgentUnreachableError(DurableKafkaError, ConnectionError):
    """Nothing accepts connections at the buffer agent's address."""


class DeliveryError(DurableKafkaError, RuntimeError):
    """Some records were not acknowledged, so the task must not commit."""


class InvalidTopicError(DurableKafkaError, ValueError):
    """A topic name breaks Kafka's naming rule."""


class MissingTopicError(DeliveryError):
    """The topic does not exist on the Kafka cluster, and the cluster does not create it."""
