"""How far the forwarder got: the WAL checkpoint and the sent/delivered hint.

The contiguous watermark of the ``AckTracker`` is written as the WAL checkpoint every
``checkpoint_interval_s``, on stop, and as soon as the frames replayed after a start are
delivered; the WAL deletes whole segments below it.

The hint (``state/forwarder.hint``: its marks, bytes and when it is synced, in
``volume/format.py``) marks what a restart must treat with care: on start, the frames between
the checkpoint and the sent mark are *replayed*, as Kafka may hold them already (forwarder.py
says how they are sent again without duplicates). The hint is what is left when the producer
identity is not: then every replayed record counts as a possible duplicate
(``cause="restart"``), and records sent within the last ``hint_interval_s`` before a crash
may escape that count.

**A full disk never stops the forwarder.** The hint and the checkpoint are rewritten in place
(``volume/slot_file.py``), so neither write needs a new block, and the checkpoint deletes
delivered segments before anything else is written. A write that fails anyway is logged,
counted and tried again at the next interval (docs/failure-semantics.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.log_limits import RateLimitedLog
from durable_producer.buffer_agent.volume.format import HINT_FIELDS, HINT_MAGIC
from durable_producer.buffer_agent.volume.slot_file import SlotFile, read_slots
from durable_producer.buffer_agent.wal import WalError, WriteAheadLog

log = logging.getLogger(__name__)

HINT_FILE = "forwarder.hint"
LEGACY_HINT_FILES = ("forwarder.json", ".forwarder.json.fast")
"""Where agents before the two-slot hint kept it (JSON, replaced by rename)."""
HINT_KEYS = ("sent_high", "delivered_high")


def read_hint(state_dir: Path) -> dict[str, int]:
    """The marks a previous run left; empty if there are none or they cannot be read."""
    values = read_slots(state_dir / HINT_FILE, HINT_MAGIC, HINT_FIELDS)
    if values is not None:
        return dict(zip(HINT_KEYS, values, strict=True))
    try:
        hint = json.loads((state_dir / LEGACY_HINT_FILES[0]).read_bytes())
        return {key: int(hint[key]) for key in HINT_KEYS}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # Recursion: deep JSON
        return {}


class HintFile:
    """The hint file, opened (and, the first time, created) when first written."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self._file: SlotFile | None = None

    def write(self, sent_high: int, delivered_high: int, *, durable: bool) -> None:
        """Store the marks in place (fdatasync if ``durable``); ``OSError`` on failure."""
        if self._file is None:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            self._file = SlotFile(self._state_dir / HINT_FILE, HINT_MAGIC, HINT_FIELDS)
            self._file.write((sent_high, delivered_high), sync=True)
            for legacy in LEGACY_HINT_FILES:  # the new file holds the marks now
                with contextlib.suppress(OSError):
                    (self._state_dir / legacy).unlink()
            return
        self._file.write((sent_high, delivered_high), sync=durable)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Progress:
    """The checkpoint and hint of one forwarder; the tracker is passed in. ``replay_until``:
    frames below it may already be in Kafka (sent by a previous run)."""

    def __init__(
        self,
        wal: WriteAheadLog,
        state_dir: Path,
        metrics: AgentMetrics | None,
        before_checkpoint: Callable[[], None] | None,
    ) -> None:
        """``before_checkpoint`` runs before every WAL checkpoint that deletes data (the agent
        persists the ingest's producer-sequence state there, which the deleted frames would
        otherwise be needed to rebuild). If it fails, the checkpoint still happens (freeing
        space matters more than exact duplicate detection after a restart) and the hook runs
        once more right after it, when the deleted segments may have made room for it."""
        self._wal = wal
        self._state_dir = Path(state_dir)
        self._hint = HintFile(self._state_dir)
        self._metrics = metrics
        self._before_checkpoint = before_checkpoint
        self._log = RateLimitedLog(log, interval_s=30.0)
        hint = read_hint(self._state_dir)
        self.replay_until = max(wal.checkpoint_offset, hint.get("sent_high", 0))
        self._delivered_before = hint.get("delivered_high", 0)

    def forget_hint(self) -> None:
        """The hint speaks of another log (a WAL made again beside it): nothing of this one
        was sent."""
        self.replay_until = self._wal.checkpoint_offset
        self._delivered_before = 0

    def replay_delivered_unrecorded(self, tracker: AckTracker) -> bool:
        """The replayed frames are all delivered but not yet checkpointed."""
        return self._wal.checkpoint_offset < self.replay_until <= tracker.watermark

    def checkpoint(self, tracker: AckTracker, sent_below: int) -> bool:
        """Checkpoint the WAL at the watermark if it moved, then write the hint (``sent_below``:
        no frame at or above it was sent); True if the checkpoint moved. A write that fails is
        logged and retried next time."""
        watermark = tracker.watermark
        moved = False
        if watermark > self._wal.checkpoint_offset:
            hook_done = self._run_before_checkpoint()
            try:
                self._wal.checkpoint(watermark)
                moved = True
            except WalError as error:
                self._write_failed("checkpoint", error)
            if moved and not hook_done:
                self._run_before_checkpoint()
        self.write_hint(tracker, sent_below, durable=True)
        if self._metrics is not None:
            self._metrics.checkpoint_offset.set(self._wal.checkpoint_offset)
        return moved

    def _run_before_checkpoint(self) -> bool:
        if self._before_checkpoint is None:
            return True
        try:
            self._before_checkpoint()
        except Exception as error:  # logged: the checkpoint must go on
            self._log.warning(
                "hook", "before-checkpoint hook failed (%s); checkpointing anyway", error
            )
            return False
        return True

    def write_hint(self, tracker: AckTracker, sent_below: int, *, durable: bool) -> None:
        try:
            self._hint.write(
                max(sent_below, self.replay_until),
                max(tracker.delivered_high, self._delivered_before),
                durable=durable,
            )
        except OSError as error:
            self._write_failed("hint", error)

    def _write_failed(self, file: str, error: Exception) -> None:
        self._log.warning(
            file, "could not write the forwarder's %s (%s); trying again later", file, error
        )
        if self._metrics is not None:
            self._metrics.write_errors.labels(file=file).inc()

    def close(self) -> None:
        self._hint.close()
