"""The compiled numbering of main-line frames does exactly what the Python reference does.

``partition_queue.number_frames`` numbers a run of frames into their partitions' queues in C
(``_number_frames.c``); ``number_frames_python`` is the reference, built on
``PartitionQueue.add``. Both run here on equal copies of the same queues, with real record
batches, over runs that stop where the forwarder's main line ends (an offset below
``plain_from``, a payload that is not one client batch, a partition without its queue), many
partitions (more than the C code's slots), partition numbers that are not shared ints,
topic strings that are equal but not the same object, and sequences wrapping at 2**31.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Callable, Iterable
from typing import cast
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer.buffer_agent.forward import partition_queue
from durable_producer.buffer_agent.forward.partition_queue import (
    SEQUENCE_LIMIT,
    PartitionQueue,
    Pending,
    number_all,
    number_frames,
    number_frames_python,
)
from durable_producer.buffer_agent.kafka.record_batch import sole_batch_python
from durable_producer.buffer_agent.wal import Frame
from support.batch_builder import SampleRecord, build_batch

compiled = pytest.importorskip("durable_producer.buffer_agent.forward._number_frames")

BATCHES = {
    records: build_batch([SampleRecord(None, b"v%d" % n, 1000) for n in range(records)])
    for records in (1, 2, 5)
}
TWO_BATCHES = BATCHES[1] + BATCHES[2]  # an older agent's frame of several: not one batch
GARBAGE = b"\x00" * 70
# One batch's header but not one batch as the agent stores it: the check's other refusals.
MAGIC_1 = BATCHES[1][:16] + b"\x01" + BATCHES[1][17:]
CUT_SHORT = BATCHES[2][:-1]  # its batchLength says one byte more
NEGATIVE_COUNT = BATCHES[1][:57] + b"\xff\xff\xff\xff" + BATCHES[1][61:]
HEADER_ONLY = BATCHES[1][:61]  # batchLength says more than the header
# Attributes the Pending must carry as the batch has them (the header's CRC is not the check's).
GZIP = BATCHES[2][:21] + b"\x00\x01" + BATCHES[2][23:]
ALL_BITS = BATCHES[1][:21] + b"\xff\xfe" + BATCHES[1][23:]  # a negative int16


Queues = dict[tuple[str, int], PartitionQueue]


def run_all(
    number: Callable[..., tuple[int, int, int]],
    frames: list[Frame],
    queues: Queues,
    plain_from: int,
) -> tuple[list[int], int, int]:
    """As ``Forwarder._read`` drives it (``number_all``, its runs numbered by ``number``);
    the offsets of the frames that stopped a run, which the forwarder's ``_take`` gets,
    instead of taking them."""
    stops: list[int] = []
    with patch.object(partition_queue, "number_frames", number):
        records, size = number_all(frames, queues, plain_from, lambda f: stops.append(f.offset))
    return stops, records, size


def queues_for(keys: Iterable[tuple[str, int]], start: int) -> Queues:
    return {key: PartitionQueue(key, 9, 1, start) for key in keys}


def state(queues: Queues) -> dict[tuple[str, int], tuple[int, list[object]]]:
    return {key: (queue.next_sequence, list(queue.frames)) for key, queue in queues.items()}


frame_strategy = st.tuples(
    st.sampled_from(["a", "b", "topic-c"]),
    st.sampled_from([0, 1, 2, 255, 256, 1000, 70000]),
    st.sampled_from(
        ["one", "two", "five", "several", "garbage", "magic1", "short", "negative", "header",
         "gzip", "all-bits"]
    ),
    st.booleans(),  # below plain_from
)


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(frame_strategy, max_size=60),
    start=st.sampled_from([0, 5, SEQUENCE_LIMIT - 3, SEQUENCE_LIMIT - 1]),
    missing=st.sets(st.sampled_from([("a", 0), ("b", 256), ("topic-c", 70000)]), max_size=2),
)
def test_compiled_numbering_matches_the_reference(
    specs: list[tuple[str, int, str, bool]], start: int, missing: set[tuple[str, int]]
) -> None:
    plain_from = 1_000
    frames: list[Frame] = []
    for offset, (topic, partition, kind, early) in enumerate(specs):
        payload = {
            "one": BATCHES[1], "two": BATCHES[2], "five": BATCHES[5], "several": TWO_BATCHES,
            "garbage": GARBAGE, "magic1": MAGIC_1, "short": CUT_SHORT,
            "negative": NEGATIVE_COUNT, "header": HEADER_ONLY, "gzip": GZIP, "all-bits": ALL_BITS,
        }[kind]
        at = offset + (0 if early else plain_from)
        # Topic strings made anew per frame, as across frame-scan calls: found by value.
        frames.append(Frame(at, "".join(topic), partition, payload, 1, 5_000 + offset))
    keys = {(topic, partition) for topic, partition, _, _ in specs} - missing
    reference, ours = queues_for(keys, start), queues_for(keys, start)
    # The reference asks the Python sole_batch: the compiled one shares the C code's check.
    with patch.object(partition_queue, "sole_batch", sole_batch_python):
        expected = run_all(number_frames_python, frames, reference, plain_from)
    assert run_all(number_frames, frames, ours, plain_from) == expected
    assert state(ours) == state(reference)


def test_more_partitions_than_slots_keep_their_own_numbering() -> None:
    keys = [("t", partition) for partition in range(100)]
    frames = [
        Frame(offset, "t", offset % 100, BATCHES[2], 2, 0) for offset in range(1_000)
    ]
    reference, ours = queues_for(keys, 7), queues_for(keys, 7)
    assert number_frames(frames, 0, ours, 0) == number_frames_python(frames, 0, reference, 0)
    assert state(ours) == state(reference)
    assert all(queue.next_sequence == 7 + 20 for queue in ours.values())


def test_a_pending_of_ints_and_bytes_is_left_untracked_by_the_collector() -> None:
    queues = queues_for([("t", 0)], 0)
    # The reader makes bytes payloads; a memoryview stands for any other buffer here.
    viewed_payload = cast(bytes, memoryview(BATCHES[1]))
    frames = [Frame(0, "t", 0, BATCHES[1], 1, 0), Frame(1, "t", 0, viewed_payload, 1, 0)]
    assert number_frames(frames, 0, queues, 0) == (2, 2, 2 * len(BATCHES[1]))
    plain, viewed = queues[("t", 0)].frames
    assert not gc.is_tracked(plain)  # only ints, bytes and a bool: no cycle can pass it
    assert gc.is_tracked(viewed)  # a memoryview is a container: left to the collector


class HookedFrames(deque[Pending]):
    """A queue's ``frames`` whose ``append`` runs ``hook`` first: Python code run from inside
    the compiled numbering (the forwarder's queues hold a plain deque)."""

    def __init__(self, hook: Callable[[int], None]) -> None:
        super().__init__()
        self.hook = hook
        self.calls = 0

    def append(self, pending: Pending) -> None:
        self.calls += 1
        self.hook(self.calls)
        super().append(pending)


def test_an_error_keeps_the_numbers_given_before_it() -> None:
    def failing(calls: int) -> None:
        if calls == 3:
            raise RuntimeError("boom")

    queues = queues_for([("t", 0)], 10)
    queue = queues[("t", 0)]
    queue.frames = HookedFrames(failing)
    frames = [Frame(offset, "t", 0, BATCHES[5], 5, 0) for offset in range(4)]
    with pytest.raises(RuntimeError, match="boom"):
        compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT)
    assert [frame[3] for frame in queue.frames] == [10, 15]
    assert queue.next_sequence == 20


