"""``kafka.*`` options checked on the driver by librdkafka (no broker needed)."""

from __future__ import annotations

import time

import pytest

from durable_producer.spark_integration.errors import SinkOptionError
from durable_producer.spark_integration.options import parse_options
from durable_producer.spark_integration.producer_settings import validate_producer_settings


def error_for(options: dict[str, str]) -> str:
    with pytest.raises(SinkOptionError) as raised:
        validate_producer_settings(parse_options(options))
    return str(raised.value)


def test_valid_settings_pass_quickly_without_a_broker() -> None:
    started = time.monotonic()
    validate_producer_settings(
        parse_options(
            {"kafka.linger.ms": "50", "kafka.compression.type": "zstd", "kafka.acks": "all"}
        )
    )
    validate_producer_settings(parse_options({}))
    assert time.monotonic() - started < 5


def test_misspelt_setting_is_named_with_the_durable_kafka_prefix() -> None:
    message = error_for({"kafka.linger.msx": "5"})
    assert message.startswith("durable-kafka: option 'kafka.linger.msx' = '5' is refused")
    assert 'No such configuration property: "linger.msx"' in message


def test_invalid_value_names_the_option_the_user_gave() -> None:
    message = error_for({"kafka.linger.ms": "soon", "kafka.compression.type": "lz4"})
    assert "option 'kafka.linger.ms' = 'soon'" in message


def test_settings_that_conflict_with_the_defaults_are_explained() -> None:
    message = error_for({"kafka.acks": "1"})
    assert "`acks` must be set to `all` when `enable.idempotence` is true" in message
    assert "'kafka.acks'" in message


def test_java_only_settings_of_sparks_kafka_sink_get_advice() -> None:
    message = error_for({"kafka.key.serializer": "org.apache.kafka.StringSerializer"})
    assert "sends the 'key' column's bytes as they are; drop it" in message


def test_transactional_id_is_refused() -> None:
    assert "transactions are not supported" in error_for({"kafka.transactional.id": "t"})


def test_partitioner_can_be_chosen() -> None:
    validate_producer_settings(parse_options({"kafka.partitioner": "consistent_random"}))
    assert "partitioner" in error_for({"kafka.partitioner": "java"})
