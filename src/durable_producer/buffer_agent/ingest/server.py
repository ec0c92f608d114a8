"""The agent's Kafka-protocol listener: a tiny local "broker" in front of the WAL.

It answers what producers need and nothing else:

- **ApiVersions**: exactly :data:`~kafka_protocol.SUPPORTED_API_VERSIONS`. An unsupported
  ApiVersions version is answered in v0 with UNSUPPORTED_VERSION and the ranges (clients then
  retry with a version in range).
- **Metadata**: the agent is the only broker and the leader of every partition; partition
  counts come from :class:`MetadataCache`. Never-seen topics while the cluster is unreachable
  get LEADER_NOT_AVAILABLE (retriable) unless a default partition count is configured; topics
  the cluster says do not exist get UNKNOWN_TOPIC_OR_PARTITION.
- **InitProducerId**: idempotent producers get a fresh producer id (epoch 0). Transactional
  ids are refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED: transactions cannot be honoured
  through a buffer (the agent cannot make a commit atomic with the real cluster).
- **Produce** (v3+, record batch magic 2): every batch is validated (magic, lengths, CRC32C,
  ``max_batch_bytes``) and checked for idempotent sequence; all accepted batches of one request
  are appended with one ``append_many_async`` (one WAL frame per batch, the batch verbatim) and
  the response is sent only after it returns, i.e. with the durability the WAL's fsync policy
  promises. The ``base_offset`` in responses is the WAL offset of the partition's first batch.

  ``acks=0``: the request is validated and appended exactly like any other, but, as Kafka
  specifies, no response is sent at all; refusals (full WAL, corrupt batch) are only logged
  and counted, and the client never learns about them.

- **Fetch** and **FindCoordinator** are advertised only because librdkafka derives its
  record-format and compression support from them; they are refused (Fetch partitions with
  TOPIC_AUTHORIZATION_FAILED, group coordinators with GROUP_AUTHORIZATION_FAILED, transaction
  coordinators with TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and logged: the agent is
  write-only, consumers must read from the real cluster.

Refusals: corrupt CRC or malformed batch -> CORRUPT_MESSAGE; magic 0/1 ->
UNSUPPORTED_FOR_MESSAGE_FORMAT; batch over ``max_batch_bytes`` -> MESSAGE_TOO_LARGE; unknown
partition -> UNKNOWN_TOPIC_OR_PARTITION; WAL full -> NOT_ENOUGH_REPLICAS (retriable in
librdkafka, the Java client and kafka-python, and unlike KAFKA_STORAGE_ERROR it does not make
clients refresh metadata on every retry); WAL closed/failed -> KAFKA_STORAGE_ERROR (retriable).
Unknown API keys or versions (other than ApiVersions) and malformed frames close that
connection only, as a Kafka broker does: there is no generic error response to send.

Each connection is served by its own task; a frame's size is checked before its body is read;
idle and read timeouts drop stuck peers. Requests of one connection are answered in order.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.config import IngressConfig
from durable_producer.buffer_agent.ingest.frame_receiver import FrameReceiver
from durable_producer.buffer_agent.ingest.idempotence import (
    ProducerIdAllocator,
    ProducerStateStore,
    SequenceTracker,
    StoredBatch,
    Verdict,
)
from durable_producer.buffer_agent.ingest.metadata import MetadataCache, TopicStatus
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_FETCH,
    API_FIND_COORDINATOR,
    API_INIT_PRODUCER_ID,
    API_METADATA,
    API_PRODUCE,
    SUPPORTED_API_VERSIONS,
    MalformedFrame,
    PartitionResult,
    Request,
    UnsupportedRequest,
    build,
    encode_produce_response,
    encode_response,
    nested_schema,
    parse_request,
    peek_header,
    response_schema,
)
from durable_producer.buffer_agent.kafka.record_batch import (
    BatchHeader,
    InvalidRecordBatch,
    UnsupportedMagic,
    iter_batches,
)
from durable_producer.buffer_agent.wal import (
    AppendItem,
    FrameTooLargeError,
    WalError,
    WalFullError,
    WriteAheadLog,
)

log = logging.getLogger(__name__)

WAL_FULL_ERROR = ErrorCode.not_enough_replicas
"""Answer to a produce request when the WAL is at its size limit (retriable everywhere)."""

_ZERO = datetime.timedelta(0)
_MIN_INT32 = -(2**31)




@dataclass(slots=True)
class IngressStats:
    connections_total: int = 0
    connections_open: int = 0
    requests: int = 0
    batches_appended: int = 0
    records_appended: int = 0
    bytes_appended: int = 0
    duplicate_batches: int = 0
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)
    dropped_connections: collections.Counter[str] = field(default_factory=collections.Counter)


class _RateLimitedLog:
    """One log line per reason per ``interval_s``; the rest are counted, not printed."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last, suppressed = self._last.get(reason, (-self._interval_s, 0))
        if now - last < self._interval_s:
            self._last[reason] = (last, suppressed + 1)
            return
        self._last[reason] = (now, 0)
        if suppressed:
            message += " (%d similar suppressed)"
            args = (*args, suppressed)
        log.warning(message, *args)


