"""An answer that does not decode is a lost answer, as a dropped connection is: a Produce
answer's batch goes again (the partition does not stall), and the resolution's
DescribeProducers is asked again after its backoff.

Before, the decoding error escaped the request's task: its batch stayed in flight for good,
and nothing more of the partition was sent until a restart. A real broker does not answer
bytes that do not decode (a version's bug, a proxy in the way might): the connection here is
a stand-in that answers such bytes, with no broker.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from durable_producer.buffer_agent.forward.partition_queue import UNKNOWN, PartitionQueue
from durable_producer.buffer_agent.kafka.cluster_client import ClusterClient
from durable_producer.buffer_agent.kafka.connection import BrokerConnection, UndecodableAnswer
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import OneLeader, sender_for

KEY = ("t", 0)
BATCH = build_batch([SampleRecord(None, b"v", 1000)])


class Garbled:
    """Answers every request with bytes that are no Produce answer."""

    address = "127.0.0.1:9"
    closed = False

    def version(self, api_key: int, *_: int) -> int:
        return 9 if api_key == 0 else 0

    async def request(self, *_: object) -> bytes:
        return b"\xff\xff\xff"

    def close(self) -> None:
        self.closed = True


class Cluster(OneLeader):
    def __init__(self) -> None:
        super().__init__()
        self.opened = Garbled()

    def open_connection(self, node: int) -> Garbled:
        return self.opened

    async def connection(self, node: int) -> Garbled:
        return self.opened


def test_an_answer_that_does_not_decode_leaves_the_batch_to_go_again() -> None:
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.add(40, BATCH, 1, 0, 0, False)
    errors: list[tuple[str, str]] = []

    async def scenario() -> Cluster:
        cluster = Cluster()
        sender = sender_for(
            cluster, {KEY: queue}, on_error=lambda kind, _, __, text: errors.append((kind, text))
        )
        sender.pump(asyncio.get_running_loop().time())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not sender.busy, "the request's task ended"
        sender.close()
        return cluster

    cluster = asyncio.run(scenario())
    assert queue.in_flight == 0, "no batch left in flight for good"
    assert not queue.halted and queue.refresh_first, "sent again after a metadata refresh"
    assert [frame[UNKNOWN] for frame in queue.batches[0].frames] == [True], "a copy may be in Kafka"
    assert cluster.opened.closed
    assert errors and errors[0][0] == "transport"
    assert "answer (API 0 v9) does not decode" in errors[0][1]


def test_a_describe_producers_answer_that_does_not_decode_is_a_lost_answer() -> None:
    """The resolution catches OSErrors (it asks again after a backoff); a decoding error
    escaped it, and with ``resolve`` still set it was asked again at once, pass after pass."""
    client = ClusterClient("127.0.0.1:9")
    connection = Garbled()
    client._connections[1] = cast(BrokerConnection, connection)

    async def ask() -> None:
        await client.describe_producers(1, "t", [0], 7)

    with pytest.raises(UndecodableAnswer, match=r"answer \(API 61 v0\) does not decode"):
        asyncio.run(ask())
    assert connection.closed


class NullAnswer(Garbled):
    """A Produce v9 answer that kio reads, with a null list of topics where Kafka never
    sends one (``_answers`` then raises TypeError, no OSError)."""

    async def request(self, *_: object) -> bytes:
        return b"\x00" + b"\x00\x00\x00\x00" + b"\x00"  # responses null, throttle 0, no tags


def test_an_answer_that_reads_but_makes_no_sense_leaves_the_batch_to_go_again() -> None:
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.add(40, BATCH, 1, 0, 0, False)
    cluster = Cluster()
    cluster.opened = NullAnswer()

    async def scenario() -> None:
        sender = sender_for(cluster, {KEY: queue})
        sender.pump(asyncio.get_running_loop().time())
        for _ in range(5):
            await asyncio.sleep(0)
        sender.close()

    asyncio.run(scenario())
    assert queue.in_flight == 0 and queue.refresh_first, "sent again after a refresh"
    assert cluster.opened.closed
