"""Example batch job for examples/sparkapplication-batch.yaml: 1M rows to Kafka via the agents.

Each executor writes to the buffer agent in its own pod (address from the pod's
DURABLE_PRODUCER_BOOTSTRAP, set by the DurableProducer's pod template); a task succeeds once
the agent has its rows in its write-ahead log. Usage: write_events.py TOPIC [ROWS]
"""

import sys

from pyspark.sql import SparkSession

from durable_producer.spark_integration import register

topic = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
spark = SparkSession.builder.appName("write-events").getOrCreate()
register(spark)
(
    spark.range(rows)
    .selectExpr("CAST(id % 1000 AS STRING) AS key", "to_json(struct(*)) AS value")
    .write.format("durable-kafka")
    .option("topic", topic)
    .mode("append")
    .save()
)
spark.stop()
