"""Example streaming job for examples/sparkapplication-streaming.yaml: a rate source to Kafka.

Every micro-batch is written through the buffer agents; a micro-batch commits once every
row is in an agent's write-ahead log. Usage: stream_events.py TOPIC CHECKPOINT_DIR
"""

import sys

from pyspark.sql import SparkSession

from durable_producer.spark_integration import register

topic, checkpoint = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.appName("stream-events").getOrCreate()
register(spark)
query = (
    spark.readStream.format("rate")
    .option("rowsPerSecond", 1000)
    .load()
    .selectExpr("CAST(value % 1000 AS STRING) AS key", "to_json(struct(*)) AS value")
    .writeStream.format("durable-kafka")
    .option("topic", topic)
    .option("checkpointLocation", checkpoint)
    .start()
)
query.awaitTermination()
