"""Any sequence of appends, reads, checkpoints and reopens returns exactly the frames appended and
not yet checkpointed, in order."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from durable_producer.buffer_agent.wal import AppendItem, WalReader, WriteAheadLog
from support.wal_helpers import SMALL

CONFIG = replace(SMALL, segment_bytes=4096, max_frame_bytes=2048, max_bytes=1 << 24)

frames_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "orders", "ünïcode-topic"]),
        st.integers(0, 7),
        st.binary(max_size=1500),
    ),
    min_size=1,
    max_size=5,
)


class WalModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="wal-model-"))
        self.wal = WriteAheadLog.open(self.directory, CONFIG)
        self.model: dict[int, tuple[str, int, bytes]] = {}
        self.checkpoint = 0
        self.reader: WalReader | None = None
        self.reader_next = 0

    @rule(frames=frames_strategy)
    def append(self, frames: list[tuple[str, int, bytes]]) -> None:
        items = [AppendItem(topic, partition, payload) for topic, partition, payload in frames]
        offsets = (
            self.wal.append_many(items)
            if len(items) > 1
            else [self.wal.append(items[0].topic, items[0].partition, bytes(items[0].payload))]
        )
        expected_start = max(self.model, default=self.checkpoint - 1) + 1
        assert offsets == list(range(expected_start, expected_start + len(items)))
        for offset, frame in zip(offsets, frames, strict=True):
            self.model[offset] = frame

    @rule(data=st.data())
    def checkpoint_somewhere(self, data: st.DataObject) -> None:
        upper = self.wal.next_offset if self.reader is None else self.reader_next
        offset = data.draw(st.integers(min_value=self.checkpoint, max_value=upper))
        self.wal.checkpoint(offset)
        self.checkpoint = offset
        self.model = {o: f for o, f in self.model.items() if o >= offset}

    @rule()
    def reopen(self) -> None:
        self.close_reader()
        self.wal.close()
        self.wal = WriteAheadLog.open(self.directory, CONFIG)
        assert self.wal.checkpoint_offset == self.checkpoint

    @rule()
    def start_tail_reader(self) -> None:
        """A reader from the checkpoint, like the forwarder's; it never checkpoints past it."""
        self.close_reader()
        self.reader = self.wal.reader()
        self.reader_next = self.checkpoint

    @precondition(lambda self: self.reader is not None)
    @rule(count=st.integers(1, 6))
    def read_some(self, count: int) -> None:
        assert self.reader is not None
        expected = sorted(o for o in self.model if o >= self.reader_next)[:count]
        frames = self.reader.poll(count)
        assert [frame.offset for frame in frames] == expected
        for frame in frames:
            assert (frame.topic, frame.partition, frame.payload) == self.model[frame.offset]
        if frames:
            self.reader_next = frames[-1].offset + 1

    @invariant()
    def fresh_reader_sees_exactly_the_model(self) -> None:
        with self.wal.reader() as reader:
            frames = reader.poll(100_000)
        assert [f.offset for f in frames] == sorted(self.model)
        for frame in frames:
            assert (frame.topic, frame.partition, frame.payload) == self.model[frame.offset]

    def close_reader(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def teardown(self) -> None:
        self.close_reader()
        self.wal.close()
        shutil.rmtree(self.directory, ignore_errors=True)


WalModel.TestCase.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
TestWalModel = WalModel.TestCase
