"""Partition counts from the real cluster, for the agent's Metadata answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from durable_producer.buffer_agent.ingest.metadata import MetadataSource


def cluster_metadata_source(
    client_config: Mapping[str, Any], timeout_s: float = 5.0
) -> MetadataSource:
    """A ``MetadataSource`` asking the cluster with one long-lived AdminClient."""
    admin = AdminClient(dict(client_config))

    def partition_counts(topics: Sequence[str]) -> Mapping[str, int]:
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as error:
            raise ConnectionError(f"Kafka cluster unreachable: {error}") from error
        wanted = set(topics) if topics else None
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and (wanted is None or name in wanted)
        }

    return partition_counts
