"""The forwarder: the WAL's stored client batches, as they are, to Kafka.

One thread runs an asyncio loop (the path of a frame: docs/architecture.md). Frames are read
from the WAL checkpoint onwards, numbered in their partition's queue (``partition_queue``) and
sent (``sender``); acknowledgements move the watermark (``ack_tracker``), which becomes the
checkpoint (``progress``). The producer identity and each partition's numbering
(``identity``) are written before anything beyond the last sent frame is sent and before
every checkpoint, so after a crash the frames Kafka may hold go out again with the same
numbers and the partition leaders say which ones they hold: no duplicates from a crash.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, RefusedBatch
from durable_producer.buffer_agent.forward.failure_policy import (
    PERMANENT,
    UNKNOWN_TOPIC,
    acl_hint,
    error_name,
    transport_code,
)
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.forward.identity import (
    Anchor,
    IdentityFile,
    IdentityRecord,
    load_identity,
)
from durable_producer.buffer_agent.forward.partition_queue import (
    BATCH,
    INDEX,
    OFFSET,
    RECORDS,
    PartitionQueue,
    Pending,
    Settled,
    number_all,
    settled_frames,
)
from durable_producer.buffer_agent.forward.progress import Progress
from durable_producer.buffer_agent.forward.publisher import (
    DrainSummary,
    ForwarderCounts,
    ForwarderStats,
    Publisher,
)
from durable_producer.buffer_agent.forward.sender import Sender
from durable_producer.buffer_agent.kafka.cluster_client import ClusterClient, KafkaRequestFailed
from durable_producer.buffer_agent.kafka.record_batch import (
    InvalidRecordBatch,
    iter_batches,
    sole_batch,
)
from durable_producer.buffer_agent.log_limits import RateLimitedLog
from durable_producer.buffer_agent.process_tuning import (
    TRIM_AFTER_PEAK_BYTES,
    TRIM_INTERVAL_S,
    release_free_memory,
)
from durable_producer.buffer_agent.volume.state_file import StateDamage
from durable_producer.buffer_agent.wal import Frame, WalClosedError, WalReader, WriteAheadLog

log = logging.getLogger(__name__)

__all__ = ["DrainSummary", "Forwarder", "ForwarderStats"]

IDENTITY_INTERVAL_S = 0.05
"""How often new acknowledgements are written to the identity file (only when there are)."""
LETTER_RETRY_S = 1.0
"""Seconds between attempts to write a dead letter the disk or the budget had no room for."""
_IDLE_WAIT_S = 0.05
_BUSY_WAIT_S = 0.002
MAYBE_IN_KAFKA = "; an earlier send's answer never came: it may be in Kafka as well"
"""Said of a lettered batch a copy of which Kafka may hold (a re-send would store it twice)."""


class Forwarder:
    """Forward a WAL to Kafka on a background thread: ``start()``, ``drain()``, ``stop()``.

    One-shot: once stopped it cannot be started again (make a new one; it resumes from the
    checkpoint). Stop it before closing the WAL. ``stats()`` may be called from any thread.
    """

    def __init__(
        self,
        wal: WriteAheadLog,
        client_config: Mapping[str, Any],
        *,
        dead_letters: DeadLetterStore,
        state_dir: Path,
        metrics: AgentMetrics | None = None,
        config: ForwarderConfig | None = None,
        before_checkpoint: Callable[[], None] | None = None,
        topic_max_bytes: Callable[[str], int | None] | None = None,
        on_topic_max_bytes: Callable[[str, int], None] | None = None,
    ) -> None:
        """``before_checkpoint``: see ``progress.Progress``; ``topic_max_bytes``: a topic's
        ``max.message.bytes`` where known (merged batches stay within it);
        ``on_topic_max_bytes``: told it when a refusal made the forwarder ask (its thread)."""
        self._wal = wal
        self._config = config = config or ForwarderConfig()
        self._client_config = dict(client_config)
        self._dead_letters = dead_letters
        if dead_letters.max_bytes is None:
            dead_letters.max_bytes = config.dead_letter_max_bytes
        self._metrics = metrics
        self._topic_max_bytes = topic_max_bytes
        self._on_topic_max_bytes = on_topic_max_bytes
        self.health = ForwarderHealth(
            stall_after_s=config.stall_after_s,
            on_error=metrics.count_kafka_error if metrics is not None else None,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._progress = Progress(wal, state_dir, metrics, before_checkpoint)
        self._previous_identity, damage = load_identity(state_dir)
        self.state_damage: list[StateDamage] = [] if damage is None else [damage]
        """State files found unusable when it was made (the producer identity)."""
        self._identity_file = IdentityFile(state_dir)
        self._queues: dict[tuple[str, int], PartitionQueue] = {}
        self._tracker = AckTracker(wal.checkpoint_offset, self._queues)
        self._anchors: dict[tuple[str, int], Anchor] = {}
        self._counts = ForwarderCounts()
        self._publisher = Publisher(wal, metrics, self.health)
        self._producer_id = -1
        self._epoch = 0
        self._known_below = 0
        """Frames below this offset are in Kafka (the previous run's watermark)."""
        self._replay_until = 0
        """Frames below this offset may have been sent by the previous run."""
        self._plain_from = 0
        """Frames from this offset on are new to Kafka: none of the previous run's marks
        (``_known_below``, ``_replay_until``, its partitions' anchors) concern them."""
        self._fresh_identity = False
        """The previous run's identity could not be used: its frames are sent again under a
        new producer id (possible duplicates)."""
        self._released_at_bytes = 0
        """``forwarded_bytes`` when freed memory was last released."""
        self._next_release = 0.0
        self._letters_waiting = False
        self._letters_due = 0.0
        self._sent_below = 0
        self._identity_state: tuple[int, int] = (-1, -1)
        self._next_identity = 0.0
        self._next_id_attempt = 0.0
        self._log = RateLimitedLog(log, interval_s=30.0)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Forwarder:
        if self._thread is not None:
            raise RuntimeError("forwarder already started")
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped the forwarding thread, if one did."""
        return self._failure

    def stop(self, flush_timeout_s: float | None = None) -> None:
        """Stop forwarding: wait up to ``flush_timeout_s`` for batches in flight, checkpoint.

        Frames not acknowledged by then stay in the WAL (above the checkpoint) and are sent
        again, with the same numbers, by the next run.
        """
        if flush_timeout_s is not None:
            self._config = replace(self._config, stop_flush_timeout_s=flush_timeout_s)
        self._stop.set()
        self._wal.wake_waiters()
        if self._thread is not None:
            self._thread.join()

    def drain(self, timeout_s: float) -> DrainSummary:
        """Forward everything in the WAL now, then checkpoint and stop; at most ``timeout_s``.

        Starts the forwarder if it is not running (drain mode for an orphaned volume).
        """
        started = time.monotonic()
        target = self._wal.frames_end  # lost offsets at the end settle nothing
        if self._thread is None:
            self.start()
        deadline = started + timeout_s
        while time.monotonic() < deadline and self.running:
            if self._publisher.watermark >= target:
                break
            time.sleep(0.005)
        self.stop(flush_timeout_s=max(0.0, min(1.0, deadline - time.monotonic())))
        counts = self._counts
        return DrainSummary(
            complete=self._publisher.watermark >= target,
            target_offset=target,
            checkpoint_offset=self._wal.checkpoint_offset,
            forwarded_records=counts.forwarded_records,
            dead_letters=counts.dead_letters,
            elapsed_s=time.monotonic() - started,
            possible_duplicates=counts.possible_duplicates,
        )

    def stats(self) -> ForwarderStats:
        counts = self._counts
        return ForwarderStats(
            forwarded_records=counts.forwarded_records,
            forwarded_bytes=counts.forwarded_bytes,
            dead_letters=counts.dead_letters,
            producer_resets=counts.new_epochs,
            in_flight_records=self.health.in_flight,
            watermark=self._publisher.watermark,
            possible_duplicates=counts.possible_duplicates,
        )

    # ----------------------------------------------------------------- the forwarding thread
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as error:  # kept for failure, logged once; the agent decides
            self._failure = error
            log.exception("forwarder stopped by an unexpected error")
        finally:
            self._progress.close()
            self._identity_file.close()

    async def _main(self) -> None:
        config = self._config
        client = ClusterClient.for_config(
            self._client_config, timeout_s=min(10.0, config.request_timeout_s)
        )
        self._sender = Sender(
            client,
            self._queues,
            config,
            on_acked=self._acked,
            on_error=self.health.error,
            on_new_identity=self._new_identity,
            new_producer_id=self._init_producer_id,
            topic_max_bytes=self._topic_max_bytes,
            on_sending=self._sending,
            on_topic_max_bytes=self._on_topic_max_bytes,
            on_gap=self._keep_gap,
        )
        reader: WalReader | None = None
        try:
            self._take_identity()
            reader = self._wal.reader(self._tracker.watermark)
            await self._loop(reader)
            await self._finish()
        finally:
            self._sender.close()
            client.close()
            if reader is not None:
                reader.close()

    async def _loop(self, reader: WalReader) -> None:
        config = self._config
        sender = self._sender
        loop = asyncio.get_running_loop()
        next_checkpoint = time.monotonic() + config.checkpoint_interval_s
        next_hint = time.monotonic() + config.hint_interval_s
        while not self._stop.is_set():
            if self._wal.closed:
                raise WalClosedError("the WAL was closed under the running forwarder")
            appended_before = self._wal.next_offset
            read = await self._read(reader)
            if self._producer_id < 0 and self._queues:
                await self._first_producer_id()
            now = loop.time()
            sender.maintain(now)
            sender.pump(now)
            self._dead_letter_due(time.monotonic())
            mono = time.monotonic()
            self._publisher.publish(self._tracker, self._counts, self._refused_waiting())
            if mono >= next_checkpoint or self._progress.replay_delivered_unrecorded(self._tracker):
                self._checkpoint()
                next_checkpoint = mono + config.checkpoint_interval_s
                next_hint = mono + config.hint_interval_s
            elif mono >= next_hint:
                self._progress.write_hint(self._tracker, self._sent_below, durable=False)
                next_hint = mono + config.hint_interval_s
            self._maybe_write_identity(mono)
            if read:
                await asyncio.sleep(0)
                continue
            sender.wake.clear()
            busy = sender.busy or sender.refreshing
            if self._tracker.idle and not busy and not self._letters_waiting:
                self._release_after_burst(mono)
            # Woken by an answer, a refresh's end, a new frame (when it could be read), or
            # when a retry is due; at most _IDLE_WAIT_S apart for the housekeeping above.
            room = self._tracker.pending_bytes < config.max_in_flight_bytes
            watching = room and not self._letters_waiting
            appended = self._wal.watch_appends(appended_before) if watching else None
            if watching and appended is None:  # frames came while this pass ran
                if busy:  # read them with the next answer or within _BUSY_WAIT_S, as below
                    await self._wait(None, _BUSY_WAIT_S, busy=False)
                continue
            try:
                await self._wait(appended, sender.until_due(now, _IDLE_WAIT_S), busy=busy)
            finally:
                if appended is not None:
                    self._wal.unwatch_appends(appended)

    async def _wait(
        self, appended: asyncio.Future[None] | None, timeout: float, *, busy: bool
    ) -> None:
        """Until the sender wakes the loop, ``appended`` is done, or ``timeout`` passes. With
        batches in flight a new frame waits for the next answer, or _BUSY_WAIT_S (a pass
        every few milliseconds under a steady load, not one a frame); with nothing in flight
        it is read at once (its latency)."""
        woken = asyncio.ensure_future(self._sender.wake.wait())
        try:
            waits: set[asyncio.Future[Any]] = {woken} if appended is None else {woken, appended}
            first = asyncio.FIRST_COMPLETED
            done, _ = await asyncio.wait(waits, timeout=timeout, return_when=first)
            if busy and woken not in done and appended in done:
                await asyncio.wait({woken}, timeout=_BUSY_WAIT_S)
        finally:
            woken.cancel()

    async def _finish(self) -> None:
        """Give batches in flight a last chance, then checkpoint what Kafka acknowledged."""
        deadline = time.monotonic() + self._config.stop_flush_timeout_s
        while self._sender.busy and time.monotonic() < deadline:
            self._sender.wake.clear()
            try:
                await asyncio.wait_for(
                    self._sender.wake.wait(), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                break
        self._publisher.publish(self._tracker, self._counts, self._refused_waiting())
        if not self._wal.closed:
            self._checkpoint()
        self._write_identity(sync=True)

    # ----------------------------------------------------------------- identity
    def _take_identity(self) -> None:
        """Continue the previous run's producer identity and numbering if they fit this WAL;
        otherwise a new producer id is taken before the first send (possible duplicates)."""
        checkpoint = self._wal.checkpoint_offset
        record = self._previous_identity
        hint_until = self._progress.replay_until
        wal_id = self._wal.log_id
        if record is not None and record.fits(checkpoint, wal_id):
            self._producer_id, self._epoch = record.producer_id, record.epoch
            self._known_below = record.delivered_below
            self._anchors = dict(record.partitions)
            self._replay_until = max(record.sent_below, checkpoint)
            self._plain_from = max(
                [self._known_below, self._replay_until]
                + [anchor.offset for anchor in self._anchors.values()]
            )
            log.info(
                "forwarding as producer %d (epoch %d) from WAL offset %d; frames up to %d may"
                " be in Kafka already and are checked with their partition leaders",
                self._producer_id,
                self._epoch,
                checkpoint,
                self._replay_until,
            )
        else:
            if record is not None and not wal_id.named_by(record.wal_id):
                log.warning(
                    "the producer identity in the state directory was %s: forwarding every"
                    " frame of this WAL as a new producer",
                    wal_id.other_than(record.wal_id),
                )
                self._progress.forget_hint()  # the same run's: its offsets are not this log's
                hint_until, record = checkpoint, None
            self._fresh_identity = True
            until = max(hint_until, record.sent_below if record is not None else 0)
            self._replay_until = max(until, checkpoint)
            self._plain_from = self._replay_until
        self._sent_below = self._replay_until

    async def _first_producer_id(self) -> None:
        """Take a producer id for the queues read before one was had (retried while Kafka
        cannot be reached; nothing is sent meanwhile)."""
        if time.monotonic() < self._next_id_attempt:
            return
        try:
            await self._init_producer_id()  # the queues read meanwhile take it
        except (KafkaRequestFailed, OSError) as error:
            self._next_id_attempt = time.monotonic() + self._config.retry_backoff_max_s
            code = error.code if isinstance(error, KafkaRequestFailed) else transport_code(error)
            self.health.error(  # refused for good (an ACL): "delivery"; else not yet, or not there
                "delivery" if code in PERMANENT else "transport",
                code,
                error_name(code),
                f"InitProducerId: {error}{acl_hint(code)}",
            )

    async def _init_producer_id(self) -> tuple[int, int]:
        """A new producer id, taken by every queue still without one and written to the volume
        (fdatasync) before it is used. The queues take it first: a record naming no producer
        (-1) for a partition left it unsendable after a restart."""
        producer_id, epoch = await self._sender.client.init_producer_id()
        self._producer_id, self._epoch = producer_id, epoch
        for queue in self._queues.values():
            if queue.producer_id < 0:
                queue.producer_id, queue.epoch = producer_id, epoch
        self._write_identity(sync=True)
        log.info("forwarding as new producer %d (epoch %d)", producer_id, epoch)
        return producer_id, epoch

    def _record(self) -> IdentityRecord:
        next_offset = self._tracker.next_offset
        anchors = self._anchors
        for key, queue in self._queues.items():
            offset, sequence = queue.anchor(next_offset)
            anchors[key] = Anchor(
                queue.producer_id,
                queue.epoch,
                offset,
                sequence,
                queue.topic_id,
                queue.gap,
                queue.gap_why,
            )
        return IdentityRecord(
            self._producer_id,
            self._epoch,
            delivered_below=max(self._tracker.watermark, self._known_below),
            sent_below=self._sent_below,
            partitions=anchors,
            written_checkpoint=self._wal.checkpoint_offset,
            wal_id=self._wal.log_id.value,
        )

    def _write_identity(self, *, sync: bool = False) -> bool:
        if self._producer_id < 0:
            return False
        self._identity_state = (self._counts.forwarded_records, self._wal.checkpoint_offset)
        self._next_identity = time.monotonic() + IDENTITY_INTERVAL_S
        return self._identity_file.write(self._record(), sync=sync)

    def _maybe_write_identity(self, now: float) -> None:
        state = (self._counts.forwarded_records, self._wal.checkpoint_offset)
        if state != self._identity_state and now >= self._next_identity:
            self._write_identity()

    def _checkpoint(self) -> None:
        """The identity first (a checkpoint past its watermark would make it unusable)."""
        self._write_identity()
        self._progress.checkpoint(self._tracker, self._sent_below)

    # ----------------------------------------------------------------- reading
    async def _read(self, reader: WalReader) -> bool:
        """Read and number frames while the read-ahead budget allows; True if any were."""
        config = self._config
        room = config.max_in_flight_bytes - self._tracker.pending_bytes
        if self._letters_waiting or room <= 0:
            return False
        frames = reader.poll(config.read_batch_frames, max_bytes=room)
        if not frames:
            return False
        # The main line (``number_frames``, in C); everything else goes through _take.
        taken_records, taken_bytes = number_all(frames, self._queues, self._plain_from, self._take)
        self._tracker.read(frames[-1].offset + 1, taken_records, taken_bytes)
        return True

    def _sending(self, sent_below: int) -> None:
        """The sender is about to send frames below ``sent_below`` to a connected broker: the
        mark on the volume moves first, so a crash never hides a send (and frames read ahead
        but not sent, or refused a connection, do not count as possible duplicates after a
        restart)."""
        if sent_below > self._sent_below:
            self._sent_below = sent_below
            self._write_identity()

    def _release_after_burst(self, now: float) -> None:
        """Everything read is acknowledged: after a burst (at least TRIM_AFTER_PEAK_BYTES
        delivered since the last release), give the freed heap back to the kernel
        (``process_tuning``), at most every TRIM_INTERVAL_S."""
        delivered = self._counts.forwarded_bytes
        if delivered - self._released_at_bytes < TRIM_AFTER_PEAK_BYTES or now < self._next_release:
            return
        self._released_at_bytes = delivered
        self._next_release = now + TRIM_INTERVAL_S
        release_free_memory()

    def _take(self, frame: Frame) -> None:
        """Number a frame off the main line in its partition's queue and track it (the main
        line's frames are numbered by ``number_all``, in ``_read``)."""
        key = (frame.topic, frame.partition)
        offset = frame.offset
        payload = frame.payload
        sole = sole_batch(payload)  # one client batch, as the agent stores it: most frames
        anchor = self._anchors.get(key)
        if offset < self._known_below or (anchor is not None and offset < anchor.offset):
            self._tracker.passed(offset)  # in Kafka, or lettered, before a restart
            return
        batches: list[tuple[int, int, memoryview]] = []
        if sole is None:  # none, several (an older agent's frame), or no valid batch
            taken = self._batches_of(frame)
            if taken is None:
                return  # dead-lettered
            batches = taken
            if not batches:
                self._tracker.passed(offset)
                return
        queue = self._queues.get(key)
        if queue is None:
            queue = self._new_queue(key, anchor, offset)
        replayed = offset < self._replay_until
        appended_ms = frame.appended_ms
        if sole is not None:
            records = sole[0]
            queue.add(offset, payload, records, sole[1], appended_ms, replayed)
        else:
            records = 0
            for index, (count, attributes, view) in enumerate(batches):
                queue.add(offset, view, count, attributes, appended_ms, replayed, index)
                records += count
        self._tracker.read(offset + 1, records, len(payload))
        if replayed:
            if self._fresh_identity:
                self._counts.possible["restart"] += records
            else:
                queue.resolve = True  # ask its leader what it holds before sending
                queue.resolve_code = 0

    def _batches_of(self, frame: Frame) -> list[tuple[int, int, memoryview]] | None:
        """(records, attributes, bytes) of each batch of a frame that is not one client batch
        (an older agent's frame may hold several, or none); None when it is no valid batch:
        then it is dead-lettered."""
        try:
            return [
                (header.record_count, header.attributes, view)
                for header, view in iter_batches(frame.payload, check_crc=False)
            ]
        except InvalidRecordBatch as error:
            self._letter_for_frame(frame, str(error))
            return None

    def _new_queue(
        self, key: tuple[str, int], anchor: Anchor | None, offset: int
    ) -> PartitionQueue:
        if anchor is not None and not self._fresh_identity:
            producer_id, epoch = anchor.producer_id, anchor.epoch
            if producer_id < 0:
                # An older agent's record, written before the queue took the run's first
                # producer id: it sent (if at all) under that id and epoch.
                producer_id, epoch = self._producer_id, self._epoch
            queue = PartitionQueue(key, producer_id, epoch, anchor.sequence)
            queue.topic_id, queue.gap, queue.gap_why = anchor.topic_id, anchor.gap, anchor.gap_why
        else:
            if offset < self._replay_until and not self._fresh_identity:
                # The previous run sent frames of this partition but left no numbering for
                # it (the identity file was too large to write): a new epoch for it.
                log.warning("%s/%d: no numbering on the volume; a new epoch", *key)
                self._epoch += 1
            queue = PartitionQueue(key, self._producer_id, self._epoch, 0)
            queue.topic_id = self._sender.topic_id(key[0])  # as last seen
        self._queues[key] = queue
        return queue

    # ----------------------------------------------------------------- from the sender
    def _acked(self, queue: PartitionQueue, taken: Settled) -> None:
        """Kafka holds the frames ``taken`` from ``queue``."""
        self._tracker.settled(queue, taken)
        _, records, size = taken
        counts = self._counts
        counts.forwarded_records += records
        counts.forwarded_bytes += size

    def _new_identity(self, queue: PartitionQueue, unknown: list[Pending]) -> None:
        counts = self._counts
        counts.new_epochs += 1
        for frame in unknown:
            cause = "restart" if frame[OFFSET] < self._replay_until else "reset"
            counts.possible[cause] += frame[RECORDS]
        self._write_identity(sync=True)  # before anything goes out under it

    def _keep_gap(self, _: PartitionQueue) -> None:
        """A partition's leader does not know this producer: on the volume before the new
        epoch (``PartitionQueue.gap``)."""
        self._write_identity(sync=True)

    # ----------------------------------------------------------------- dead letters
    def _refused_waiting(self) -> int:
        """Records whose batch Kafka refused for what it is, waiting for a retry (a lost
        connection is no refusal: the health tells those apart)."""
        return sum(
            queue.batches[0].records if queue.batches else 0
            for queue in self._queues.values()
            if queue.last_error in PERMANENT and not queue.in_flight
        )

    def _dead_letter_due(self, now: float) -> None:
        if self._letters_waiting and now < self._letters_due:
            return
        self._letters_waiting = False
        sender, config = self._sender, self._config
        loop_now = asyncio.get_running_loop().time()
        for key, queue in self._queues.items():
            unknown_since = sender.unknown_since.get(key)
            gone = (
                unknown_since is not None
                and loop_now - unknown_since >= config.unknown_topic_wait_s
            )
            if queue.in_flight or queue.idle:
                continue
            if not (gone or sender.refused_for_good(queue, loop_now, config.dead_letter_after_s)):
                continue
            code = UNKNOWN_TOPIC if gone else queue.last_error
            if not self._letter_for_heads(queue, code, loop_now):
                self._letters_waiting = True
                self._letters_due = now + LETTER_RETRY_S
                return

    def _letter_for_heads(self, queue: PartitionQueue, code: int, loop_now: float) -> bool:
        """Dead-letter the queue's first frame (all its frames for ``UNKNOWN_TOPIC``: its topic
        is gone), refused with ``code``; False if a letter could not be written (the frames
        lettered before it leave the queue)."""
        every = code == UNKNOWN_TOPIC
        waited = None if queue.failing_since is None else loop_now - queue.failing_since
        queue.unbatch()
        topic, partition = queue.key
        window = self._config.dead_letter_after_s
        if every:
            wait = self._config.unknown_topic_wait_s
            reason = f"partition {topic}/{partition} does not exist (for {wait:g} s)"
        elif waited is not None and waited < window:
            reason = (
                f"refused by Kafka with {error_name(code)}, as a batch of this partition"
                f" dead-lettered for it within the last {window:g} s"
            )
        else:
            reason = f"refused by Kafka with {error_name(code)} for {window:g} s"
        frames = list(itertools.islice(queue.frames, None if every else 1))
        copies = [queue.may_be_in_kafka(frame) for frame in frames]
        lettered, error = self._dead_letters.add_batches(
            RefusedBatch(
                frame[OFFSET],
                topic,
                partition,
                frame[BATCH],
                reason + MAYBE_IN_KAFKA if copy else reason,
                error_name(code),
                frame[INDEX],
            )
            for frame, copy in zip(frames, copies, strict=True)
        )
        if error is not None:
            self._letter_failed(error)
        if lettered:
            _log_letters(frames[:lettered], queue.key, reason, sum(copies[:lettered]))
            # Taken out in one pass: one at a time renumbered every frame left each time.
            now = asyncio.get_running_loop().time()
            taken = settled_frames(queue.drop_heads(lettered, code, now))
            # The frames after them numbered anew, or a new epoch to come (``gap``: one may be
            # in Kafka): on the volume before any of them is sent, or acknowledged.
            self._write_identity(sync=True)
            self._tracker.settled(queue, taken)
            self._count_letter(error_name(code), taken[1])
        return error is None

    def _letter_for_frame(self, frame: Frame, why: str) -> None:
        """A frame that is no record batch (never acknowledged by a current agent)."""
        code = "INVALID_RECORD_BATCH"
        letter = RefusedBatch(frame.offset, frame.topic, frame.partition, frame.payload, why, code)
        _, error = self._dead_letters.add_batches([letter])
        if error is not None:
            self._letter_failed(error, "the forwarder stops; the agent's next start tries again")
            raise WalClosedError(f"cannot dead-letter undecodable frame {frame.offset}") from error
        self._count_letter(code, 1)
        self._tracker.passed(frame.offset)

    def _count_letter(self, reason: str, records: int) -> None:
        """Counted in records (an undecodable frame counts as one)."""
        self._counts.dead_letters += records
        if self._metrics is not None:
            self._metrics.dead_letters.labels(reason=reason).inc(records)

    def _letter_failed(self, error: OSError, then: str = "") -> None:
        self._log.warning(
            "letter",
            "could not write a dead letter (%s); its frame stays in the WAL and is not"
            " checkpointed until the letter is written (%s)",
            error,
            then or f"retried every {LETTER_RETRY_S:.0f} s",
        )
        if self._metrics is not None:
            self._metrics.write_errors.labels(file="dead_letter").inc()


def _log_letters(frames: list[Pending], key: tuple[str, int], reason: str, copies: int) -> None:
    """One line for the frames of a pass; ``copies`` of them may be in Kafka as well."""
    if len(frames) == 1:
        where = f"batch of {frames[0][RECORDS]} records of WAL frame {frames[0][OFFSET]}"
        maybe_in_kafka = MAYBE_IN_KAFKA
    else:
        records = sum(frame[RECORDS] for frame in frames)
        where = (
            f"{len(frames)} batches of {records} records of WAL frames {frames[0][OFFSET]}"
            f" to {frames[-1][OFFSET]}"
        )
        maybe_in_kafka = f"; {copies} of them sent before without an answer: may be in Kafka"
    tail = maybe_in_kafka if copies else ""
    log.error("%s (%s/%d) moved to the dead-letter area: %s%s", where, *key, reason, tail)
