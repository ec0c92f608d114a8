"""A durable-kafka batch write under ``local[2,3]`` (3 attempts per task), run as its own process.

Used by ``test_durable_kafka_task_retries``: one SparkContext per Python process, and the
shared test session runs ``local[2]`` (no retries). Usage::

    python retry_job.py AGENT_BOOTSTRAP TOPIC ROWS

A Python UDF pauses briefly every 1,000 rows, so the write takes a few seconds and an agent
kill lands in the middle of it. Producer messages time out after
3 s, so an attempt fails while the agent is down; the retry waits up to 60 s for the agent.
Prints one JSON line: ``{"rows": N, "seconds": S}``.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from durable_producer.spark_integration import register
from durable_producer.spark_integration.data_source import SHORT_NAME

PAUSE_EVERY_ROWS = 1_000
PAUSE_S = 0.02


def paced(row: int) -> str:
    if row % PAUSE_EVERY_ROWS == 0:
        time.sleep(PAUSE_S)
    return str(row)


def main(bootstrap: str, topic: str, rows: int) -> None:
    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("durable-kafka-task-retries")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    row = F.udf(paced, "string")(F.col("id"))
    frame = spark.range(rows, numPartitions=2).select(row.alias("key"), row.alias("value"))
    started = time.monotonic()
    (
        frame.write.format(SHORT_NAME)
        .option("topic", topic)
        .option("bootstrap", bootstrap)
        .option("agentWaitSeconds", "60")
        .option("kafka.message.timeout.ms", "3000")
        .mode("append")
        .save()
    )
    print(json.dumps({"rows": rows, "seconds": round(time.monotonic() - started, 1)}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