def test_refuses_a_limit_that_is_no_limit() -> None:
    with pytest.raises(ValueError, match="sequence_limit"):
        compiled.number_sole_batches([], 0, {}, 0, 0)


def test_a_payload_that_is_no_buffer_is_a_type_error_not_a_crash() -> None:
    queues = queues_for([("t", 0)], 0)
    frames = [Frame(0, "t", 0, BATCHES[1], 1, 0), Frame(1, "t", 0, cast(bytes, 12), 1, 0)]
    with pytest.raises(TypeError):
        compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT)
    assert queues[("t", 0)].next_sequence == 1  # the first frame keeps its number


def test_the_forwarder_numbers_with_the_compiled_code_where_built() -> None:
    assert partition_queue._compiled_number_frames is compiled.number_sole_batches


# ----------------------------------------------------------------- Python code run from C
# The forwarder's own callers never change the frames or the queues while the numbering runs
# (its queues are plain, their frames a deque). These hold the C code to what Python code may
# do from inside the call anyway (an attribute or a frames' append written in Python): no
# object it uses is borrowed across such code. A crash is a segfault: run in a child.

CHILD_PRELUDE = """
from durable_producer.buffer_agent.forward import _number_frames as compiled
from durable_producer.buffer_agent.forward.partition_queue import PartitionQueue, SEQUENCE_LIMIT
from durable_producer.buffer_agent.wal import Frame
from support.batch_builder import SampleRecord, build_batch
from collections import deque
class HookedFrames(deque):  # a queue's frames whose append runs hook() first
    def __init__(self, hook):
        super().__init__()
        self.hook = hook
    def append(self, pending):
        self.hook()
        super().append(pending)
BATCH = build_batch([SampleRecord(None, b"v", 1000)])
HELD = []
def churn():  # take the freed memory: frame-sized tuples, payload-sized bytes, kept alive
    HELD.extend((-5, "u", 1, bytes(69), 0, 0) for _ in range(1_000))
    HELD.extend(bytes(69) for _ in range(1_000))
"""


