"""Sending the partitions' batches to their leaders and acting on the answers (asyncio).

``pump`` groups the batches ready to go by partition leader into Produce requests (acks=all,
one batch per partition, at most ``MAX_REQUESTS_PER_BROKER`` requests in flight to a broker,
each within ``MAX_REQUEST_BYTES``). Each answer is judged (``failure_policy``) and handed to
its ``PartitionQueue``; a lost connection or a timeout leaves the batches' fate unknown (they
are sent again with the same numbers: the broker recognises a copy). Leader moves and unknown
partitions refresh the metadata; a throttled broker (KIP-219) gets nothing until its throttle
time has passed. A batch refused as too large has the topic's ``max.message.bytes`` asked
again (docs/failure-semantics.md). ``maintain`` starts what a partition needs once nothing of
it is in flight: a resolution (DescribeProducers, then acknowledge, or a new epoch) and the
metadata refresh. Dead-lettering is the ``Forwarder``'s (it writes to the volume).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.failure_policy import (
    MAYBE_APPENDED,
    NETWORK,
    NOT_APPENDED,
    NOT_AUTHORIZED,
    OUT_OF_ORDER,
    OWN_FAULTS,
    PERMANENT,
    TOO_LARGE,
    UNKNOWN_TOPIC,
    AnswerVerdict,
    acl_hint,
    error_name,
    judge,
    transport_code,
)
from durable_producer.buffer_agent.forward.partition_queue import (
    INDEX,
    MAX_EPOCH,
    OFFSET,
    SEQUENCE,
    SEQUENCE_LIMIT,
    Batch,
    PartitionKey,
    PartitionQueue,
    Pending,
    Settled,
)
from durable_producer.buffer_agent.kafka.cluster_client import (
    NO_LEADER,
    ClusterClient,
    ProducerOnPartition,
)
from durable_producer.buffer_agent.kafka.produce_wire import produce, produce_version
from durable_producer.buffer_agent.log_limits import RateLimitedLog

log = logging.getLogger(__name__)

MAX_REQUESTS_PER_BROKER = 5
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MIN_MERGE_BYTES = 16 * 1024
"""Halving the merges after a refusal stops here; below it each client batch goes alone."""
MAX_BYTES_MARGIN = 100
"""Merged batches stay this far below a topic's ``max.message.bytes``."""
DESCRIBE_INTERVAL_S = 1.0
"""At most one DescribeConfigs a topic this often, however many batches it refuses."""


