"""Partition counts from the real cluster, for the agent's Metadata answers.

The result is a plain function ``topics -> {topic: partition count}``; it fits, by its shape
alone, the ``MetadataSource`` the listener's metadata cache asks (so this layer needs nothing
from the listener).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from durable_producer.buffer_agent.kafka.client_log import CLIENT_LOGGER, ClientLog

PartitionCounts = Callable[[Sequence[str]], Mapping[str, int]]
"""Partition counts of those of the given topics that exist (all topics if none are given)."""


def cluster_metadata_source(
    client_config: Mapping[str, Any], timeout_s: float = 5.0
) -> PartitionCounts:
    """Ask the cluster with one long-lived AdminClient; ConnectionError when unreachable.
    Its log lines go through ``client_log`` (one line per spell of connection failures)."""
    client_log = ClientLog(logging.getLogger(CLIENT_LOGGER), "metadata")
    settings: dict[str, Any] = {"logger": client_log, **client_config}
    admin = AdminClient(settings)

    def partition_counts(topics: Sequence[str]) -> Mapping[str, int]:
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as error:
            raise ConnectionError(f"Kafka cluster unreachable: {error}") from error
        finally:
            admin.poll(0)  # serves the client's log lines
        client_log.recovered()
        wanted = set(topics) if topics else None
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and (wanted is None or name in wanted)
        }

    return partition_counts
