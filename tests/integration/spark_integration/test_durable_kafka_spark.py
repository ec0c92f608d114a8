"""PySpark local mode writing through ``format("durable-kafka")`` to a real Kafka endpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from durable_producer.spark_integration import activate_in_current_thread
from durable_producer.spark_integration.data_source import SHORT_NAME
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import consume_all, free_port

pytestmark = pytest.mark.integration

MILLION = 1_000_000


def generated_rows(spark: SparkSession, rows: int, partitions: int = 2) -> DataFrame:
    """Small rows whose key, value and headers are all derived from the row number."""
    row_number = F.col("id").cast("string")
    return spark.range(rows, numPartitions=partitions).select(
        row_number.cast("binary").alias("key"),
        F.concat(F.lit("value-"), row_number).cast("binary").alias("value"),
        F.array(
            F.struct(F.lit("row").alias("key"), row_number.cast("binary").alias("value")),
            F.struct(
                F.lit("parity").alias("key"),
                (F.col("id") % 2).cast("string").cast("binary").alias("value"),
            ),
        ).alias("headers"),
    )


def assert_generated_rows_arrived(endpoint: KafkaEndpoint, topic: str, rows: int) -> None:
    records = consume_all(endpoint.read_bootstrap, topic, expected=rows, timeout=240)
    assert len(records) == rows
    seen: set[int] = set()
    for record in records:
        assert record.key is not None
        row = int(record.key)
        text = record.key
        assert record.value == b"value-" + text
        assert record.headers == (("row", text), ("parity", str(row % 2).encode()))
        seen.add(row)
    assert len(seen) == rows
    assert min(seen) == 0
    assert max(seen) == rows - 1


def test_batch_write_of_a_million_rows_arrives_intact(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = kafka_endpoint.new_topic(partitions=2)
    started = time.monotonic()
    generated_rows(spark, MILLION).write.format(SHORT_NAME).option("topic", topic).mode(
        "append"
    ).save()
    elapsed = time.monotonic() - started
    print(f"durable-kafka wrote {MILLION} rows in {elapsed:.1f}s ({MILLION / elapsed:,.0f} rows/s)")
    assert_generated_rows_arrived(kafka_endpoint, topic, MILLION)


def test_topic_partition_and_nullable_key_columns(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = kafka_endpoint.new_topic(partitions=3)
    rows = [(None, "a", topic, 2), ("k", "b", topic, 0), ("k2", "c", topic, None)]
    frame = spark.createDataFrame(rows, "key string, value string, topic string, partition int")
    frame.write.format(SHORT_NAME).mode("append").save()

    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=3)
    by_value = {record.value: record for record in records}
    assert sorted(by_value) == [b"a", b"b", b"c"]
    assert (by_value[b"a"].key, by_value[b"a"].partition) == (None, 2)
    assert (by_value[b"b"].key, by_value[b"b"].partition) == (b"k", 0)
    assert by_value[b"c"].key == b"k2"


def test_streaming_query_writes_every_micro_batch(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint, tmp_path: Path
) -> None:
    topic = kafka_endpoint.new_topic(partitions=2)
    source = tmp_path / "source"
    files, rows_per_file = 3, 2_000
    for file_number in range(files):
        generated_rows(spark, rows_per_file, partitions=1).withColumn(
            "id", F.lit(file_number)
        ).write.mode("append").parquet(str(source))
    schema = spark.read.parquet(str(source)).schema
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .select(
            F.concat(F.col("id").cast("string").cast("binary"), F.lit(b"-"), F.col("key")).alias(
                "key"
            ),
            "value",
            "headers",
        )
    )
    query = (
        stream.writeStream.format(SHORT_NAME)
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "streaming query did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [rows_per_file] * files

    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=files * rows_per_file)
    keys = {record.key for record in records}
    assert len(records) == len(keys) == files * rows_per_file
    assert {key.split(b"-")[0] for key in keys if key} == {b"0", b"1", b"2"}


def test_write_from_another_thread_after_activation(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = kafka_endpoint.new_topic(partitions=1)
    frame = spark.range(100, numPartitions=1).selectExpr("CAST(id AS STRING) AS value")
    failures: list[BaseException] = []

    def write_in_thread() -> None:
        try:
            activate_in_current_thread(spark)
            frame.write.format(SHORT_NAME).option("topic", topic).mode("append").save()
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=write_in_thread)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert failures == []
    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=100)
    assert sorted(int(r.value) for r in records if r.value) == list(range(100))


def write_error(frame: DataFrame, **options: str) -> str:
    """Run a write that must fail; return the text of the error Spark raised."""
    writer = frame.write.format(SHORT_NAME).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises(Exception) as raised:
        writer.save()
    return str(raised.value)


def test_wrong_column_type_is_reported_before_any_task(spark: SparkSession) -> None:
    frame = spark.range(3).selectExpr("id AS value")
    message = write_error(frame, topic="t")
    assert "column 'value' must be of type binary or string, got bigint" in message


def test_overwrite_mode_is_refused(spark: SparkSession) -> None:
    frame = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception) as raised:
        frame.write.format(SHORT_NAME).option("topic", "t").mode("overwrite").save()
    assert "a Kafka topic cannot be overwritten; use mode('append')" in str(raised.value)


def test_missing_topic_is_reported(spark: SparkSession) -> None:
    message = write_error(spark.range(3).selectExpr("CAST(id AS STRING) AS value"))
    assert "add a string column 'topic' or set the option 'topic'" in message


def test_unreachable_agent_fails_fast_with_a_clear_message(spark: SparkSession) -> None:
    address = f"127.0.0.1:{free_port()}"
    frame = spark.range(10, numPartitions=1).selectExpr("CAST(id AS STRING) AS value")
    started = time.monotonic()
    message = write_error(frame, topic="t", bootstrap=address, agentWaitSeconds="1")
    assert time.monotonic() - started < 60
    assert f"cannot connect to the buffer agent at {address}" in message
    assert "buffer agent sidecar must be running in this pod" in message


def test_null_value_is_refused_unless_tombstones_are_enabled(
    spark: SparkSession, kafka_endpoint: KafkaEndpoint
) -> None:
    topic = kafka_endpoint.new_topic(partitions=1)
    frame = spark.createDataFrame([("a", "1"), ("b", None)], "key string, value string").coalesce(1)
    message = write_error(frame, topic=topic)
    assert "column 'value' has 1 null value(s)" in message
    assert "tombstones=true" in message

    frame.write.format(SHORT_NAME).option("topic", topic).option("tombstones", "true").mode(
        "append"
    ).save()
    records = consume_all(kafka_endpoint.read_bootstrap, topic, expected=2)
    assert sorted((r.key, r.value) for r in records) == [(b"a", b"1"), (b"b", None)]
