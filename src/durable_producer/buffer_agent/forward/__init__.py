"""Forwarding: WAL -> decoded records -> an idempotent Kafka producer -> the cluster."""
