"""Spark-on-Kubernetes pod templates, Spark conf helpers and the durable-kafka data source."""
