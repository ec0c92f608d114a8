"""Options of the durable-kafka data source."""

from __future__ import annotations

import pytest

from durable_producer.contract import AGENT_BOOTSTRAP, BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration.errors import SinkOptionError
from durable_producer.spark_integration.options import (
    DEFAULT_PRODUCER_CONFIG,
    agent_bypass_warning,
    bootstrap_addresses,
    parse_options,
    resolve_bootstrap,
)


def test_defaults_leave_bootstrap_to_the_task_environment() -> None:
    options = parse_options({})
    assert options.bootstrap is None
    assert options.topic is None
    assert options.tombstones is False
    assert options.producer_overrides == {}


def test_kafka_prefixed_options_pass_through_to_the_producer() -> None:
    options = parse_options({"kafka.linger.ms": "50", "Kafka.Compression.Type": "lz4"})
    config = options.producer_config("127.0.0.1:19092")
    assert config["linger.ms"] == "50"
    assert config["compression.type"] == "lz4"
    assert config["bootstrap.servers"] == "127.0.0.1:19092"
    assert config["acks"] == DEFAULT_PRODUCER_CONFIG["acks"] == "all"
    assert config["enable.idempotence"] == "true"
    assert config["delivery.report.only.error"] is True


def test_python_client_booleans_are_converted_from_option_strings() -> None:
    options = parse_options({"kafka.delivery.report.only.error": "false"})
    assert options.producer_config("a:1")["delivery.report.only.error"] is False


def test_kafka_bootstrap_servers_is_accepted_as_in_sparks_kafka_sink() -> None:
    options = parse_options({"kafka.bootstrap.servers": "10.0.0.1:9092"})
    assert options.bootstrap == "10.0.0.1:9092"
    assert "bootstrap.servers" not in options.producer_overrides


def test_bootstrap_option_wins_over_kafka_bootstrap_servers() -> None:
    options = parse_options({"bootstrap": "a:1", "kafka.bootstrap.servers": "b:2"})
    assert options.bootstrap == "a:1"
    assert options.producer_config("a:1")["bootstrap.servers"] == "a:1"


def test_option_names_are_case_insensitive() -> None:
    options = parse_options({"TOPIC": "events", "Tombstones": "true", "agentWaitSeconds": "0.5"})
    assert options.topic == "events"
    assert options.tombstones is True
    assert options.agent_wait_seconds == 0.5


@pytest.mark.parametrize(
    ("name", "value"),
    [("tombstones", "maybe"), ("agentWaitSeconds", "-1"), ("flushTimeoutSeconds", "soon")],
)
def test_invalid_option_values_name_the_option(name: str, value: str) -> None:
    with pytest.raises(SinkOptionError, match=name):
        parse_options({name: value})


def test_resolve_bootstrap_prefers_option_then_environment_then_default() -> None:
    env = {BOOTSTRAP_TWIN_ENV: "127.0.0.1:19999"}
    assert resolve_bootstrap("127.0.0.1:1", env) == "127.0.0.1:1"
    assert resolve_bootstrap(None, env) == "127.0.0.1:19999"
    assert resolve_bootstrap(None, {}) == AGENT_BOOTSTRAP == "127.0.0.1:9092"


def test_bootstrap_addresses_parse_lists_schemes_and_ipv6() -> None:
    assert bootstrap_addresses("PLAINTEXT://127.0.0.1:9092, localhost:9093,[::1]:9094") == [
        ("127.0.0.1", 9092),
        ("localhost", 9093),
        ("::1", 9094),
    ]


@pytest.mark.parametrize("bad", ["", "127.0.0.1", "host:port", ":9092"])
def test_bootstrap_addresses_reject_malformed_entries(bad: str) -> None:
    with pytest.raises(SinkOptionError, match="bootstrap"):
        bootstrap_addresses(bad)


def test_default_partitioner_is_the_java_producers() -> None:
    assert DEFAULT_PRODUCER_CONFIG["partitioner"] == "murmur2_random"
    config = parse_options({"kafka.partitioner": "consistent_random"}).producer_config("a:1")
    assert config["partitioner"] == "consistent_random"


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("topics", "topic"),
        ("Tombstone", "tombstones"),
        ("agentWaitSecond", "agentWaitSeconds"),
        ("bootstrap.servers", "kafka.bootstrap.servers"),
        ("kafak.linger.ms", "kafka.linger.ms"),
    ],
)
def test_misspelt_option_says_what_was_meant(given: str, meant: str) -> None:
    with pytest.raises(SinkOptionError) as raised:
        parse_options({given: "x"})
    assert str(raised.value) == (
        f"durable-kafka: unknown option {given.lower()!r}: did you mean {meant!r}?"
    )


def test_unrelated_unknown_options_are_ignored_as_sparks_kafka_sink_does() -> None:
    assert parse_options({"path": "/x", "checkpointLocation": "/c", "topic": "t"}).topic == "t"


def test_bootstrap_pointing_away_from_the_pods_agent_is_warned_about() -> None:
    env = {BOOTSTRAP_TWIN_ENV: "127.0.0.1:9092"}
    warning = agent_bypass_warning("kafka-0.kafka:9092", env)
    assert warning is not None
    assert warning.startswith("durable-kafka: writing to kafka-0.kafka:9092")
    assert "not to this pod's buffer agent at 127.0.0.1:9092" in warning
    assert agent_bypass_warning("127.0.0.1:9092", env) is None
    assert agent_bypass_warning(None, env) is None
    assert agent_bypass_warning("kafka-0.kafka:9092", {}) is None  # no agent in this pod
