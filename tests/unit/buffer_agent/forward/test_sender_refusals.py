"""What the sender does when Kafka refuses batches for what they are, one after another.

A topic's ``max.message.bytes`` lowered under a backlog refuses many batches in a row, and
the agent's cached limit (``ingest/metadata``) is stale for up to a minute. Against Apache
Kafka (tests/integration/buffer_agent/forward/test_limit_lowered.py) that once made the
forwarder send the same merged batch of small client batches again at once, thousands of
times a second, for ever, and made each refused client batch wait a dead-letter window of its
own. The stand-in client here answers DescribeConfigs only: what is tested is the sender's
decision around the refusal.
"""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue
from durable_producer.buffer_agent.forward.sender import MAX_BYTES_MARGIN, Sender
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import sender_for

KEY = ("t", 0)
SMALL = build_batch([SampleRecord(None, b"x" * 250, 1000)])
"""A linger-0 client's batch: one record, about 320 bytes."""
TOO_LARGE = int(ErrorCode.message_too_large)
CORRUPT = int(ErrorCode.corrupt_message)
INVALID_RECORD = int(ErrorCode.invalid_record)
WINDOW_S = 20.0


class DescribingConfigs:
    """Node 1 leads ``KEY``; DescribeConfigs says ``limit`` (None: not described)."""

    def __init__(self, limit: int | None) -> None:
        self.leaders = {KEY: 1}
        self.topic_ids: dict[str, str] = {}
        self.limit = limit
        self.asked: list[list[str]] = []

    async def max_message_bytes(self, topics: list[str]) -> dict[str, int]:
        self.asked.append(list(topics))
        return {} if self.limit is None else dict.fromkeys(topics, self.limit)


def queue_of(frames: int) -> PartitionQueue:
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True  # the leader took a batch of this identity: five in flight
    for offset in range(frames):
        queue.add(offset, SMALL, 1, 0, 0, False)
    return queue


def refused_once(
    limit: int | None, frames: int = 40, code: int = TOO_LARGE
) -> tuple[PartitionQueue, Sender, DescribingConfigs, list[tuple[str, int]], int]:
    """``frames`` small client batches merged into one batch, which is refused with ``code``;
    (the queue, the sender, its client, what ``on_topic_max_bytes`` heard, the frames of the
    next batch the queue takes)."""
    client = DescribingConfigs(limit)
    queue = queue_of(frames)
    heard: list[tuple[str, int]] = []
    taken = 0

    async def scenario() -> Sender:
        nonlocal taken
        sender = sender_for(client, {KEY: queue}, on_topic_max_bytes=lambda *a: heard.append(a))
        now = asyncio.get_running_loop().time()
        merged = queue.next_batch(now, sender._max_bytes("t"))
        assert merged is not None and len(merged.frames) == frames
        sender._answered(queue, merged, code, None, now)
        await asyncio.sleep(0.01)  # the DescribeConfigs task, answered at once
        following = queue.next_batch(now + 10, sender._max_bytes("t"))  # after any backoff
        assert following is not None
        taken = len(following.frames)
        sender.close()
        return sender

    sender = asyncio.run(scenario())
    return queue, sender, client, heard, taken


def test_a_merged_batch_too_large_that_merging_less_would_not_split_goes_batch_by_batch() -> None:
    """40 client batches, 13 kB merged: below the smallest merge, so halving the merges would
    send the same batch again. Each client batch goes alone instead (and the topic's limit is
    asked; here it is not described)."""
    queue, _, client, heard, taken = refused_once(limit=None)
    assert taken == 1, f"the next batch merged {taken} client batches again"
    assert queue.isolate
    assert client.asked == [["t"]] and heard == []


def test_a_refusal_as_too_large_asks_the_topic_limit_and_merges_keep_within_it() -> None:
    _, sender, client, heard, _ = refused_once(limit=2000)
    assert client.asked == [["t"]]
    assert heard == [("t", 2000)], "the ingest hears the limit (it refuses larger batches)"
    assert sender._max_bytes("t") == 2000 - MAX_BYTES_MARGIN


