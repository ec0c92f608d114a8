"""A ``Sender`` over a stand-in cluster client, for unit tests of the sender's decisions.

The stand-in implements only what the test drives (metadata, DescribeProducers,
DescribeConfigs); what is tested is the sender's decision around it, with no broker. The
forwarder against Apache Kafka is tested in tests/integration/buffer_agent/forward/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue, Pending
from durable_producer.buffer_agent.forward.sender import Sender
from durable_producer.buffer_agent.kafka.cluster_client import ClusterClient


class OneLeader:
    """A stand-in cluster client: node 1 leads partition 0 of topic ``t``; a refresh finds
    the topic's id ``topic_id`` ("" none)."""

    def __init__(self, topic_id: str = "") -> None:
        self.leaders = {("t", 0): 1}
        self.topic_errors: dict[str, int] = {}
        self.partition_counts = {"t": 1}
        self.topic_ids: dict[str, str] = {"t": topic_id} if topic_id else {}

    async def refresh(self, topics: set[str]) -> None:
        return None


def sender_for(
    client: object,
    queues: dict[tuple[str, int], PartitionQueue],
    *,
    on_new_identity: Callable[[PartitionQueue, list[Pending]], None] | None = None,
    on_topic_max_bytes: Callable[[str, int], None] | None = None,
    on_error: Callable[[str, int, str, str], None] | None = None,
    on_gap: Callable[[PartitionQueue], None] | None = None,
    on_sending: Callable[[int], None] | None = None,
) -> Sender:
    """A sender over ``client`` with long backoffs (a decision held back shows); answers,
    errors and new identities ignored unless their hooks are given."""

    async def no_producer_id() -> tuple[int, int]:
        raise AssertionError("not asked for here")

    def ignore(*_: Any) -> None:
        return None

    return Sender(
        cast(ClusterClient, client),
        queues,
        ForwarderConfig(
            request_timeout_s=5.0,
            retry_backoff_s=2.0,
            retry_backoff_max_s=4.0,
            metadata_interval_s=60.0,
            max_merge_bytes=1 << 20,
        ),
        on_acked=ignore,
        on_error=on_error or ignore,
        on_new_identity=on_new_identity or ignore,
        new_producer_id=no_producer_id,
        topic_max_bytes=None,
        on_topic_max_bytes=on_topic_max_bytes,
        on_gap=on_gap or ignore,
        on_sending=on_sending or ignore,
    )