def run_child(code: str) -> str:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-800:]}"
    return done.stdout.strip()


def test_frames_emptied_by_an_append_are_still_numbered_whole() -> None:
    out = run_child(
        """
        key = ("t", 0)
        queues = {key: PartitionQueue(key, 9, 1, 0)}
        frames = [Frame(0, "".join(["t"]), 0, bytes(bytearray(BATCH)), 1, 5)]
        def emptying():
            frames.clear()  # the only reference to the frame, its topic and payload
            churn()
        queues[key].frames = HookedFrames(emptying)
        print(compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT))
        print(queues[key].next_sequence, [pending[0] for pending in queues[key].frames])
        print(bytes(queues[key].frames[0][1]) == BATCH)
        """
    )
    assert out.splitlines() == ["(1, 1, 69)", "1 [0]", "True"]


def test_frames_emptied_by_a_queue_attribute_are_still_numbered_whole() -> None:
    out = run_child(
        """
        from collections import deque
        class Emptying:
            def __init__(self):
                self.next_sequence = 3
                self.held = deque()
            @property
            def frames(self):
                frames.clear()  # the only reference to the frame, its topic and payload
                churn()
                return self.held
        key = ("".join(["t"]), 0)
        queues = {key: Emptying()}
        frames = [Frame(7, "".join(["t"]), 0, bytes(bytearray(BATCH)), 1, 5)]
        print(compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT))
        (pending,) = queues[key].held
        print(pending[0], pending[3], pending[7], bytes(pending[1]) == BATCH)
        """
    )
    assert out.splitlines() == ["(1, 1, 69)", "7 3 5 True"]


def test_a_queue_dropped_by_its_own_attribute_is_not_used_after_it_is_freed() -> None:
    out = run_child(
        """
        from collections import deque
        class Dropping:
            def __init__(self):
                self.frames = deque()
                self.numbered = 0
            @property
            def next_sequence(self):
                queues.clear()  # the dict held the only reference
                churn()
                return 4
            @next_sequence.setter
            def next_sequence(self, value):
                self.numbered = value
        queues = {("t", 0): Dropping()}
        frames = [Frame(0, "t", 0, BATCH, 1, 5)]
        print(compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT))
        """
    )
    assert out == "(1, 1, 69)"


class NotedTopic(str):
    """A topic that notes, in ``freed``, at which append (of ``appends``) it was freed."""

    freed: list[int] = []
    appends = [0]

    def __del__(self) -> None:
        NotedTopic.freed.append(NotedTopic.appends[0])


def test_a_topic_let_go_mid_call_is_held_while_its_address_is_compared() -> None:
    # The slots compare topics by identity, so each slot holds its topic until the call ends:
    # a topic freed mid-call would leave its address to the next string, which would then
    # be numbered in the freed topic's queue. Frame 0 (topic-a) is let go at its append and
    # new topic-b frames are made at frame 1's; topic-a must outlive the call's last append.
    NotedTopic.freed.clear()
    NotedTopic.appends[0] = 0
    queues = queues_for([("topic-a", 0), ("topic-b", 0)], 0)
    more = 20
    frames: list[Frame | None] = [
        Frame(0, NotedTopic("topic-a"), 0, BATCHES[1], 1, 0),
        Frame(1, "topic-b", 0, BATCHES[1], 1, 0),
        *[None] * more,
    ]

    def replacing(_calls: int) -> None:
        NotedTopic.appends[0] += 1
        if NotedTopic.appends[0] == 1:  # frame 0's: the call holds it until this returns
            frames[0] = None
        elif NotedTopic.appends[0] == 2:
            for index in range(2, 2 + more):
                frames[index] = Frame(index, "".join(("topic-", "b")), 0, BATCHES[1], 1, 0)

    for queue in queues.values():
        queue.frames = HookedFrames(replacing)
    stop = compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT)
    assert NotedTopic.freed == [2 + more]  # once, after the last append: not mid-call
    assert stop == (2 + more, 2 + more, (2 + more) * len(BATCHES[1]))
    assert [pending[0] for pending in queues[("topic-a", 0)].frames] == [0]
    assert [pending[0] for pending in queues[("topic-b", 0)].frames] == list(range(1, 2 + more))


def test_a_pending_holding_a_container_stays_tracked_by_the_collector() -> None:
    appended_ms: dict[str, object] = {}  # untracked while empty, tracked once it holds one
    assert not gc.is_tracked(appended_ms)
    queues = queues_for([("t", 0)], 0)
    frames = [Frame(0, "t", 0, BATCHES[1], 1, cast(int, appended_ms))]
    compiled.number_sole_batches(frames, 0, queues, 0, SEQUENCE_LIMIT)
    (pending,) = queues[("t", 0)].frames
    assert gc.is_tracked(pending)  # as CPython keeps a tuple holding a dict: a cycle may pass
