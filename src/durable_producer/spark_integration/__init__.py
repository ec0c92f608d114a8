"""Spark-on-Kubernetes pod templates, Spark conf helpers and the durable-kafka data source.

PySpark is imported lazily: ``register`` and the data source classes need it, the conf
helpers do not (they also run where only spark-submit is installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``spark.write.format("durable-kafka")`` available (see ``data_source``)."""
    from durable_producer.spark_integration.data_source import register as register_source

    register_source(spark)


def activate_in_current_thread(spark: SparkSession) -> None:
    """Let writes from this (non-main) Python thread find ``durable-kafka``."""
    from durable_producer.spark_integration.data_source import activate_in_current_thread as run

    run(spark)


def __getattr__(name: str) -> Any:
    if name == "DurableKafkaDataSource":
        from durable_producer.spark_integration.data_source import DurableKafkaDataSource

        return DurableKafkaDataSource
    raise AttributeError(name)


__all__ = ["DurableKafkaDataSource", "activate_in_current_thread", "register"]
