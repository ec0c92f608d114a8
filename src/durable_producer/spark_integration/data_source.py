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

SHORT_NAME = "durable-kafka"

logger = logging.getLogger(__name__)


@dataclass
class DurableKafkaCommitMessage(WriterCommitMessage):
    """What one task reports to the driver after all its records were acknowledged."""

    partition_id: int
    records: int


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _total_records(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in messages if isinstance(m, DurableKafkaCommitMessage))


class DurableKafkaBatchWriter(DataSourceArrowWriter):
    """Batch writer: one confluent-kafka producer per task, committed only when all acked."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DurableKafkaCommitMessage:
        records = produce_all(iterator, self.options, self.columns)
        return DurableKafkaCommitMessage(partition_id=_partition_id(), records=records)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.info("durable-kafka: %d records acknowledged", _total_records(messages))

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
        records = produce_all(iterator, self.options, self.columns)
        return DurableKafkaCommitMessage(partition_id=_partition_id(), records=records)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.info(
            "durable-kafka: micro-batch %d: %d records acknowledged",
            batchId,
            _total_records(messages),
        )

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
        options = parse_options(dict(self.options))
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
