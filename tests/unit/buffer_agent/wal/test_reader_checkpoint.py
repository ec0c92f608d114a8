"""A reader whose segment a checkpoint deletes goes on to the next segment.

The forwarder's reader often waits at the end of the newest segment. When an append then
starts a new segment and the forwarder checkpoints everything it read before it reads again,
the checkpoint lands exactly on the new segment's base offset and deletes the segment the
reader is still on. The reader must carry on with the new segment: it used to return nothing
for ever (the agent then forwarded nothing more until it was restarted).
"""

from __future__ import annotations

from durable_producer.buffer_agent.wal import WalReader, WriteAheadLog
from support.wal_helpers import payload_for


def _read_to_the_end_of_the_first_segment(wal: WriteAheadLog, reader: WalReader) -> list[int]:
    """Append and read frame by frame; stop once an append starts a second segment."""
    read: list[int] = []
    while True:
        offset = wal.append("t", 0, payload_for(len(read), 700))
        if len(wal.segment_views()) > 1:
            return read
        read += [frame.offset for frame in reader.poll()]
        assert read[-1] == offset


def test_a_reader_on_a_segment_a_checkpoint_deleted_moves_to_the_next(
    small_wal: WriteAheadLog,
) -> None:
    with small_wal.reader(0) as reader:
        read = _read_to_the_end_of_the_first_segment(small_wal, reader)
        new_base = small_wal.segment_views()[1].base_offset
        assert new_base == len(read), "the reader is at the end of the first segment"

        small_wal.checkpoint(new_base)  # everything it read is delivered
        assert [v.base_offset for v in small_wal.segment_views()] == [new_base]

        assert [frame.offset for frame in reader.poll()] == [new_base]
        later = small_wal.append("t", 0, payload_for(99, 700))
        assert [frame.offset for frame in reader.poll()] == [later]


def test_a_reader_behind_a_checkpoint_reads_the_rest_of_its_deleted_segment(
    small_wal: WriteAheadLog,
) -> None:
    """Segments deleted while open stay readable through the reader's open descriptor."""
    for index in range(30):
        small_wal.append("t", 0, payload_for(index, 700))
    with small_wal.reader(0) as reader:
        first = reader.poll(max_frames=2)
        assert [frame.offset for frame in first] == [0, 1]
        second_base = small_wal.segment_views()[1].base_offset
        small_wal.checkpoint(second_base)  # the first segment is deleted under the reader

        rest = reader.poll(max_frames=1000)
        assert [frame.offset for frame in rest] == list(range(2, 30))
        assert all(frame.payload == payload_for(frame.offset, 700) for frame in rest)


def test_bytes_after_the_last_frame_of_a_deleted_segment_are_not_read_as_frames(
    small_wal: WriteAheadLog,
) -> None:
    """A roll-back whose truncation failed can leave bytes past a segment's last frame; once
    the checkpoint has deleted the segment they are skipped, not reported as corruption."""
    for index in range(30):
        small_wal.append("t", 0, payload_for(index, 700))
    first, second = small_wal.segment_views()[:2]
    with small_wal.reader(0) as reader:
        assert [frame.offset for frame in reader.poll(max_frames=2)] == [0, 1]
        with first.path.open("ab") as segment:
            segment.write(b"\xff" * 300)
        small_wal.checkpoint(second.base_offset)

        rest = reader.poll(max_frames=1000)
        assert [frame.offset for frame in rest] == list(range(2, 30))
