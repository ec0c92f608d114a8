"""When the sender asks for the cluster's metadata again, and when it holds back.

A refresh that fails or leaves a partition with frames without a leader holds the next wanted
one back (Kafka down, a topic missing: otherwise every pass of the loop asked again at once);
a complete one does not. The cluster client here is a stand-in for its metadata side only
(``refresh`` answering when the test says, and the leaders it learned): what is tested is the
sender's decision around it, with no broker involved; the forwarder against Apache Kafka is
tested in tests/integration/buffer_agent/forward/test_forwarder.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue
from durable_producer.buffer_agent.forward.sender import Sender
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import sender_for

BATCH = build_batch([SampleRecord(None, b"v", 1000)])


class GatedMetadata:
    """Answers a refresh when ``gate`` is set: every topic asked for, one partition, led by
    node 1."""

    def __init__(self) -> None:
        self.leaders: dict[tuple[str, int], int] = {}
        self.topic_errors: dict[str, int] = {}
        self.partition_counts: dict[str, int] = {}
        self.topic_ids: dict[str, str] = {}
        self.asked: list[set[str]] = []
        self.gate = asyncio.Event()

    async def refresh(self, topics: set[str]) -> None:
        self.asked.append(set(topics))
        await self.gate.wait()
        for topic in topics:
            self.leaders[(topic, 0)] = 1
            self.partition_counts[topic] = 1


def queue_with_a_frame(topic: str) -> PartitionQueue:
    queue = PartitionQueue((topic, 0), -1, 0, 0)  # no producer id yet: nothing is sent
    queue.add(0, BATCH, 1, 0, 0, False)
    return queue


async def refreshed_without_a_leader() -> tuple[GatedMetadata, Sender]:
    """A sender whose first refresh is answered, and leaves its partition ("gone", 3), which
    holds a frame, without a leader."""
    client = GatedMetadata()
    client.gate.set()
    queues = {("gone", 3): PartitionQueue(("gone", 3), -1, 0, 0)}
    queues[("gone", 3)].add(0, BATCH, 1, 0, 0, False)
    sender = sender_for(client, queues)
    sender.maintain(asyncio.get_running_loop().time())
    await asyncio.sleep(0.01)  # answered at once
    return client, sender


def test_a_topic_met_during_a_refresh_is_asked_for_at_once_after_it() -> None:
    """Seen in review: a topic whose first frame came while a refresh for others was out had
    no leader when it ended, which counted the refresh as a miss: its frames waited out the
    backoff (doubling with every such refresh)."""

    async def scenario() -> list[set[str]]:
        client = GatedMetadata()
        queues = {("a", 0): queue_with_a_frame("a")}
        sender = sender_for(client, queues)
        loop = asyncio.get_running_loop()
        sender.maintain(loop.time())  # the first refresh: for "a"
        await asyncio.sleep(0)
        queues[("b", 0)] = queue_with_a_frame("b")  # read while it is out
        client.gate.set()
        while sender.refreshing:
            await asyncio.sleep(0.001)
        sender.pump(loop.time())  # "b" has no leader: a refresh is wanted
        sender.maintain(loop.time())
        await asyncio.sleep(0.01)
        sender.close()
        return client.asked

    assert asyncio.run(scenario()) == [{"a"}, {"a", "b"}]


def test_a_refresh_that_leaves_a_partition_without_a_leader_holds_the_next_back() -> None:
    async def scenario() -> tuple[int, int]:
        client, sender = await refreshed_without_a_leader()
        loop = asyncio.get_running_loop()
        asked_once = len(client.asked)
        for _ in range(50):  # passes of the loop: partition 3 still has no leader
            sender.pump(loop.time())
            sender.maintain(loop.time())
            await asyncio.sleep(0.001)
        sender.close()
        return asked_once, len(client.asked)

    assert asyncio.run(scenario()) == (1, 1)


def test_the_loop_wakes_when_a_held_back_refresh_is_due() -> None:
    """The forwarder's loop sleeps ``until_due``: it left out the wanted refresh held back, so
    the refresh that could find a moved leader waited for the next frame, answer or idle
    tick (up to 50 ms more on every leader move). Now the wait ends when ``maintain`` would
    start it, and not before."""

    async def scenario() -> tuple[float, int, int]:
        client, sender = await refreshed_without_a_leader()
        loop = asyncio.get_running_loop()
        now = loop.time()
        sender.pump(now)  # a refresh is wanted, held back
        wait = sender.until_due(now, 60.0)
        sender.maintain(now + wait - 0.001)
        await asyncio.sleep(0)
        before = len(client.asked)
        sender.maintain(now + wait)
        await asyncio.sleep(0.01)
        sender.close()
        return wait, before, len(client.asked)

    wait, before, after = asyncio.run(scenario())
    assert 0 < wait < 60.0
    assert (before, after) == (1, 2)


class BrokenMetadata(GatedMetadata):
    """A refresh that fails with an error nothing expects."""

    async def refresh(self, topics: set[str]) -> None:
        raise RuntimeError("metadata answer that cannot be read")


def test_a_refresh_that_fails_unexpectedly_is_logged_and_asked_for_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen in review: the refresh's task only woke the loop, so its error was never logged
    (asyncio's "exception was never retrieved" at best), though the code said it was."""

    async def scenario() -> bool:
        queue = queue_with_a_frame("a")
        queue.refresh_first = True  # a batch's answer never came
        sender = sender_for(BrokenMetadata(), {("a", 0): queue})
        sender.maintain(asyncio.get_running_loop().time())
        await asyncio.sleep(0.01)
        sender.close()
        return sender._refresh_wanted

    with caplog.at_level(logging.ERROR):
        wanted_again = asyncio.run(scenario())
    assert wanted_again
    assert any(
        "RuntimeError: metadata answer that cannot be read" in record.getMessage()
        for record in caplog.records
    )
