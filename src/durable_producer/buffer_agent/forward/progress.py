"""How far the forwarder got: the WAL checkpoint and the sent/delivered hint.

The contiguous watermark of the ``AckTracker`` is written as the WAL checkpoint every
``checkpoint_interval_s``, on stop, and as soon as the frames replayed after a start or
reset are delivered; the WAL deletes whole segments below it.

Duplicates are counted conservatively. The forwarder persists a *sent high-water mark*
(one past the last frame handed to the Kafka client) and, for information, the delivered
one in ``state/forwarder.json`` (``{"sent_high": .., "delivered_high": ..}``), every
``hint_interval_s`` (rename, no fsync) and at every checkpoint and stop (fsynced). On
start, every record of a frame between the checkpoint and the sent mark is counted as a
replayed (possible) duplicate: Kafka may have it even if the acknowledgement never
arrived. A producer reset counts the same way. The count is an upper bound on the
duplicates in Kafka, except for records sent within the last ``hint_interval_s`` before a
crash; duplicates themselves are bounded by one checkpoint interval of traffic plus what
was in flight.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.metrics import AgentMetrics
from durable_producer.buffer_agent.wal import WriteAheadLog
from durable_producer.buffer_agent.wal.atomic_file import write_atomic

log = logging.getLogger(__name__)

HINT_FILE = "forwarder.json"
HINT_KEYS = ("sent_high", "delivered_high")


def read_hint(state_dir: Path | None) -> dict[str, int]:
    """The marks a previous run left; empty if there are none or they cannot be read."""
    if state_dir is None:
        return {}
    try:
        hint = json.loads((state_dir / HINT_FILE).read_bytes())
        return {key: int(hint[key]) for key in HINT_KEYS}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_hint(state_dir: Path, sent_high: int, delivered_high: int, *, durable: bool) -> None:
    """Replace the hint: fsynced if ``durable``, else a plain rename (cheap, may be lost)."""
    data = json.dumps({"sent_high": sent_high, "delivered_high": delivered_high}).encode()
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / HINT_FILE
    if durable:
        write_atomic(path, data)
    else:
        temporary = path.with_name(f".{path.name}.fast")
        temporary.write_bytes(data)
        temporary.replace(path)


class Progress:
    """The checkpoint and hint of one forwarder; the tracker is passed in (a reset makes a new
    one). ``replay_until``: frames below it may already be in Kafka (sent by a previous run or
    before a reset); re-sending one counts its records as possible duplicates."""

    def __init__(
        self,
        wal: WriteAheadLog,
        state_dir: Path | None,
        metrics: AgentMetrics | None,
        before_checkpoint: Callable[[], None] | None,
    ) -> None:
        """``before_checkpoint`` runs before every WAL checkpoint that deletes data (the agent
        persists the ingress's producer-sequence state there, which the deleted frames would
        otherwise be needed to rebuild). If it fails, the checkpoint still happens: freeing
        space matters more than exact duplicate detection after a restart."""
        self._wal = wal
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self._metrics = metrics
        self._before_checkpoint = before_checkpoint
        hint = read_hint(self._state_dir)
        self.replay_until = max(wal.checkpoint_offset, hint.get("sent_high", 0))
        self._delivered_before = hint.get("delivered_high", 0)

    def replaying_up_to(self, offset: int) -> None:
        """Frames below ``offset`` are sent again (a producer reset)."""
        self.replay_until = max(self.replay_until, offset)

    def replay_delivered_unrecorded(self, tracker: AckTracker) -> bool:
        """The replayed frames are all delivered but not yet checkpointed."""
        return self._wal.checkpoint_offset < self.replay_until <= tracker.watermark

    def checkpoint(self, tracker: AckTracker, *, durable_hint: bool) -> bool:
        """Checkpoint the WAL at the watermark if it moved, then write the hint; True if the
        checkpoint moved."""
        watermark = tracker.watermark
        moved = watermark > self._wal.checkpoint_offset
        if moved:
            if self._before_checkpoint is not None:
                try:
                    self._before_checkpoint()
                except Exception as error:  # logged: the checkpoint must go on
                    log.warning("before-checkpoint hook failed (%s); checkpointing anyway", error)
            self._wal.checkpoint(watermark)
        self.write_hint(tracker, durable=durable_hint)
        if self._metrics is not None:
            self._metrics.checkpoint_offset.set(self._wal.checkpoint_offset)
        return moved

    def write_hint(self, tracker: AckTracker, *, durable: bool) -> None:
        if self._state_dir is None:
            return
        write_hint(
            self._state_dir,
            max(tracker.next_offset, self.replay_until),
            max(tracker.delivered_high, self._delivered_before),
            durable=durable,
        )
