"""Ingest: the Kafka-protocol listener that validates produce requests into the WAL."""
