"""When the sent mark moves: before a request's bytes reach a connected broker, not before.

The mark on the volume (``on_sending``, the forwarder's hint and identity) tells a restart
which frames Kafka may hold already. It moved when a round of requests was handed to the
sender, also when the leader refused the connection: a probe against Apache Kafka (backlog
while Kafka was cut, kill -9, restart into a new epoch) counted 2,000-10,000 records a
restart as possible duplicates against 0-22 stored twice. The cluster client here is a
stand-in that refuses, opens or already holds a connection; what is tested is when the
sender tells the mark, with no broker involved.
"""

from __future__ import annotations

import asyncio

from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue
from durable_producer.buffer_agent.kafka.connection import BrokerUnreachable
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import sender_for

KEY = ("t", 0)
BATCH = build_batch([SampleRecord(None, b"v", 1000)])


class Connection:
    """Records the marks told before its request, then loses the connection (the batch's
    fate unknown: enough to end the request)."""

    def __init__(self, marks: list[int]) -> None:
        self.marks = marks
        self.seen_at_request: list[int] | None = None

    def version(self, *_: int) -> int:
        return 9

    async def request(self, *_: object) -> bytes:
        self.seen_at_request = list(self.marks)
        raise OSError("connection reset by peer")


class Cluster:
    """Node 1 leads ``KEY``. ``state`` is "refused" (every connection refused), "connecting"
    (none open, one opened on demand) or "connected" (one open already)."""

    def __init__(self, state: str, marks: list[int]) -> None:
        self.leaders = {KEY: 1}
        self.topic_errors: dict[str, int] = {}
        self.partition_counts = {"t": 1}
        self.topic_ids: dict[str, str] = {}
        self.state = state
        self.opened = Connection(marks)

    def open_connection(self, node: int) -> Connection | None:
        return self.opened if self.state == "connected" else None

    async def connection(self, node: int) -> Connection:
        if self.state == "refused":
            raise BrokerUnreachable("broker 1 at 127.0.0.1:9: connection refused")
        return self.opened

    async def refresh(self, topics: set[str]) -> None:
        return None


def sent(state: str) -> tuple[list[int], list[int] | None, bool]:
    """Frames 40 and 41 of ``KEY`` pumped to a leader in ``state``: (the marks told, those
    told when the request went out, whether the batch's fate is unknown)."""
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.add(40, BATCH, 1, 0, 0, False)
    queue.add(41, BATCH, 1, 0, 0, False)
    marks: list[int] = []

    async def scenario() -> Cluster:
        cluster = Cluster(state, marks)
        sender = sender_for(cluster, {KEY: queue}, on_sending=marks.append)
        sender.pump(asyncio.get_running_loop().time())
        for _ in range(5):
            await asyncio.sleep(0)
        sender.close()
        return cluster

    cluster = asyncio.run(scenario())
    return marks, cluster.opened.seen_at_request, queue.refresh_first  # set by an unknown fate


def test_a_refused_connection_moves_no_mark() -> None:
    """Nothing reached Kafka: a restart must not count these frames as possibly sent."""
    marks, at_request, unknown = sent("refused")
    assert marks == []
    assert at_request is None
    assert not unknown


def test_a_request_that_connects_first_moves_the_mark_before_it_goes() -> None:
    marks, at_request, unknown = sent("connecting")
    assert marks == [42]
    assert at_request == [42]
    assert unknown


def test_a_round_to_a_connected_broker_moves_the_mark_before_its_tasks_run() -> None:
    marks, at_request, unknown = sent("connected")
    assert marks[0] == 42
    assert at_request is not None and at_request[0] == 42
    assert unknown