@dataclass(slots=True)
class _PartitionOutcome:
    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    base_offset: int = -1
    accepted: list[tuple[BatchHeader, Any, StoredBatch | None]] = field(default_factory=list)
    duplicates: list[tuple[StoredBatch, asyncio.Future[ErrorCode] | None]] = field(
        default_factory=list
    )


class IngressServer:
    """Serve the Kafka protocol on ``config.host:config.port`` into ``wal``.

    ``start()`` restores producer state (snapshot + WAL replay) and starts listening;
    ``stop()`` closes the listener and every connection and writes a final snapshot. Call
    :meth:`snapshot_producer_state` before checkpointing the WAL (see ``idempotence``).
    """

    def __init__(
        self,
        wal: WriteAheadLog,
        metadata: MetadataCache,
        state_dir: Path,
        config: IngressConfig | None = None,
        *,
        producer_id_block: int = 1000,
    ) -> None:
        self._wal = wal
        self._metadata = metadata
        self._state_dir = Path(state_dir)
        self.config = config or IngressConfig()
        self.stats = IngressStats()
        self._producer_ids = ProducerIdAllocator(self._state_dir, producer_id_block)
        self._state_store = ProducerStateStore(self._state_dir)
        self._sequences = SequenceTracker()
        self._state_dirty = False
        self._snapshot_lock = asyncio.Lock()
        self._pending: dict[StoredBatch, asyncio.Future[ErrorCode]] = {}
        self._inflight_starts: collections.Counter[int] = collections.Counter()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._snapshot_task: asyncio.Task[None] | None = None
        self._refusal_log = _RateLimitedLog()
        self._handlers: dict[int, Callable[[Request], Any]] = {
            API_API_VERSIONS: self._api_versions,
            API_METADATA: self._metadata_response,
            API_INIT_PRODUCER_ID: self._init_producer_id,
            API_PRODUCE: self._produce,
            API_FETCH: self._fetch,
            API_FIND_COORDINATOR: self._find_coordinator,
        }

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("ingress server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def bootstrap(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        await asyncio.to_thread(self._restore_producer_state)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, self.config.host, self.config.port
        )
        self._snapshot_task = asyncio.create_task(self._snapshot_periodically())
        log.info("agent ingress listening on %s", self.bootstrap)

    def _new_connection(self) -> FrameReceiver:
        return FrameReceiver(self.config.max_frame_bytes, on_connection_made=self._connected)

    def _connected(self, receiver: FrameReceiver) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_connection(receiver))
        self._connections.add(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await self._metadata.close()
        if not self._wal.closed:
            await self.snapshot_producer_state()

    async def __aenter__(self) -> IngressServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ producer state
    def _restore_producer_state(self) -> None:
        tracker, snapshot_offset = self._state_store.load()
        start = max(snapshot_offset, self._wal.checkpoint_offset)
        if snapshot_offset < self._wal.checkpoint_offset and len(tracker):
            log.warning(
                "producer state snapshot covers WAL offsets below %d but the WAL starts at %d:"
                " sequence checks are lenient once per partition",
                snapshot_offset,
                self._wal.checkpoint_offset,
            )
            tracker.mark_lenient()
        replayed = 0
        with self._wal.reader(start) as reader:
            while frames := reader.poll(max_frames=4096):
                for frame in frames:
                    try:
                        for header, _ in iter_batches(frame.payload, check_crc=False):
                            tracker.replay(frame.topic, frame.partition, header, frame.offset)
                            replayed += 1
                    except InvalidRecordBatch as exc:
                        log.warning("WAL frame %d is not a record batch: %s", frame.offset, exc)
        self._sequences = tracker
        self._producer_ids.ensure_above(tracker.max_producer_id())
        log.info(
            "producer state restored: %d producers, %d batches replayed from WAL offset %d",
            len(tracker),
            replayed,
            start,
        )

    async def snapshot_producer_state(self) -> None:
        """Persist sequence state with the WAL offset from which a restart must replay.

        Snapshots run one at a time (the forwarder's pre-checkpoint snapshot can meet the
        periodic or the shutdown one): they share a temp file, and each one's document is
        taken after the previous one was saved, so a newer snapshot is never replaced by
        an older one.
        """
        async with self._snapshot_lock:
            covered_below = min(self._inflight_starts, default=self._wal.next_offset)
            expired = self._sequences.expire(self.config.producer_expiration_s)
            if expired:
                log.info("forgot the sequence state of %d idle producers", expired)
            document = self._sequences.to_json()  # taken in the loop: a consistent view
            self._state_dirty = False
            await asyncio.to_thread(self._state_store.save_document, document, covered_below)

    async def _snapshot_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.snapshot_interval_s)
            if self._state_dirty:
                try:
                    await self.snapshot_producer_state()
                except OSError as exc:
                    log.warning("cannot write the producer state snapshot: %s", exc)

    # ------------------------------------------------------------------ connections
    async def _serve_connection(self, receiver: FrameReceiver) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stats.connections_total += 1
        self.stats.connections_open += 1
        peer = receiver.peer
        try:
            await self._serve_requests(receiver, peer)
        except asyncio.CancelledError:
            pass
        except (MalformedFrame, UnsupportedRequest) as exc:
            self.stats.dropped_connections[type(exc).__name__] += 1
            self._refusal_log.warning(
                type(exc).__name__, "closing connection from %s: %s", peer, exc
            )
        except TimeoutError:
            self.stats.dropped_connections["timeout"] += 1
            log.info("closing connection from %s: idle, read or write timeout", peer)
        except (ConnectionError, OSError):
            self.stats.dropped_connections["connection_error"] += 1
        except Exception:
            self.stats.dropped_connections["internal_error"] += 1
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self.stats.connections_open -= 1
            self._connections.discard(task)
            receiver.close()

    async def _serve_requests(self, receiver: FrameReceiver, peer: object) -> None:
        config = self.config
        while True:
            frame = await receiver.next_frame(
                idle_timeout=config.idle_timeout_s, read_timeout=config.read_timeout_s
            )
            if frame is None:
                return
            self.stats.requests += 1
            response = await self._handle_frame(frame, peer)
            if response is not None:
                await receiver.send(response, timeout=config.write_timeout_s)

    async def _handle_frame(self, frame: bytes | memoryview, peer: object) -> bytes | None:
        api_key, api_version, correlation_id = peek_header(frame)
        if api_key == API_API_VERSIONS and api_version > SUPPORTED_API_VERSIONS[api_key][1]:
            self._refusal_log.warning(
                "api_versions_version",
                "ApiVersions v%d from %s is not supported; answering UNSUPPORTED_VERSION",
                api_version,
                peer,
            )
            return encode_response(
                correlation_id, self._api_versions_body(0, ErrorCode.unsupported_version)
            )
        request = parse_request(frame)
        response = await self._handlers[api_key](request)
        if response is None or isinstance(response, bytes):
            return response  # no response (acks=0) or already encoded (Produce)
        return encode_response(correlation_id, response)

    # ------------------------------------------------------------------ ApiVersions
    async def _api_versions(self, request: Request) -> Any:
        return self._api_versions_body(request.api_version, ErrorCode.none)

    @staticmethod
    def _api_versions_body(version: int, error: ErrorCode) -> Any:
        schema = response_schema(API_API_VERSIONS, version)
        api_version_schema = nested_schema(schema, "ApiVersion")
        keys = tuple(
            build(api_version_schema, api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(SUPPORTED_API_VERSIONS.items())
        )
        return build(schema, error_code=error, api_keys=keys, throttle_time=_ZERO)

    # ------------------------------------------------------------------ Metadata
    async def _metadata_response(self, request: Request) -> Any:
        body = request.body
        requested: list[str] | None
        if body.topics is None or (request.api_version == 0 and not body.topics):
            requested = None
        else:
            requested = [topic.name for topic in body.topics if topic.name is not None]
        infos = await self._metadata.lookup(requested)
        schema = response_schema(API_METADATA, request.api_version)
        broker_schema = nested_schema(schema, "MetadataResponseBroker")
        topic_schema = nested_schema(schema, "MetadataResponseTopic")
        partition_schema = nested_schema(schema, "MetadataResponsePartition")
        node = self.config.node_id
        broker = build(
            broker_schema,
            node_id=node,
            host=self.config.advertised_host or self.config.host,
            port=self.config.advertised_port or self.port,
            rack=None,
        )
        topics = []
        for name, info in infos.items():
            if info.status is TopicStatus.KNOWN:
                error = ErrorCode.none
                partitions = tuple(
                    build(
                        partition_schema,
                        error_code=ErrorCode.none,
                        partition_index=index,
                        leader_id=node,
                        leader_epoch=0,
                        replica_nodes=(node,),
                        isr_nodes=(node,),
                        offline_replicas=(),
                    )
                    for index in range(info.partitions)
                )
            else:
                error = (
                    ErrorCode.unknown_topic_or_partition
                    if info.status is TopicStatus.MISSING
                    else ErrorCode.leader_not_available
                )
                partitions = ()
                self._refusal_log.warning(
                    f"metadata:{name}",
                    "metadata for topic %r: %s (%s)",
                    name,
                    error.name.upper(),
                    "the cluster says it does not exist"
                    if info.status is TopicStatus.MISSING
                    else "cluster unreachable and no cached or default partition count",
                )
            topics.append(
                build(
                    topic_schema,
                    error_code=error,
                    name=name,
                    topic_id=None,
                    is_internal=False,
                    partitions=partitions,
                    topic_authorized_operations=_MIN_INT32,
                )
            )
        return build(
            schema,
            throttle_time=_ZERO,
            brokers=(broker,),
            cluster_id=self.config.cluster_id,
            controller_id=node,
            topics=tuple(topics),
            cluster_authorized_operations=_MIN_INT32,
        )

    # ------------------------------------------------------------------ refused reads
    async def _fetch(self, request: Request) -> Any:
        self.stats.refusals["fetch"] += 1
        self._refusal_log.warning(
            "fetch",
            "refusing Fetch from client %r with TOPIC_AUTHORIZATION_FAILED: the agent is"
            " write-only; consume from the real Kafka cluster",
            request.client_id,
        )
        schema = response_schema(API_FETCH, request.api_version)
        topic_schema = nested_schema(schema, "FetchableTopicResponse")
        partition_schema = nested_schema(schema, "PartitionData")
        topics = tuple(
            build(
                topic_schema,
                topic=topic.topic,
                partitions=tuple(
                    build(
                        partition_schema,
                        partition_index=partition.partition,
                        error_code=ErrorCode.topic_authorization_failed,
                        high_watermark=-1,
                        last_stable_offset=-1,
                        log_start_offset=-1,
                        aborted_transactions=None,
                        records=None,
                    )
                    for partition in topic.partitions
                ),
            )
            for topic in request.body.topics
        )
        return build(
            schema,
            throttle_time=_ZERO,
            error_code=ErrorCode.none,
            session_id=0,
            responses=topics,
        )

    async def _find_coordinator(self, request: Request) -> Any:
        transactional = getattr(request.body, "key_type", 0) == 1
        error = (
            ErrorCode.transactional_id_authorization_failed
            if transactional
            else ErrorCode.group_authorization_failed
        )
        message = (
            "transactions are not supported through a durable buffer; use an idempotent producer"
            if transactional
            else "consumer groups are not served by the write-only agent; consume from the"
            " real Kafka cluster"
        )
        self.stats.refusals["find_coordinator"] += 1
        self._refusal_log.warning(
            f"find_coordinator:{transactional}",
            "refusing FindCoordinator %r from client %r with %s: %s",
            request.body.key,
            request.client_id,
            error.name.upper(),
            message,
        )
        return build(
            response_schema(API_FIND_COORDINATOR, request.api_version),
            throttle_time=_ZERO,
            error_code=error,
            error_message=message,
            node_id=-1,
            host="",
            port=-1,
        )

    # ------------------------------------------------------------------ InitProducerId
    async def _init_producer_id(self, request: Request) -> Any:
        schema = response_schema(API_INIT_PRODUCER_ID, request.api_version)
        if request.body.transactional_id is not None:
            self.stats.refusals["transactional"] += 1
            log.warning(
                "refusing InitProducerId for transactional id %r from client %r: transactions"
                " are not supported through a durable buffer (the agent cannot commit"
                " atomically with the real cluster); use an idempotent producer instead",
                request.body.transactional_id,
                request.client_id,
            )
            return build(
                schema,
                throttle_time=_ZERO,
                error_code=ErrorCode.transactional_id_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        producer_id = await asyncio.to_thread(self._producer_ids.allocate)
        log.info("producer id %d (epoch 0) for client %r", producer_id, request.client_id)
        return build(
            schema,
            throttle_time=_ZERO,
            error_code=ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=0,
        )

    # ------------------------------------------------------------------ Produce
    async def _produce(self, request: Request) -> Any:
        body = request.body
        outcomes: list[_PartitionOutcome] = []
        for topic_data in body.topic_data:
            for partition_data in topic_data.partition_data:
                outcome = _PartitionOutcome(topic_data.name, partition_data.index)
                outcomes.append(outcome)
                if body.transactional_id is not None:
                    self._refuse(
                        outcome,
                        ErrorCode.transactional_id_authorization_failed,
                        "transactional produce is not supported through a durable buffer",
                    )
                    continue
                self._validate_partition(outcome, partition_data.records)
        await self._append(outcomes)
        await self._settle_duplicates(outcomes)
        if body.acks == 0:
            return None
        return self._produce_response(request, outcomes)

    def _refuse(self, outcome: _PartitionOutcome, error: ErrorCode, message: str) -> None:
        outcome.error = error
        outcome.message = message
        self.stats.refusals[error.name] += 1
        self._refusal_log.warning(
            error.name,
            "refusing produce to %s-%d with %s: %s",
            outcome.topic,
            outcome.partition,
            error.name.upper(),
            message,
        )

    def _validate_partition(
        self, outcome: _PartitionOutcome, records: bytes | memoryview | None
    ) -> None:
        """Validate the partition's batches and check sequences; all or nothing, like Kafka."""
        topic, partition = outcome.topic, outcome.partition
        partitions = self._metadata.cached_partitions(topic)
        if partitions is None or not 0 <= partition < partitions:
            self._refuse(
                outcome,
                ErrorCode.unknown_topic_or_partition,
                f"partition {partition} is not among the {partitions or 0} known partitions",
            )
            return
        if not records:
            self._refuse(outcome, ErrorCode.corrupt_message, "no record batch in the request")
            return
        try:
            batches = list(iter_batches(records))
        except UnsupportedMagic as exc:
            self._refuse(outcome, ErrorCode.unsupported_for_message_format, str(exc))
            return
        except InvalidRecordBatch as exc:
            self._refuse(outcome, ErrorCode.corrupt_message, str(exc))
            return
        for header, _ in batches:
            if header.size > self.config.max_batch_bytes:
                self._refuse(
                    outcome,
                    ErrorCode.message_too_large,
                    f"record batch of {header.size} bytes exceeds max_batch_bytes"
                    f" {self.config.max_batch_bytes}",
                )
                return
            if header.is_transactional or header.is_control:
                self._refuse(
                    outcome,
                    ErrorCode.transactional_id_authorization_failed,
                    "transactional/control batches are not supported through a durable buffer",
                )
                return
        single = len(batches) == 1
        for header, view in batches:
            check = self._sequences.check(topic, partition, header)
            if check.verdict is Verdict.ACCEPT:
                stored = self._sequences.record(topic, partition, header)
                payload = records if single else view
                outcome.accepted.append((header, payload, stored))
            elif check.verdict is Verdict.DUPLICATE:
                assert check.duplicate_of is not None
                original = check.duplicate_of
                outcome.duplicates.append((original, self._pending.get(original)))
            else:
                self._forget(outcome)
                error = (
                    ErrorCode.invalid_producer_epoch
                    if check.verdict is Verdict.INVALID_EPOCH
                    else ErrorCode.out_of_order_sequence_number
                )
                self._refuse(outcome, error, check.reason)
                return

    def _forget(self, outcome: _PartitionOutcome) -> None:
        for header, _, stored in outcome.accepted:
            if stored is not None:
                self._sequences.forget(outcome.topic, outcome.partition, header.producer_id, stored)
        outcome.accepted.clear()
        outcome.duplicates.clear()

    async def _append(self, outcomes: list[_PartitionOutcome]) -> None:
        items = [
            AppendItem(outcome.topic, outcome.partition, payload, header.record_count)
            for outcome in outcomes
            for header, payload, _ in outcome.accepted
        ]
        if not items:
            return
        pending = [
            (stored, self._new_pending(stored))
            for outcome in outcomes
            for _, _, stored in outcome.accepted
            if stored is not None
        ]
        start = self._wal.next_offset
        self._inflight_starts[start] += 1
        error: ErrorCode | None = None
        reason = ""
        try:
            offsets = await self._wal.append_many_async(items)
        except WalFullError as exc:
            error, reason = WAL_FULL_ERROR, str(exc)
        except FrameTooLargeError as exc:
            error, reason = ErrorCode.message_too_large, str(exc)
        except WalError as exc:
            error, reason = ErrorCode.kafka_storage_error, str(exc)
        except BaseException:
            # cancelled (shutdown) or a bug: whoever waits on these batches must not hang
            for outcome in outcomes:
                self._forget(outcome)
            for stored, future in pending:
                self._pending.pop(stored, None)
                future.set_result(ErrorCode.kafka_storage_error)
            raise
        finally:
            self._inflight_starts[start] -= 1
            if not self._inflight_starts[start]:
                del self._inflight_starts[start]
        if error is not None:
            for outcome in outcomes:
                if outcome.accepted:
                    self._forget(outcome)
                    self._refuse(outcome, error, reason)
            for stored, future in pending:
                self._pending.pop(stored, None)
                future.set_result(error)
            return
        offset_iter = iter(offsets)
        for outcome in outcomes:
            for header, payload, stored in outcome.accepted:
                offset = next(offset_iter)
                if outcome.base_offset < 0:
                    outcome.base_offset = offset
                if stored is not None:
                    stored.wal_offset = offset
                self.stats.batches_appended += 1
                self.stats.records_appended += header.record_count
                self.stats.bytes_appended += len(payload)
        for stored, future in pending:
            self._pending.pop(stored, None)
            future.set_result(ErrorCode.none)
        self._state_dirty = True

    def _new_pending(self, stored: StoredBatch) -> asyncio.Future[ErrorCode]:
        future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        self._pending[stored] = future
        return future

    async def _settle_duplicates(self, outcomes: list[_PartitionOutcome]) -> None:
        """Answer retried batches like the original: wait for it if its append is running."""
        for outcome in outcomes:
            for stored, future in outcome.duplicates:
                self.stats.duplicate_batches += 1
                error = await asyncio.shield(future) if future is not None else ErrorCode.none
                if error is not ErrorCode.none and outcome.error is ErrorCode.none:
                    self._refuse(outcome, error, "the original of this retried batch failed")
                if outcome.base_offset < 0 and stored.wal_offset is not None:
                    outcome.base_offset = stored.wal_offset
            if outcome.duplicates:
                log.debug(
                    "%d retried batches for %s-%d already stored; not appended again",
                    len(outcome.duplicates),
                    outcome.topic,
                    outcome.partition,
                )

    @staticmethod
    def _produce_response(request: Request, outcomes: list[_PartitionOutcome]) -> bytes:
        by_topic: dict[str, list[PartitionResult]] = {}
        for outcome in outcomes:
            by_topic.setdefault(outcome.topic, []).append(
                PartitionResult(
                    outcome.partition, int(outcome.error), outcome.base_offset, outcome.message
                )
            )
        return encode_produce_response(
            request.correlation_id, request.api_version, list(by_topic.items())
        )
