"""The buffer agent: Kafka-protocol listener -> write-ahead log -> forwarder -> Kafka."""
