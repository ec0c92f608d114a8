"""The PySpark data source ``durable-kafka``: Spark's Kafka sink columns, written via the agent.

Usage::

    from durable_producer.spark_integration import register
    register(spark)
    df.write.format("durable-kafka").option("topic", "events").mode("append").save()

Batch and Structured Streaming writes use PySpark's Arrow writers, so each task receives
``pyarrow.RecordBatch`` objects and never builds a ``Row`` per record. Schema and options
are checked on the driver before any task starts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from durable_producer.spark_integration.columns import SinkColumns, resolve_columns
from durable_producer.spark_integration.errors import SinkOptionError
from durable_producer.spark_integration.options import SinkOptions, parse_options
from durable_producer.spark_integration.producer import produce_all
from durable_producer.spark_integration.producer_settings import validate_producer_settings
from durable_producer.spark_integration.task_attempts import TaskAttempt, report_retried_rows

SHORT_NAME = "durable-kafka"

logger = logging.getLogger(__name__)


@dataclass
class DurableKafkaCommitMessage(WriterCommitMessage):
    """What one task reports to the driver after all its records were acknowledged."""

    partition_id: int
    records: int
    attempt: int = 0


def _write(
    iterator: Iterator[pa.RecordBatch], options: SinkOptions, columns: SinkColumns
) -> DurableKafkaCommitMessage:
    task = TaskAttempt.current()
    records = produce_all(iterator, options, columns, task)
    return DurableKafkaCommitMessage(
        partition_id=task.partition, records=records, attempt=task.attempt
    )


def _ours(messages: list[WriterCommitMessage | None]) -> list[DurableKafkaCommitMessage]:
    return [m for m in messages if isinstance(m, DurableKafkaCommitMessage)]


def _total_records(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in _ours(messages))


def _report_committed(messages: list[WriterCommitMessage | None], what: str) -> None:
    total = _total_records(messages)
    logger.info("durable-kafka: %s: %d records acknowledged", what, total)
    retried = {m.partition_id: m.records for m in _ours(messages) if m.attempt > 0}
    report_retried_rows(retried, total, what)


class DurableKafkaBatchWriter(DataSourceArrowWriter):
    """Batch writer: one confluent-kafka producer per task, committed only when all acked."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DurableKafkaCommitMessage:
        return _write(iterator, self.options, self.columns)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report_committed(messages, "write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.warning(
            "durable-kafka: write aborted; %d records from successful tasks are already "
            "acknowledged and stay written (Kafka has no rollback)",
            _total_records(messages),
        )


class DurableKafkaStreamWriter(DataSourceStreamArrowWriter):
    """Structured Streaming writer: each micro-batch task commits only when all acked.

    Delivery is at-least-once: a micro-batch replayed after a failure is written again.
    """

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DurableKafkaCommitMessage:
        return _write(iterator, self.options, self.columns)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report_committed(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning(
            "durable-kafka: micro-batch %d aborted; %d records already acknowledged stay written",
            batchId,
            _total_records(messages),
        )


class DurableKafkaDataSource(DataSource):
    """``format("durable-kafka")``: write-only; columns key, value, topic, partition, headers."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def _validated(self, schema: StructType) -> tuple[SinkOptions, SinkColumns]:
        """Options, ``kafka.*`` settings and columns, all checked here on the driver."""
        options = parse_options(dict(self.options))
        validate_producer_settings(options)
        return options, resolve_columns(schema, options.topic)

    def writer(self, schema: StructType, overwrite: bool) -> DurableKafkaBatchWriter:
        if overwrite:
            raise SinkOptionError(
                "durable-kafka: a Kafka topic cannot be overwritten; use mode('append') "
                "(Spark's own Kafka sink refuses overwrite too)"
            )
        return DurableKafkaBatchWriter(*self._validated(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DurableKafkaStreamWriter:
        return DurableKafkaStreamWriter(*self._validated(schema))


def register(spark: SparkSession) -> None:
    """Make ``format("durable-kafka")`` available in ``spark``."""
    spark.dataSource.register(DurableKafkaDataSource)


def activate_in_current_thread(spark: SparkSession) -> None:
    """Let writes from this (non-main) Python thread find ``durable-kafka``.

    Spark looks Python data sources up in the JVM thread's *active* session, which a new
    Python thread does not have (even a ``pyspark.InheritableThread``): without this the
    write fails with ``DATA_SOURCE_NOT_FOUND``.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
