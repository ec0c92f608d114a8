"""Kafka cut off during a Spark write: the job still finishes and every row reaches Kafka.

Through the buffer agent (the default endpoint) the job finishes *while* Kafka is still
unreachable, because the agent acknowledges once a batch is in its WAL, and forwards the
backlog after the cut is restored. Straight to the broker, the tasks wait for
acknowledgements through the cut and never report success early.
"""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import consume_all
from support.fault_proxy import ProxyMode

pytestmark = pytest.mark.integration

ROWS = 200_000
WARMUP_ROWS = 10
OUTAGE_SECONDS = 4.0


def rows(spark: SparkSession, count: int, first: int = 0) -> DataFrame:
    row_number = F.col("id").cast("string")
    return spark.range(first, first + count, numPartitions=2).select(
        row_number.cast("binary").alias("key"),
        F.lpad(row_number, 64, "v").cast("binary").alias("value"),
    )


def write(frame: DataFrame, topic: str) -> None:
    frame.write.format(SHORT_NAME).option("topic", topic).mode("append").save()


def assert_all_rows_in_kafka(endpoint: KafkaEndpoint, topic: str, total: int) -> None:
    records = consume_all(endpoint.read_bootstrap, topic, expected=total, timeout=180)
    assert {record.key for record in records} == {str(row).encode() for row in range(total)}
    assert all(record.value == (record.key or b"").rjust(64, b"v") for record in records)


def test_job_finishes_while_kafka_is_cut_off_behind_the_agent(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    if not kafka_endpoint.through_agent:
        pytest.skip("needs the buffer agent as the endpoint")
    proxy = kafka_endpoint.kafka.proxy
    topic = kafka_endpoint.new_topic(partitions=2)
    write(rows(spark, WARMUP_ROWS), topic)  # the job's first part, while Kafka is up
    proxy.cut()
    try:
        write(rows(spark, ROWS - WARMUP_ROWS, first=WARMUP_ROWS), topic)
        assert proxy.mode is ProxyMode.CUT
        held_back = consume_all(kafka_endpoint.read_bootstrap, topic, timeout=10, idle=1.0)
        assert len(held_back) <= WARMUP_ROWS, "records reached Kafka through a cut connection"
    finally:
        proxy.restore()
    assert_all_rows_in_kafka(kafka_endpoint, topic, ROWS)


def test_tasks_wait_through_a_cut_when_writing_straight_to_kafka(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    if kafka_endpoint.through_agent:
        pytest.skip("only without a buffer agent (DURABLE_KAFKA_TESTS_ENDPOINT=broker)")
    proxy = kafka_endpoint.kafka.proxy
    topic = kafka_endpoint.new_topic(partitions=2)
    restore = threading.Timer(OUTAGE_SECONDS, proxy.restore)
    proxy.cut()
    started = time.monotonic()
    restore.start()
    try:
        write(rows(spark, ROWS), topic)
    finally:
        restore.cancel()
        proxy.restore()
    assert time.monotonic() - started >= OUTAGE_SECONDS, "finished while Kafka was unreachable"
    assert_all_rows_in_kafka(kafka_endpoint, topic, ROWS)
