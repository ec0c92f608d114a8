"""Kafka formats and clients: wire protocol, record batches, record decoding, client config."""
