"""Fixtures for the durable-kafka integration tests: one Kafka endpoint and one SparkSession.

``kafka_endpoint`` (see ``spark_harness``): by default a real buffer agent forwarding through
a fault proxy to a Kafka broker; Spark's Python workers see the agent's address as
``$DURABLE_PRODUCER_BOOTSTRAP``, like executors in an injected pod. Tests read back from
the broker directly. ``DURABLE_KAFKA_TESTS_ENDPOINT=broker`` writes straight to the broker.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from durable_producer.contract import BOOTSTRAP_TWIN_ENV
from durable_producer.spark_integration import register
from integration.spark_integration.spark_harness import (
    AgentProcess,
    KafkaEndpoint,
    endpoint_mode,
)
from support.broker import ProxiedBroker
from support.kafka_fixtures import started
from support.spark_kafka import SPARK_JARS_CONF, SparkKafkaNotInstalled, spark_jars_conf

SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
}


@pytest.fixture(scope="session")
def kafka_endpoint() -> Iterator[KafkaEndpoint]:
    # Kafka's default auto.create.topics.enable=true: one test writes to a topic the cluster
    # creates on first use (another one's agent asks it not to).
    with started(lambda: ProxiedBroker(auto_create_topics=True)) as kafka:
        if endpoint_mode() == "broker":
            yield KafkaEndpoint(
                write_bootstrap=kafka.bootstrap,
                read_bootstrap=kafka.direct_address,
                kafka=kafka,
                agent=None,
            )
            return
        with AgentProcess(kafka.bootstrap) as agent:
            yield KafkaEndpoint(
                write_bootstrap=agent.bootstrap,
                read_bootstrap=kafka.direct_address,
                kafka=kafka,
                agent=agent,
            )


@pytest.fixture(scope="session")
def spark(kafka_endpoint: KafkaEndpoint) -> Iterator[SparkSession]:
    """A local[2] SparkSession with durable-kafka registered and Spark's own Kafka sink on its
    classpath (``spark.jars``, when ``make tools`` installed it); its JVM is killed afterwards.

    The agent address reaches the Python workers through the environment the JVM is
    started with, as it reaches executors through the pod's env on Kubernetes.
    """
    launch_env = {
        BOOTSTRAP_TWIN_ENV: kafka_endpoint.write_bootstrap,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    saved = {name: os.environ.get(name) for name in launch_env}
    os.environ.update(launch_env)
    try:
        builder = SparkSession.builder.master("local[2]").appName("durable-kafka-tests")
        for key, value in SPARK_TEST_CONF.items():
            builder = builder.config(key, value)
        # Spark's own Kafka sink, for the tests beside it (they fail in one line without it)
        with contextlib.suppress(SparkKafkaNotInstalled):
            builder = builder.config(SPARK_JARS_CONF, spark_jars_conf())
        session = builder.getOrCreate()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    gateway = SparkContext._gateway
    try:
        session.sparkContext.setLogLevel("ERROR")
        register(session)
        yield session
    finally:
        session.stop()
        if gateway is not None:
            java_process = getattr(gateway, "proc", None)
            gateway.shutdown()
            if java_process is not None:
                java_process.kill()
                java_process.wait(timeout=30)
        SparkContext._gateway = None
        SparkContext._jvm = None