class Sender:
    """Runs on the forwarder's event loop. The ``Forwarder`` owns the queues and is told
    of acknowledged frames (``on_acked``), errors (``on_error(kind, code, name, message)``),
    frames sent again under a new identity (``on_new_identity``), and, before any byte of a
    request leaves, one past the highest WAL offset it carries (``on_sending``, see ``pump``
    and ``_send``: frames refused a connection do not count as sent; a connection that drops
    between the round and the request counts them: over, never under)."""

    def __init__(
        self,
        client: ClusterClient,
        queues: dict[PartitionKey, PartitionQueue],
        settings: ForwarderConfig,
        *,
        on_acked: Callable[[PartitionQueue, Settled], None],
        on_error: Callable[[str, int, str, str], None],
        on_new_identity: Callable[[PartitionQueue, list[Pending]], None],
        new_producer_id: Callable[[], Awaitable[tuple[int, int]]],
        topic_max_bytes: Callable[[str], int | None] | None,
        on_sending: Callable[[int], None],
        on_topic_max_bytes: Callable[[str, int], None] | None,
        on_gap: Callable[[PartitionQueue], None],
    ) -> None:
        self.client = client
        self.queues = queues
        self.settings = settings
        self._on_acked = on_acked
        self._on_error = on_error
        self._on_new_identity = on_new_identity
        self._new_producer_id = new_producer_id
        self._topic_max_bytes = topic_max_bytes
        self._on_sending = on_sending
        self._on_topic_max_bytes = on_topic_max_bytes
        self._on_gap = on_gap
        self.wake = asyncio.Event()
        self._requests: dict[int, int] = {}
        self._throttled_until: dict[int, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: asyncio.Task[None] | None = None
        self._refresh_wanted = True
        self._next_refresh = 0.0
        self._refresh_not_before = 0.0
        """A wanted refresh waits until then: the previous one's backoff (``_refreshed``)."""
        self._refresh_misses = 0
        """Refreshes in a row that failed or left a partition with frames without a leader."""
        self._resolving: set[PartitionKey] = set()
        self._merge_limit: dict[str, int] = {}
        self._described_at: dict[str, float] = {}
        """When each topic's ``max.message.bytes`` was last asked (after a refusal)."""
        self.unknown_since: dict[PartitionKey, float] = {}
        """Partitions the cluster's metadata does not have (topic or partition), since when
        (the loop's clock)."""
        self._log = RateLimitedLog(log, interval_s=30.0)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    @property
    def refreshing(self) -> bool:
        """A metadata refresh is under way (its end wakes the loop)."""
        return self._refreshing is not None and not self._refreshing.done()

    def _spawn(self, work: object) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.wake.set()
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("forwarder task failed: %s: %s", type(error).__name__, error)

    # ----------------------------------------------------------------- sending
    def pump(self, now: float) -> None:
        """Send every batch that may go now, grouped by leader. ``on_sending`` hears first
        of the requests to brokers already connected: their tasks run only once this returns."""
        by_leader: dict[int, list[PartitionQueue]] = {}
        outgoing: list[tuple[int, list[tuple[PartitionQueue, Batch]], int]] = []
        leaders = self.client.leaders
        for key, queue in self.queues.items():
            if queue.idle or queue.halted or queue.resolve:
                continue
            leader = leaders.get(key)
            if leader is None or leader == NO_LEADER:
                self._refresh_wanted = True
                continue
            by_leader.setdefault(leader, []).append(queue)
        for node, queues in by_leader.items():
            if self._throttled_until.get(node, 0.0) > now:
                continue
            while self._requests.get(node, 0) < MAX_REQUESTS_PER_BROKER:
                batches: list[tuple[PartitionQueue, Batch]] = []
                size = below = 0
                for queue in queues:
                    if size >= MAX_REQUEST_BYTES:
                        break
                    batch = queue.next_batch(now, self._max_bytes(queue.key[0]))
                    if batch is not None:
                        batches.append((queue, batch))
                        size += batch.size
                        below = max(below, batch.frames[-1][OFFSET] + 1)
                if not batches:
                    break
                self._requests[node] = self._requests.get(node, 0) + 1
                outgoing.append((node, batches, below))
        if outgoing:
            connected = self.client.open_connection
            sent_below = max(
                (below for node, _, below in outgoing if connected(node) is not None), default=0
            )
            if sent_below:
                self._on_sending(sent_below)
        for node, batches, below in outgoing:
            self._spawn(self._send(node, batches, below))

    def _max_bytes(self, topic: str) -> int:
        limit = self._merge_limit.get(topic, self.settings.max_merge_bytes)
        if self._topic_max_bytes is not None:
            known = self._topic_max_bytes(topic)
            if known is not None:
                limit = min(limit, known - MAX_BYTES_MARGIN)
        return limit

    async def _send(
        self, node: int, batches: list[tuple[PartitionQueue, Batch]], below: int
    ) -> None:
        try:
            try:
                connection = await self.client.connection(node)
                version = produce_version(connection)
            except (OSError, ValueError) as error:  # BrokerUnreachable is an OSError
                self._transport_failed(batches, error, sent=False)
                return
            self._on_sending(below)  # told already unless it had to connect: then now
            topics: dict[str, list[tuple[int, list[bytes | memoryview]]]] = {}
            for queue, batch in batches:
                topics.setdefault(queue.key[0], []).append((queue.key[1], batch.parts))
            timeout_s = self.settings.request_timeout_s
            try:
                answers, throttle_ms = await produce(
                    connection, version, list(topics.items()), timeout_s
                )
            except OSError as error:  # BrokerUnreachable and TimeoutError among them
                if isinstance(error, TimeoutError):
                    connection.close()
                self._transport_failed(batches, error, sent=True)
                return
            except Exception as error:  # an answer that makes no sense (a broken broker): lost
                connection.close()
                self._transport_failed(batches, error, sent=True)
                return
            now = asyncio.get_running_loop().time()
            if throttle_ms > 0:
                self._throttled_until[node] = now + throttle_ms / 1000
            by_key = {(a.topic, a.partition): a for a in answers}
            for queue, batch in batches:
                answer = by_key.get(queue.key)
                code = NETWORK if answer is None else answer.error_code
                message = None if answer is None else answer.error_message
                self._answered(queue, batch, code, message, now)
        finally:
            self._requests[node] -= 1

    def _found_gap(self, queue: PartitionQueue, why: str) -> None:
        """``queue.gap`` was set: said once, and kept on the volume before the new epoch
        (a restart in between must not ask the leader, whose last sequence would acknowledge
        the batches it never took)."""
        log.warning("%s/%d: %s", *queue.key, why)
        self._on_gap(queue)

    def _transport_failed(
        self, batches: list[tuple[PartitionQueue, Batch]], error: BaseException, *, sent: bool
    ) -> None:
        now = asyncio.get_running_loop().time()
        code = transport_code(error)
        self._on_error("transport", code, error_name(code), str(error) or type(error).__name__)
        for queue, batch in batches:
            queue.failed(batch, code, now, unknown=sent)
            queue.retry_after(now, self._backoff_after(queue.failures))
        self._refresh_wanted = True

    def _answered(
        self, queue: PartitionQueue, batch: Batch, code: int, message: str | None, now: float
    ) -> None:
        head = queue.head_of_line(batch)
        verdict = judge(code, head_of_line=head)
        if verdict is AnswerVerdict.DONE:
            gap = queue.gap
            acked = queue.succeeded(batch)
            if acked[0]:
                self._on_acked(queue, acked)
            if queue.gap and not gap:
                self._found_gap(
                    queue,
                    "the leader took a batch although it had refused an earlier one: it does"
                    " not know this producer (the topic was created again, or the producer"
                    " expired); the earlier batches go again, after it, under a new epoch",
                )
            return
        name = error_name(code)
        topic, partition = queue.key
        detail = f"{name} for {topic}/{partition}" + (f": {message}" if message else "")
        if head or code != OUT_OF_ORDER:  # behind a refused batch it only says that one was
            self._on_error("delivery", code, name, detail + acl_hint(code))
        queue.failed(
            batch,
            code,
            now,
            not_appended=code in NOT_APPENDED,
            maybe_appended=code in MAYBE_APPENDED,
        )
        queue.retry_after(now, self._backoff_after(queue.failures))
        if verdict is AnswerVerdict.RESOLVE:
            queue.resolve = True
            queue.resolve_code = code
        elif verdict is AnswerVerdict.REFRESH:
            self._refresh_wanted = True
        if code in TOO_LARGE:
            self._ask_max_bytes(topic, now)
        if verdict is AnswerVerdict.REFUSED and len(batch.frames) > 1:
            # Merged before the limit was lowered: merged again within it. Else the topic's
            # limit is lower than we know: merge less.
            current = self._max_bytes(topic)
            limit = current if batch.size > current else max(MIN_MERGE_BYTES, batch.size // 2)
            if code in TOO_LARGE and limit < batch.size:
                self._merge_limit[topic] = limit
                queue.rebatch = True
            else:  # one of the client batches is at fault, or merging less would not help
                queue.isolate = True  # each is sent and judged alone
            queue.ready_at = now

    def _ask_max_bytes(self, topic: str, now: float) -> None:
        """Ask the topic's ``max.message.bytes`` (a refusal says it is lower than we knew)."""
        last = self._described_at.get(topic)
        if last is None or now - last >= DESCRIBE_INTERVAL_S:
            self._described_at[topic] = now
            self._spawn(self._describe_max_bytes(topic))

    async def _describe_max_bytes(self, topic: str) -> None:
        try:
            limit = (await self.client.max_message_bytes([topic])).get(topic)
        except OSError as error:  # BrokerUnreachable and TimeoutError among them
            log.info("could not ask the max.message.bytes of %s: %s", topic, error)
            return  # merges go on halving, down to one client batch a request
        if limit is None:
            return  # not described (no DESCRIBE_CONFIGS permission): as above
        merge = min(self.settings.max_merge_bytes, limit - MAX_BYTES_MARGIN)
        if merge != self._merge_limit.get(topic):
            log.info("topic %s: max.message.bytes %d; merged batches stay within it", topic, limit)
            self._merge_limit[topic] = merge
        if self._on_topic_max_bytes is not None:
            self._on_topic_max_bytes(topic, limit)

    def until_due(self, now: float, longest: float) -> float:
        """Seconds until a queue's retry backoff, a broker's throttle or a held-back metadata
        refresh ends, at most ``longest``: besides an answer or a new frame, only that lets
        more be sent (``maintain`` starts the refresh)."""
        due = [q.ready_at - now for q in self.queues.values() if not q.idle and q.ready_at > now]
        due += [until - now for until in self._throttled_until.values() if until > now]
        if self.queues and not self.refreshing:
            refresh = self._next_refresh
            if self._refresh_wanted:
                refresh = min(refresh, self._refresh_not_before)
            if refresh > now:
                due.append(refresh - now)
        return min([longest, *due])

    def _backoff_after(self, failures: int) -> float:
        """``retry_backoff_s`` doubled ``failures`` times, at most ``retry_backoff_max_s``."""
        settings = self.settings
        backoff: float = settings.retry_backoff_s * 2 ** min(failures, 16)
        return min(backoff, settings.retry_backoff_max_s)

    def _retry_after_refresh(self, queue: PartitionQueue) -> None:
        """Ask the cluster's metadata again; ``queue`` waits its backoff before it is tried
        again (its leader is unknown, unreachable, or says it leads no more)."""
        self._refresh_wanted = True
        queue.retry_after(asyncio.get_running_loop().time(), self._backoff_after(queue.failures))

    # ----------------------------------------------------------------- upkeep
    def maintain(self, now: float) -> None:
        """Start resolutions and the metadata refresh that are due."""
        for key, queue in self.queues.items():
            if queue.gap and not queue.in_flight and key not in self._resolving:
                self._resolving.add(key)
                self._spawn(self._past_a_gap(queue))
            elif queue.resolve and not queue.in_flight and key not in self._resolving:
                if now >= queue.ready_at:
                    self._resolving.add(key)
                    self._spawn(self._resolve(queue))
            elif queue.isolate and queue.idle:
                queue.isolate = False
        wanted = self._refresh_wanted and now >= self._refresh_not_before
        if (wanted or now >= self._next_refresh) and not self.refreshing and self.queues:
            self._refresh_wanted = False
            self._next_refresh = now + self.settings.metadata_interval_s
            self._refreshing = asyncio.ensure_future(self._refresh())
            self._refreshing.add_done_callback(self._done)  # wakes the loop; logs a failure

    async def _refresh(self) -> None:
        topics = {key[0] for key, queue in self.queues.items() if not queue.idle}
        if not topics:
            self._next_refresh = asyncio.get_running_loop().time() + 300.0
            for queue in self.queues.values():
                queue.refreshed()  # nothing is left to send again
            return
        waiting = [(queue, queue.losses) for queue in self.queues.values() if queue.refresh_first]
        try:
            await self.client.refresh(topics)
        except BaseException as error:
            self._refreshed(asyncio.get_running_loop().time(), complete=False)
            self._refresh_wanted = self._refresh_wanted or bool(waiting)  # after its backoff
            if not isinstance(error, OSError):
                raise  # the task's end logs it; the next refresh still backs off
            code = transport_code(error)
            self._on_error("transport", code, error_name(code), str(error))
            return
        now = asyncio.get_running_loop().time()
        self._check_topic_ids(topics)
        for queue, losses in waiting:
            queue.refreshed(losses)
        errors, counts = self.client.topic_errors, self.client.partition_counts
        for key, queue in self.queues.items():
            topic, partition = key
            missing = errors.get(topic) == UNKNOWN_TOPIC or (
                topic not in errors and partition >= counts.get(topic, partition + 1)
            )
            if missing and not queue.idle:
                self.unknown_since.setdefault(key, now)
            else:
                self.unknown_since.pop(key, None)
        for topic in topics:
            if topic in errors:
                code = errors[topic]
                self._on_error("delivery", code, error_name(code), f"{error_name(code)}: {topic}")
        leaderless = any(  # of the topics asked for: one met meanwhile is asked for next
            self.client.leaders.get(key, NO_LEADER) == NO_LEADER
            for key, queue in self.queues.items()
            if not queue.idle and key[0] in topics
        )
        if leaderless:
            self._next_refresh = now + self.settings.retry_backoff_s * 5
        self._refreshed(now, complete=not leaderless)

    def topic_id(self, topic: str) -> str:
        """The id of ``topic`` the cluster last gave ("" before any)."""
        return self.client.topic_ids.get(topic, "")

    def _check_topic_ids(self, topics: set[str]) -> None:
        """A partition numbered for another id of its topic: the topic was deleted and
        created again, and its leader does not know this producer. It takes any sequence
        (so a batch past one it refused, which a resolution would acknowledge) and keeps
        nothing of what was sent to the topic before: a new epoch (``gap``), counting the
        batches whose answer never came as possible duplicates."""
        ids = self.client.topic_ids
        for key, queue in self.queues.items():
            current = ids.get(key[0])
            if current is None or key[0] not in topics or current == queue.topic_id:
                continue
            if not queue.topic_id:
                queue.topic_id = current
            elif not queue.gap:
                queue.gap = True
                self._found_gap(
                    queue,
                    f"the topic was deleted and created again (id {queue.topic_id}, now"
                    f" {current}); its unacknowledged batches go to the new topic under a new"
                    " epoch, those sent before counted as possible duplicates",
                )

    def _refreshed(self, now: float, *, complete: bool) -> None:
        """After a refresh that failed or left partitions with frames without a leader (a
        topic that does not exist, Kafka unreachable) the next wanted one backs off as
        ``ForwarderConfig.metadata_interval_s`` says (KIP-580; else every pass of the loop
        asked again at once, a core spent). After a complete one the next goes at once (a
        new topic's first frames, a leader move)."""
        if complete:
            self._refresh_misses = 0
            self._refresh_not_before = now
            return
        self._refresh_misses += 1
        self._refresh_not_before = now + self._backoff_after(self._refresh_misses - 1)

    def refused_for_good(self, queue: PartitionQueue, now: float, wait_s: float) -> bool:
        """The partition's head batch was refused (``PERMANENT``) for ``wait_s``, alone; or
        alone for a fault of its own (``OWN_FAULTS``) within ``wait_s`` of a batch of the
        partition dead-lettered for the same (that window was waited out)."""
        code, lettered = queue.last_error, queue.lettered
        return (
            code in PERMANENT
            and not queue.in_flight
            and queue.failing_since is not None
            and bool(queue.batches)
            and len(queue.batches[0].frames) == 1  # a merged batch is split and tried first
            and (
                now - queue.failing_since >= wait_s
                or (
                    code in OWN_FAULTS
                    and lettered is not None
                    and lettered[0] == code
                    and now - lettered[1] < wait_s
                )
            )
        )

    # ----------------------------------------------------------------- resolution
    async def _resolve(self, queue: PartitionQueue) -> None:
        """Ask the leader what it holds of our producer on this partition (module doc)."""
        key = queue.key
        try:
            first = queue.first_unacknowledged()
            leader = self.client.leaders.get(key, NO_LEADER)
            if first is None:
                queue.resolve = False
                return
            if leader == NO_LEADER:
                self._retry_after_refresh(queue)
                return
            try:
                found = (
                    await self.client.describe_producers(
                        leader, key[0], [key[1]], queue.producer_id
                    )
                ).get(key[1])
            except (OSError, ValueError) as error:
                if isinstance(error, ValueError):  # DescribeProducers not supported
                    if queue.resolve_code == 0:  # the check after a restart: the broker's
                        queue.resolve = False  # duplicate window recognises what it holds
                        queue.unbatch()
                        return
                    await self._new_epoch(queue, None, "the leader cannot describe producers")
                    return
                self._retry_after_refresh(queue)
                return
            if queue.gap:  # meanwhile: the topic was created again (``_check_topic_ids``)
                return  # a new epoch then, never what its leader says (``_past_a_gap``)
            if isinstance(found, int):
                verdict = judge(found, head_of_line=False)
                if verdict in (AnswerVerdict.REFRESH, AnswerVerdict.RETRY):
                    self._retry_after_refresh(queue)
                    return
                if found in NOT_AUTHORIZED:  # a new epoch all the same: a leader that
                    self._log.warning(  # forgot the producer would store them twice, uncounted
                        f"describe {key[0]}",
                        "DescribeProducers on %s refused (%s): grant the agent's principal READ"
                        " on the topic (Kafka asks READ for it) so that a restart sends nothing"
                        " twice; until then the frames sent before a restart go again under a"
                        " new epoch, counted as possible duplicates",
                        key[0],
                        error_name(found),
                    )
                await self._new_epoch(queue, None, f"DescribeProducers: {error_name(found)}")
                return
            self._apply(queue, found, first)
            if queue.resolve:
                await self._new_epoch(
                    queue,
                    found,
                    "the leader no longer knows this producer (producer.id.expiration.ms"
                    " passed, or its batches' log was deleted): frames sent before may be"
                    " stored twice"
                    if found is None
                    else "the leader's sequences do not fit ours",
                )
        finally:
            self._resolving.discard(key)

    def _apply(
        self, queue: PartitionQueue, found: ProducerOnPartition | None, first: Pending
    ) -> None:
        """Acknowledge what the leader holds; leave ``resolve`` set if a new epoch is needed."""
        if found is None:
            # The leader holds nothing of this producer: it takes any sequence from it, and
            # so any copy it held before. After a restart (code 0) a numbering beyond 0 means
            # it took earlier frames of this identity and forgot them (expired, or their log
            # deleted): a new epoch, whose renumbering counts the frames sent before as
            # possible duplicates. A second resolution of the same frames finding nothing:
            # a new epoch too.
            never_taken = queue.resolve_code == 0 and first[SEQUENCE] == 0
            queue.resolve = (
                not never_taken and queue.resolve_code != OUT_OF_ORDER
            ) or queue.failures > 3
            queue.unbatch()
            return
        if found.epoch != queue.epoch:
            return  # resolve stays set: a new epoch above both
        if found.last_sequence >= 0:
            acked = queue.acknowledge_up_to(found.last_sequence)
            if acked[0]:
                self._on_acked(queue, acked)
        head = queue.first_unacknowledged()
        if head is None:
            queue.resolve = False
            queue.resolve_code = 0
            return
        expected = (found.last_sequence + 1) % SEQUENCE_LIMIT
        queue.resolve = head[SEQUENCE] != expected
        same_head = head[OFFSET] == first[OFFSET] and head[INDEX] == first[INDEX]
        if queue.resolve and same_head:
            self._log.warning(
                "gap",
                "the leader of %s/%d holds this producer's records up to sequence %d, not up to"
                " %d as it acknowledged: Kafka lost acknowledged records (unclean leader"
                " election?); going on with a new epoch",
                *queue.key,
                found.last_sequence,
                (head[SEQUENCE] - 1) % SEQUENCE_LIMIT,
            )
        queue.unbatch()

    async def _past_a_gap(self, queue: PartitionQueue) -> None:
        """A new epoch for a partition whose leader does not know this producer
        (``PartitionQueue.gap``; never a resolution: ``_found_gap`` says why)."""
        try:
            why = queue.gap_why or "its leader does not know this producer"
            await self._new_epoch(queue, None, why)
        finally:
            self._resolving.discard(queue.key)

    async def _new_epoch(
        self, queue: PartitionQueue, found: ProducerOnPartition | None, reason: str
    ) -> None:
        """Number the partition's frames from 0 under a newer epoch (or a new producer id)."""
        epoch = max(queue.epoch, found.epoch if found is not None else -1) + 1
        producer_id = queue.producer_id
        if epoch > MAX_EPOCH:
            producer_id, epoch = await self._new_producer_id()
        message = "%s/%d: %s; producer %d goes on with epoch %d from sequence 0"
        log.warning(message, *queue.key, reason, producer_id, epoch)
        unknown = queue.renumber(producer_id, epoch)
        queue.topic_id = self.topic_id(queue.key[0]) or queue.topic_id
        queue.resolve = False
        queue.resolve_code = 0
        self._on_new_identity(queue, unknown)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._refreshing is not None:
            self._refreshing.cancel()
