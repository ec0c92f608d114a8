"""The ``kafka.*`` options checked on the driver, by librdkafka itself.

librdkafka checks a configuration when a client is created. Creating a throwaway producer
without ``bootstrap.servers`` runs exactly that check and connects nowhere (a few
milliseconds), so a misspelt or invalid setting fails the write on the driver, naming the
option, instead of failing every task with a raw ``KafkaException``.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException, Producer

from durable_producer.spark_integration.errors import SinkOptionError
from durable_producer.spark_integration.options import PRODUCER_PREFIX, SinkOptions

# Settings of Spark's Kafka sink (the Java producer) that librdkafka does not have, and what
# to do instead: a user migrating from format("kafka") meets these first.
JAVA_ONLY_SETTINGS: dict[str, str] = {
    "key.serializer": "durable-kafka sends the 'key' column's bytes as they are; drop it",
    "value.serializer": "durable-kafka sends the 'value' column's bytes as they are; drop it",
    "partitioner.class": "choose a librdkafka partitioner with 'kafka.partitioner' "
    "(the default, murmur2_random, is the Java producer's)",
    "max.block.ms": "librdkafka does not block on metadata; drop it",
    "buffer.memory": "use 'kafka.queue.buffering.max.kbytes'",
    "interceptor.classes": "librdkafka has no interceptors; drop it",
}

# Refused here because the buffer agent refuses them (it cannot commit a transaction
# atomically with the real cluster).
REFUSED_SETTINGS: dict[str, str] = {
    "transactional.id": "transactions are not supported through the buffer agent; "
    "durable-kafka writes are idempotent and at-least-once",
}

_SILENT = {"log_level": 0}


def validate_producer_settings(options: SinkOptions) -> None:
    """Raise ``SinkOptionError`` naming the first ``kafka.*`` option librdkafka refuses."""
    overrides = options.producer_overrides
    for name, reason in REFUSED_SETTINGS.items():
        if name in overrides:
            raise SinkOptionError(f"durable-kafka: option '{PRODUCER_PREFIX}{name}': {reason}")
    config = options.producer_config("")
    problem = _librdkafka_problem(config)
    if problem is None:
        return
    defaults_only = SinkOptions().producer_config("")
    for name, value in sorted(overrides.items()):
        alone = _librdkafka_problem({**defaults_only, name: config[name]})
        if alone is not None:
            advice = JAVA_ONLY_SETTINGS.get(
                name,
                "kafka.* options are librdkafka producer settings "
                "(see librdkafka's CONFIGURATION.md)",
            )
            raise SinkOptionError(
                f"durable-kafka: option '{PRODUCER_PREFIX}{name}' = {value!r} is refused by "
                f"the Kafka client: {alone}; {advice}"
            )
    given = ", ".join(f"'{PRODUCER_PREFIX}{name}'" for name in sorted(overrides)) or "none"
    raise SinkOptionError(
        f"durable-kafka: the kafka.* options ({given}) do not work together with the "
        f"producer defaults: {problem}"
    )


def _librdkafka_problem(config: Mapping[str, str | bool]) -> str | None:
    """librdkafka's complaint about ``config``, or ``None`` when it accepts it."""
    settings = {name: value for name, value in config.items() if name != "bootstrap.servers"}
    try:
        Producer({**settings, **_SILENT})
    except KafkaException as error:
        return str(error.args[0].str())
    return None
