"""Counting the duplicates the forwarder makes when it sends records again.

The forwarder sends records again after a crash (the next run replays from the WAL
checkpoint) and after a producer reset (it re-forwards from the contiguous watermark). For a
record sent *k* times, Kafka holds one copy for each send that landed: the copies it
acknowledged (*known*), and any number of the copies whose outcome never became known
(*abandoned*: in flight when the agent crashed or the producer was reset, including requests
that timed out). A consumer sees ``known - 1 + landed abandoned`` duplicates of it.
``ReplayAccount`` counts both terms:

- **certain** (``durable_agent_replayed_duplicates_total``): a copy sent again was
  acknowledged although an earlier copy was known to be in Kafka (below the watermark,
  settled above it, or within its partition's delivered prefix; after a crash, as recorded
  in ``delivery_marks``). Counted when the new copy's acknowledgement arrives.
- **possible** (``durable_agent_possible_duplicates_total``): a copy was abandoned. Counted
  at the reset for the records then in flight, and after a crash when a frame the previous
  run may have sent (below its sent mark) but is not known to have been delivered is sent
  again.

Each count is labelled with its cause (``restart``, ``reset``). A consumer sees at least the
certain count and at most certain + possible duplicates made by the agent. What the agent
cannot know: whether an abandoned copy landed (Kafka's idempotence cannot tell a new
producer that); acknowledgements that arrived less than ``MARKS_INTERVAL_S`` before a crash
(the marks file had not recorded them: counted as possible); frames of the read batch that
was about to be sent at a crash (recorded as sent before they were: counted as possible if
sent again); and, after a node crash, what the page cache lost of the marks file (the count
then falls back to possible). Records of an abandoned careful-mode frame that had already
been acknowledged, or refused, are counted as possible too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.delivery_marks import (
    DeliveryMarks,
    MarksFile,
    read_marks,
)
from durable_producer.buffer_agent.metrics import DUPLICATE_CAUSES as CAUSES

MARKS_INTERVAL_S = 0.05
"""How often new acknowledgements are written to the marks file (only when there are some)."""


class _SentHint(Protocol):
    replay_until: int


class ReplayAccount:
    """What Kafka is known to hold of the frames that may be sent again, and the counts.

    Used on the forwarding thread; the counts may be read from any thread.
    """

    def __init__(
        self,
        *,
        checkpoint: int = 0,
        until: int = 0,
        marks: DeliveryMarks | None = None,
        marks_file: MarksFile | None = None,
    ) -> None:
        """``checkpoint``: the WAL's; ``until``: frames below may have been sent by a previous
        run (``marks`` may raise it); ``marks``: what the previous run recorded, ignored if it
        does not fit this WAL's checkpoint."""
        if marks is not None and not marks.checkpoint <= checkpoint <= marks.sent_below:
            marks = None
        marks = marks or DeliveryMarks()
        self.delivered_below = max(checkpoint, marks.delivered_below)
        self.partition_delivered = dict(marks.partition_delivered)
        self.delivered_offsets: set[int] = set()
        self.sent_below = max(checkpoint, until, marks.sent_below)
        self.until = self.sent_below
        """Frames below this offset may already be in Kafka; above, they are sent first."""
        self._restart_until = self.until
        self._restart_counted = checkpoint
        self.certain = dict.fromkeys(CAUSES, 0)
        self.possible = dict.fromkeys(CAUSES, 0)
        self._marks_file = marks_file
        self._written_sent = -1
        self._next_write = 0.0
        self._written_state: tuple[int, int] = (-1, -1)
        self._walked: dict[tuple[str, int], int] = dict(self.partition_delivered)

    @classmethod
    def of_volume(cls, state_dir: Path | None, checkpoint: int, hint: _SentHint) -> ReplayAccount:
        """What the previous run left on the volume: the marks file, and the older sent hint
        (``progress``) for a volume written before the marks file existed."""
        return cls(
            checkpoint=checkpoint,
            until=hint.replay_until,
            marks=read_marks(state_dir),
            marks_file=MarksFile(state_dir),
        )

    @property
    def certain_duplicates(self) -> int:
        return sum(self.certain.values())

    @property
    def possible_duplicates(self) -> int:
        return sum(self.possible.values())

    def known(self, offset: int, topic: str, partition: int) -> bool:
        """A copy of the frame is known to be in Kafka."""
        return (
            offset < self.delivered_below
            or offset in self.delivered_offsets
            or offset <= self.partition_delivered.get((topic, partition), -1)
        )

    def sent_again(self, offset: int, topic: str, partition: int, records: int) -> None:
        """``records`` records of the frame at ``offset`` (below ``until``) are handed to
        Kafka again. The first time after a crash, the previous run's copy of a frame not
        known to be delivered is abandoned: a possible duplicate."""
        if self._restart_counted <= offset < self._restart_until:
            self._restart_counted = offset + 1
            if not self.known(offset, topic, partition):
                self.possible["restart"] += records

    def settled_again(self, offset: int, topic: str, partition: int, records: int) -> None:
        """Kafka acknowledged ``records`` records of a frame sent again (below ``until``)."""
        if self.known(offset, topic, partition):
            restart = offset < self._restart_until and offset not in self.delivered_offsets
            self.certain["restart" if restart else "reset"] += records

    def after_reset(self, tracker: AckTracker) -> None:
        """The producer is reset: frames from the watermark on are sent again. Those settled
        since are known to be in Kafka; the copies in flight are abandoned."""
        self.possible["reset"] += tracker.pending_records
        self.delivered_below = max(self.delivered_below, tracker.watermark)
        self.delivered_offsets.update(tracker.settled_offsets())
        self.until = max(self.until, tracker.next_offset)
        self._prune(tracker.watermark)

    # ----------------------------------------------------------------- the marks file
    def before_sending(self, end: int, tracker: AckTracker, checkpoint: int) -> None:
        """Frames up to (not including) ``end`` are about to be handed to Kafka: record that
        first, so a crash can never hide a send."""
        if end > self._written_sent:
            self.sent_below = max(self.sent_below, end)
            self._write(tracker, checkpoint, refresh=False)

    def maybe_write(self, tracker: AckTracker, checkpoint: int, delivered: int) -> None:
        """Record new acknowledgements (``delivered``: a counter that moves with them), at
        most every ``MARKS_INTERVAL_S``."""
        now = time.monotonic()
        state = (delivered, checkpoint)
        if state != self._written_state and now >= self._next_write:
            self._written_state = state
            self._write(tracker, checkpoint, refresh=True)

    def _write(self, tracker: AckTracker, checkpoint: int, *, refresh: bool) -> None:
        """``refresh``: walk the tracker for the partitions' delivered prefixes (costs a pass
        over the frames in flight; a write ahead of sending reuses the last walk's)."""
        if self._marks_file is None:
            return
        delivered_below = max(self.delivered_below, tracker.watermark, checkpoint)
        if refresh:
            self._next_write = time.monotonic() + MARKS_INTERVAL_S
            partitions = dict(self.partition_delivered)
            for key, offset in tracker.delivered_prefixes().items():
                if offset > partitions.get(key, -1):
                    partitions[key] = offset
            self._walked = partitions
        partitions = self._walked
        marks = DeliveryMarks(
            checkpoint=checkpoint,
            delivered_below=delivered_below,
            sent_below=self.sent_below,
            partition_delivered={k: o for k, o in partitions.items() if o >= delivered_below},
        )
        if self._marks_file.write(marks):
            self._written_sent = self.sent_below

    def _prune(self, watermark: int) -> None:
        self.delivered_offsets = {o for o in self.delivered_offsets if o >= watermark}
        self.partition_delivered = {
            key: offset for key, offset in self.partition_delivered.items() if offset >= watermark
        }
