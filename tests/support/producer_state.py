"""A broker's state of the forwarder's idempotent producer, seen and set from outside the agent.

- ``FORGETFUL_PROPERTIES``: a broker that forgets an idle producer after
  ``EXPIRATION_MS`` (checked every 0.5 s), the ``forgetful_broker`` fixture's;
- ``knows_producer``: whether a partition's leader holds sequences of a producer
  (DescribeProducers);
- ``produce_as``: a batch written with the forwarder's producer id, epoch and sequence, as a
  batch of its in flight would land.
"""

from __future__ import annotations

import asyncio
import socket

from durable_producer.buffer_agent.kafka.batch_stamp import stamp
from durable_producer.buffer_agent.kafka.cluster_client import ClusterClient
from durable_producer.buffer_agent.kafka.connection import Security
from durable_producer.buffer_agent.kafka.protocol import API_PRODUCE
from support.kafka_wire import encode_request, produce_body, recv_exactly

EXPIRATION_MS = 3000
FORGETFUL_PROPERTIES = {
    "producer.id.expiration.ms": str(EXPIRATION_MS),
    "producer.id.expiration.check.interval.ms": "500",
}


def knows_producer(address: str, topic: str, producer_id: int) -> bool:
    """Partition 0's leader (reached at ``address``) holds sequences of ``producer_id``."""

    async def ask() -> bool:
        client = ClusterClient(address, Security(), timeout_s=10.0)
        try:
            await client.refresh({topic})
            leader = client.leaders[(topic, 0)]
            found = await client.describe_producers(leader, topic, [0], producer_id)
            return found.get(0) is not None
        finally:
            client.close()

    return asyncio.run(ask())


def produce_as(
    address: str, topic: str, batch: bytes, producer_id: int, epoch: int, sequence: int
) -> None:
    """Write ``batch`` to partition 0 of ``topic`` at ``address`` (its leader) with this
    producer id, epoch and base sequence (Produce v9, acks=all). The answer is read, not
    judged: look at the stored batches."""
    records = b"".join(bytes(part) for part in stamp(batch, producer_id, epoch, sequence))
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode_request(API_PRODUCE, 9, 1, produce_body(topic, 0, records)))
        size = int.from_bytes(recv_exactly(sock, 4), "big")
        recv_exactly(sock, size)