def test_a_refusal_answered_after_the_limit_was_described_keeps_that_limit() -> None:
    """Two partitions' merged batches went out before the topic's limit was known; the second
    refusal comes after DescribeConfigs said 2000: merges stay within it (halving the 38 kB
    batch would have raised them to 16 kB, refused again)."""
    client = DescribingConfigs(2000)
    first, second = queue_of(120), PartitionQueue(("t", 1), 7, 0, 0)
    for offset in range(120, 240):
        second.add(offset, SMALL, 1, 0, 0, False)
    second.confirmed = True

    async def scenario() -> None:
        sender = sender_for(client, {KEY: first, ("t", 1): second})
        now = asyncio.get_running_loop().time()
        one, other = first.next_batch(now, 10**6), second.next_batch(now, 10**6)
        assert one is not None and other is not None and len(other.frames) == 120
        sender._answered(first, one, TOO_LARGE, None, now)
        await asyncio.sleep(0.01)
        assert sender._max_bytes("t") == 2000 - MAX_BYTES_MARGIN
        sender._answered(second, other, TOO_LARGE, None, now)
        assert sender._max_bytes("t") == 2000 - MAX_BYTES_MARGIN
        following = second.next_batch(now, sender._max_bytes("t"))
        assert following is not None and following.size <= 2000 - MAX_BYTES_MARGIN
        sender.close()

    asyncio.run(scenario())


def test_a_batch_merged_before_the_limit_was_described_is_merged_again_within_it() -> None:
    """DescribeConfigs said 100,000; a 128 kB merged batch sent before is refused: merged
    again within the limit (halving it would have merged at 50 kB, and again at each such
    refusal)."""
    client = DescribingConfigs(100_000)
    first, second = queue_of(2), PartitionQueue(("t", 1), 7, 0, 0)
    for offset in range(2, 402):
        second.add(offset, SMALL, 1, 0, 0, False)

    async def scenario() -> None:
        sender = sender_for(client, {KEY: first, ("t", 1): second})
        now = asyncio.get_running_loop().time()
        one, other = first.next_batch(now, 10**6), second.next_batch(now, 10**6)
        assert one is not None and other is not None and other.size > 100_000
        sender._answered(first, one, TOO_LARGE, None, now)
        await asyncio.sleep(0.01)
        sender._answered(second, other, TOO_LARGE, None, now)
        assert sender._max_bytes("t") == 100_000 - MAX_BYTES_MARGIN
        assert second.rebatch
        sender.close()

    asyncio.run(scenario())


def test_a_merged_batch_refused_is_not_dead_lettered_before_it_is_split() -> None:
    """A merged batch refused for a fault of its own right after a dead letter for the same,
    while its partition could not send (leader unknown, throttled, requests full): the batch
    at fault is not known yet, so nothing is dead-lettered; once split, the first client
    batch is tried alone."""
    queue = queue_of(10)
    queue.lettered = (INVALID_RECORD, 100.0)

    async def scenario() -> Sender:
        sender = sender_for(DescribingConfigs(None), {KEY: queue})
        merged = queue.next_batch(101.0, 10**6)
        assert merged is not None and len(merged.frames) == 10
        sender._answered(queue, merged, INVALID_RECORD, None, 101.0)
        sender.close()
        return sender

    sender = asyncio.run(scenario())
    assert queue.isolate and len(queue.batches[0].frames) == 10  # not split until sent again
    assert not sender.refused_for_good(queue, 101.0, WINDOW_S)
    assert not sender.refused_for_good(queue, 101.0 + WINDOW_S, WINDOW_S)


def test_a_single_client_batch_too_large_asks_the_topic_limit_too() -> None:
    """The ingest let it in on a stale limit: it hears the real one."""
    queue, _, client, heard, taken = refused_once(limit=900, frames=1)
    assert client.asked == [["t"]] and heard == [("t", 900)]
    assert taken == 1 and not queue.isolate  # retried after its backoff, as any refusal is


def test_a_merged_batch_refused_for_another_reason_asks_nothing() -> None:
    queue, _, client, heard, taken = refused_once(limit=2000, code=CORRUPT)
    assert client.asked == [] and heard == []
    assert taken == 1 and queue.isolate


def test_refusals_in_a_row_ask_the_limit_at_most_once_a_second() -> None:
    client = DescribingConfigs(2000)
    queue = queue_of(3)
    queue.isolate = True

    async def scenario() -> None:
        sender = sender_for(client, {KEY: queue})
        now = asyncio.get_running_loop().time()
        for _ in range(3):
            batch = queue.next_batch(now, 10**6)
            assert batch is not None
            sender._answered(queue, batch, TOO_LARGE, None, now)
            queue.ready_at = now
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        sender.close()

    asyncio.run(scenario())
    assert client.asked == [["t"]]


def refused_head(queue: PartitionQueue, now: float, code: int = TOO_LARGE) -> None:
    batch = queue.next_batch(now, 10**6)
    assert batch is not None and len(batch.frames) == 1
    queue.failed(batch, code, now)


