"""Errors a user migrating from ``format("kafka")`` meets: early, named, ``durable-kafka:``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from durable_producer.local.agent_process import AgentProcess
from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import consume_all

pytestmark = pytest.mark.integration

# A task that reaches Kafka takes a second or two here; librdkafka's metadata retries for a
# bad or missing topic took 31 s before these checks.
FAST_SECONDS = 20


def failed_write(frame: DataFrame, **options: str) -> tuple[str, float]:
    """Run a write that must fail: Spark's error text and how long it took."""
    writer = frame.write.format(SHORT_NAME).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        writer.save()
    return str(raised.value), time.monotonic() - started


def values(spark: SparkSession, rows: int = 5) -> DataFrame:
    return spark.range(rows, numPartitions=1).selectExpr("CAST(id AS STRING) AS value")


def test_invalid_topic_option_fails_on_the_driver(spark: SparkSession) -> None:
    message, seconds = failed_write(values(spark), topic="bad topic!")
    assert "durable-kafka: option 'topic': 'bad topic!' is not a valid Kafka topic name" in message
    assert "it contains ' ' at position 3" in message
    assert seconds < FAST_SECONDS


def test_invalid_name_in_the_topic_column_fails_the_task_clearly(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    good = kafka_endpoint.new_topic(partitions=1)
    frame = spark.createDataFrame([("a", good), ("b", "orders/eu")], "value string, topic string")
    message, seconds = failed_write(frame.coalesce(1))
    assert "durable-kafka: column 'topic': 'orders/eu' is not a valid Kafka topic name" in message
    assert seconds < FAST_SECONDS


def test_misspelt_option_suggests_the_right_one(spark: SparkSession) -> None:
    message, _ = failed_write(values(spark), topics="events")
    assert "durable-kafka: unknown option 'topics': did you mean 'topic'?" in message


def test_invalid_producer_setting_fails_on_the_driver(spark: SparkSession) -> None:
    message, seconds = failed_write(values(spark), topic="events", **{"kafka.linger.msx": "5"})
    assert (
        "durable-kafka: option 'kafka.linger.msx' = '5' is refused by the Kafka client" in message
    )
    assert 'No such configuration property: "linger.msx"' in message
    assert seconds < FAST_SECONDS


@pytest.fixture
def agent_that_creates_no_topics(
    kafka_endpoint: KafkaEndpoint, tmp_path: Path
) -> Iterator[AgentProcess]:
    """An agent whose cluster (as far as it asks) does not create topics on first use."""
    settings = ["--kafka-setting", "allow.auto.create.topics=false"]
    with AgentProcess(
        tmp_path / "volume", kafka_endpoint.kafka.bootstrap, extra_args=settings
    ) as agent:
        yield agent


def test_topic_the_cluster_would_not_create_fails_fast_and_clearly(
    spark: SparkSession, agent_that_creates_no_topics: AgentProcess
) -> None:
    message, seconds = failed_write(
        values(spark), topic="no-such-topic", bootstrap=agent_that_creates_no_topics.bootstrap
    )
    assert "durable-kafka: topic 'no-such-topic' does not exist on the Kafka cluster" in message
    assert "Create the topic first" in message
    assert seconds < FAST_SECONDS


def test_topic_the_cluster_creates_on_first_use_is_written(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = f"auto-{time.monotonic_ns()}"  # not created beforehand: created on request
    started = time.monotonic()
    values(spark, rows=20).write.format(SHORT_NAME).option("topic", topic).mode("append").save()
    assert time.monotonic() - started < FAST_SECONDS
    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=20)
    assert sorted(int(record.value or b"-1") for record in records) == list(range(20))
