"""Spark's own Kafka sink (``format("kafka")``) for the tests and benchmarks that run it beside
durable-kafka: the jars ``make tools`` installs for the installed pyspark
(scripts/install-spark-kafka.sh, ``.tools/spark-kafka/<pyspark version>/libs``), passed to a
SparkSession as ``spark.jars``.

Maven Central may lag PyPI: when it has no sink of the installed pyspark's version, the script
installs the newest release before it, and ``sink_version()`` says which one runs.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from .tools import REPO_ROOT

SPARK_KAFKA_DIR = REPO_ROOT / ".tools" / "spark-kafka"
SINK_ARTIFACT = "spark-sql-kafka-0-10_2.13"
SPARK_JARS_CONF = "spark.jars"
SINK_FORMAT = "kafka"
"""Spark's own sink: ``df.write.format("kafka")``."""


class SparkKafkaNotInstalled(RuntimeError):
    """The sink's jars are missing; the message says what to do, in one line."""


def pyspark_version() -> str:
    return importlib.metadata.version("pyspark")


def spark_kafka_jars() -> list[Path]:
    """Every jar of the sink for the installed pyspark."""
    libs = SPARK_KAFKA_DIR / pyspark_version() / "libs"
    jars = sorted(libs.glob("*.jar"))
    if not any(jar.name.startswith(SINK_ARTIFACT) for jar in jars):
        raise SparkKafkaNotInstalled(
            f"Spark's Kafka sink for pyspark {pyspark_version()} is not installed (no {libs}):"
            " run `make tools` in the repository"
        )
    return jars


def spark_jars_conf() -> str:
    """The ``spark.jars`` value that makes ``format("kafka")`` available."""
    return ",".join(str(jar) for jar in spark_kafka_jars())


def sink_version() -> str:
    """The version of the installed sink (pyspark's own, or the newest release before it)."""
    for jar in spark_kafka_jars():
        if jar.name.startswith(SINK_ARTIFACT + "-"):
            return jar.name.removeprefix(SINK_ARTIFACT + "-").removesuffix(".jar")
    raise AssertionError("unreachable: spark_kafka_jars() checked the sink's jar")