def succeeded_head(queue: PartitionQueue, now: float) -> None:
    batch = queue.next_batch(now, 10**6)
    assert batch is not None
    queue.succeeded(batch)


def one_by_one(frames: int) -> tuple[PartitionQueue, Sender]:
    queue = queue_of(frames)
    queue.isolate = True
    return queue, sender_for(DescribingConfigs(None), {KEY: queue})


def test_the_next_batch_refused_alike_after_a_dead_letter_waits_no_window_of_its_own() -> None:
    """Client batches too large for the topic between others that fit: the first waits
    ``dead_letter_after_s``; each next one, refused the same way once tried, goes at once."""
    queue, sender = one_by_one(4)
    refused_head(queue, 100.0)
    assert not sender.refused_for_good(queue, 100.0 + WINDOW_S - 1, WINDOW_S)
    assert sender.refused_for_good(queue, 100.0 + WINDOW_S, WINDOW_S)
    queue.drop_heads(1, TOO_LARGE, 100.0 + WINDOW_S)  # dead-lettered
    assert not sender.refused_for_good(queue, 100.0 + WINDOW_S, WINDOW_S), "not tried yet"
    assert queue.last_error == 0, "the next batch is not counted as refused before it is"
    assert queue.ready_at == 100.0 + WINDOW_S, "the next frames go at once: no backoff"
    succeeded_head(queue, 121.0)  # a batch that fits
    refused_head(queue, 122.0)
    assert sender.refused_for_good(queue, 122.0, WINDOW_S)


def test_a_batch_refused_for_another_fault_or_long_after_waits_its_window() -> None:
    queue, sender = one_by_one(4)
    queue.lettered = (TOO_LARGE, 100.0)
    refused_head(queue, 101.0, CORRUPT)  # another fault: its own window
    assert not sender.refused_for_good(queue, 101.0 + WINDOW_S - 1, WINDOW_S)
    queue, sender = one_by_one(4)
    queue.lettered = (TOO_LARGE, 100.0)
    refused_head(queue, 100.0 + WINDOW_S)  # the same fault, a window after the last letter
    assert not sender.refused_for_good(queue, 100.0 + WINDOW_S, WINDOW_S)
    assert sender.refused_for_good(queue, 100.0 + 2 * WINDOW_S, WINDOW_S)


def test_batches_refused_for_the_partition_or_the_principal_each_wait_the_window() -> None:
    """TOPIC_AUTHORIZATION_FAILED refuses every batch alike: one dead letter a window, so an
    ACL fixed late leaves the backlog waiting, not all of it dead-lettered."""
    denied = int(ErrorCode.topic_authorization_failed)
    queue, sender = one_by_one(3)
    queue.lettered = (denied, 100.0)
    refused_head(queue, 101.0, denied)
    assert not sender.refused_for_good(queue, 101.0, WINDOW_S)
    assert sender.refused_for_good(queue, 101.0 + WINDOW_S, WINDOW_S)


def test_a_refused_head_is_judged_by_its_own_answer_not_by_those_behind_it() -> None:
    """Five client batches in flight, the first too large: the broker answers the four
    behind it OUT_OF_ORDER_SEQUENCE_NUMBER (it never appended the first). The partition is
    refused for what its first batch is; the answers behind it once made the partition look
    out of order for ever (in its state and metrics too), and its too-large batch was never
    dead-lettered."""
    out_of_order = int(ErrorCode.out_of_order_sequence_number)
    queue = queue_of(5)
    queue.isolate = True
    reported: list[str] = []
    sender = sender_for(
        DescribingConfigs(None), {KEY: queue}, on_error=lambda *error: reported.append(error[2])
    )

    async def scenario() -> None:
        now = 100.0
        for _ in range(2):  # a second round: the rewound batches go out again alike
            sent = [queue.next_batch(now, 10**6) for _ in range(5)]
            assert all(batch is not None for batch in sent)
            for index, batch in enumerate(sent):
                assert batch is not None
                sender._answered(queue, batch, TOO_LARGE if index == 0 else out_of_order, None, now)
            now = queue.ready_at
        sender.close()

    asyncio.run(scenario())
    assert queue.last_error == TOO_LARGE
    assert sender.refused_for_good(queue, 100.0 + WINDOW_S, WINDOW_S)
    assert reported == ["MESSAGE_TOO_LARGE"] * 2, "the state and metrics name the refusal"
