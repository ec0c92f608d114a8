"""Forwarding: the WAL's stored client batches, as they are, to Kafka (docs/architecture.md
names each module and its job)."""
