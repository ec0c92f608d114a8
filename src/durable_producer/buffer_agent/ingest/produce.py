"""The produce path: a Produce request's record batches into the WAL, answered once stored.

**Produce** (v3+, record batch magic 2): every batch is validated (magic, lengths, CRC32C,
``max_batch_bytes``, then every record: ``kafka.record_validate``)
and checked for idempotent sequence; all accepted batches of one request
are appended with one ``append_many_async`` (one WAL frame per batch, the batch verbatim) and
the response is sent only after it returns, i.e. with the durability the WAL's fsync policy
promises. The ``base_offset`` in responses is the WAL offset of the partition's first batch.
A retried batch already stored (or being stored by an append still running) is not appended
again: it is answered like its original, after waiting for it if need be.

``acks=0``: the request is validated and appended exactly like any other, but, as Kafka
specifies, no response is sent at all; refusals (full WAL, corrupt batch) are only logged
and counted, and the client never learns about them.

Refusals, per partition and all or nothing for a partition's batches, as in Kafka: corrupt
CRC, malformed batch, compression codec 5-7 or records that do not decompress ->
CORRUPT_MESSAGE; record count that disagrees with lastOffsetDelta or with the records present,
malformed or truncated records, bytes left over -> INVALID_RECORD (Kafka's LogValidator and
record iterator raise InvalidRecordException there); magic 0/1 ->
UNSUPPORTED_FOR_MESSAGE_FORMAT; batch over ``max_batch_bytes`` or over the topic's
``max.message.bytes`` (where the cluster said it: ``ingest/metadata``; Kafka compares the
batch as sent, compressed, header included), or records decompressing to more than
``max_decompressed_batch_bytes`` -> MESSAGE_TOO_LARGE; illegal topic name ->
INVALID_TOPIC_EXCEPTION; unknown partition -> UNKNOWN_TOPIC_OR_PARTITION;
transactional produce or batches -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED; sequence gap ->
OUT_OF_ORDER_SEQUENCE_NUMBER; older epoch -> INVALID_PRODUCER_EPOCH; WAL full (its limit or
the volume) -> NOT_ENOUGH_REPLICAS; WAL closed or stopped by a failed fsync ->
KAFKA_STORAGE_ERROR (retriable; see ``WAL_FULL_ERROR`` and ``wal/health.py``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.ingest.metadata import MetadataCache
from durable_producer.buffer_agent.ingest.producer_state import ProducerState
from durable_producer.buffer_agent.ingest.sequences import SequenceVerdict, StoredBatch
from durable_producer.buffer_agent.ingest.stats import IngestStats
from durable_producer.buffer_agent.kafka.protocol import (
    PartitionResult,
    Request,
    encode_produce_response,
)
from durable_producer.buffer_agent.kafka.record_batch import (
    BatchHeader,
    InvalidRecordBatch,
    UnsupportedMagic,
    iter_batches,
)
from durable_producer.buffer_agent.kafka.record_validate import (
    DecompressedTooLarge,
    InvalidRecords,
    RecordCountMismatch,
    validate_batch,
)
from durable_producer.buffer_agent.kafka.topic_names import is_legal_topic_name, topic_name_problem
from durable_producer.buffer_agent.log_limits import RateLimitedLog
from durable_producer.buffer_agent.wal import (
    AppendItem,
    FrameTooLargeError,
    WalError,
    WalFullError,
    WriteAheadLog,
)

log = logging.getLogger(__name__)

WAL_FULL_ERROR = ErrorCode.not_enough_replicas
"""Answer to a produce request the WAL has no room for (its limit, or a full volume).

Retriable in librdkafka, the Java client and kafka-python, and it says the batch was not
written: librdkafka kept its first producer epoch while the refused records expired. Measured
against KAFKA_STORAGE_ERROR, REQUEST_TIMED_OUT and a response held 10 s (``block``), with
idempotent confluent-kafka and kafka-python producers refused for 90 s and a 30 s delivery
timeout (``benchmarks/backpressure_experiment.py``; docs/agent.md, "What clients see when the
buffer is full"): none made a producer fatal; KAFKA_STORAGE_ERROR made both clients refresh
metadata over and over (113 and 144 times), this one not beyond the first. kafka-python
3.0.12 hangs with either answer once a retried batch expires (a client defect, described there)."""


BLOCK_ANSWER_MARGIN_S = 1.0
"""Under ``--full-disk-policy block`` a request waits for space at most its own ``timeout_ms``
less this, so that the answer reaches the client before it gives the request up (a broker
answers within the request's timeout too)."""


def block_wait_s(timeout_ms: int) -> float:
    """The longest a Produce request with this ``timeout_ms`` may wait for WAL space."""
    return max(0.0, timeout_ms / 1000 - BLOCK_ANSWER_MARGIN_S)


def invalid_batch_error(error: InvalidRecordBatch) -> ErrorCode:
    """The Kafka error a broker answers for this invalid batch (module docstring)."""
    if isinstance(error, UnsupportedMagic):
        return ErrorCode.unsupported_for_message_format
    if isinstance(error, DecompressedTooLarge):
        return ErrorCode.message_too_large
    if isinstance(error, InvalidRecords | RecordCountMismatch):
        return ErrorCode.invalid_record
    return ErrorCode.corrupt_message


@dataclass(slots=True)
class _PartitionOutcome:
    """One partition of a request: what is appended, what is a retry, and the answer."""

    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    base_offset: int = -1
    accepted: list[tuple[BatchHeader, bytes | memoryview, StoredBatch | None]] = field(
        default_factory=list
    )
    duplicates: list[tuple[StoredBatch, asyncio.Future[ErrorCode] | None]] = field(
        default_factory=list
    )


class ProduceHandler:
    """Answer Produce requests into ``wal``; ``config`` may be replaced while serving."""

    def __init__(
        self,
        config: IngestConfig,
        wal: WriteAheadLog,
        metadata: MetadataCache,
        producer_state: ProducerState,
        stats: IngestStats,
    ) -> None:
        self.config = config
        self._wal = wal
        self._metadata = metadata
        self._state = producer_state
        self._stats = stats
        self._pending: dict[StoredBatch, asyncio.Future[ErrorCode]] = {}
        """Batches whose append is running, for retries of them to wait on."""
        self._appends: set[asyncio.Future[None]] = set()
        """Appends that may wait, run apart from their connection (``_append``)."""
        self._refusal_log = RateLimitedLog(log)

    async def handle(self, request: Request, arrived: float | None = None) -> bytes | None:
        """The encoded response, or None for ``acks=0``. ``arrived``: the loop time the request
        was complete; a ``block`` wait for space ends within its ``timeout_ms`` from then."""
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
        wait_s = block_wait_s(body.timeout_ms)
        if arrived is not None:
            wait_s = max(0.0, wait_s - (asyncio.get_running_loop().time() - arrived))
        await self._append(outcomes, wait_s)
        await self._settle_duplicates(outcomes)
        if body.acks == 0:
            return None
        return self._response(request, outcomes)

    # ------------------------------------------------------------------ 1. validate
    def _validate_partition(
        self, outcome: _PartitionOutcome, records: bytes | memoryview | None
    ) -> None:
        """Validate the partition's batches and check sequences; all or nothing, like Kafka."""
        topic, partition = outcome.topic, outcome.partition
        if not is_legal_topic_name(topic):
            problem = topic_name_problem(topic) or ""
            self._refuse(outcome, ErrorCode.invalid_topic_exception, problem)
            return
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
        except InvalidRecordBatch as exc:
            self._refuse_invalid(outcome, exc)
            return
        config = self.config
        max_batch_bytes = config.max_batch_bytes
        topic_limit = self._metadata.max_message_bytes(topic)
        for header, view in batches:
            if header.size > max_batch_bytes:
                self._refuse(
                    outcome,
                    ErrorCode.message_too_large,
                    f"record batch of {header.size} bytes exceeds max_batch_bytes"
                    f" {max_batch_bytes}",
                )
                return
            if topic_limit is not None and header.size > topic_limit:
                self._refuse(
                    outcome,
                    ErrorCode.message_too_large,
                    f"record batch of {header.size} bytes exceeds the max.message.bytes"
                    f" {topic_limit} of topic {topic}",
                )
                return
            if header.is_transactional or header.is_control:
                self._refuse(
                    outcome,
                    ErrorCode.transactional_id_authorization_failed,
                    "transactional/control batches are not supported through a durable buffer",
                )
                return
            try:
                validate_batch(view, header, config.max_decompressed_batch_bytes)
            except InvalidRecordBatch as exc:
                self._refuse_invalid(outcome, exc)
                return
        sequences = self._state.sequences
        single = len(batches) == 1
        for header, view in batches:
            check = sequences.check(topic, partition, header)
            if check.verdict is SequenceVerdict.ACCEPT:
                stored = sequences.record(topic, partition, header)
                payload = records if single else view
                outcome.accepted.append((header, payload, stored))
            elif check.verdict is SequenceVerdict.DUPLICATE:
                assert check.duplicate_of is not None
                original = check.duplicate_of
                outcome.duplicates.append((original, self._pending.get(original)))
            else:
                self._forget(outcome)
                error = (
                    ErrorCode.invalid_producer_epoch
                    if check.verdict is SequenceVerdict.INVALID_EPOCH
                    else ErrorCode.out_of_order_sequence_number
                )
                self._refuse(outcome, error, check.reason)
                return

    # ------------------------------------------------------------------ 2. append
    async def _append(self, outcomes: list[_PartitionOutcome], wait_s: float) -> None:
        """Append every accepted batch of the request in one WAL call; settle their retries.
        ``wait_s``: the longest a ``block`` wait for space may take (the request's own
        timeout less what it waited in line and ``BLOCK_ANSWER_MARGIN_S``)."""
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
        start = self._state.append_started()
        work = self._append_and_settle(outcomes, items, pending, start, wait_s)
        if not self._wal.append_may_wait(items):
            await work  # runs to its end without a pause: nothing can cancel it half-way
            return
        # It may wait (a write on the writer thread, an fsync, space): if the connection is
        # cancelled meanwhile (shutdown), the append goes on, since its frames may already be
        # in the WAL, and settles its batches' sequence state itself (finish_appends).
        task = asyncio.ensure_future(work)
        self._appends.add(task)
        task.add_done_callback(self._appends.discard)
        await asyncio.shield(task)

    async def finish_appends(self) -> None:
        """Wait for appends whose connection was cancelled (before the last snapshot)."""
        if self._appends:
            await asyncio.gather(*self._appends, return_exceptions=True)

    async def _append_and_settle(
        self,
        outcomes: list[_PartitionOutcome],
        items: list[AppendItem],
        pending: list[tuple[StoredBatch, asyncio.Future[ErrorCode]]],
        start: int,
        wait_s: float,
    ) -> None:
        """The append, then each batch's answer and sequence bookkeeping from its outcome."""
        error: ErrorCode | None = None
        reason = ""
        try:
            offsets = await self._wal.append_many_async(items, wait_s=wait_s)
        except WalFullError as exc:
            error, reason = WAL_FULL_ERROR, str(exc)
        except FrameTooLargeError as exc:
            error, reason = ErrorCode.message_too_large, str(exc)
        except WalError as exc:
            error, reason = ErrorCode.kafka_storage_error, str(exc)
        except BaseException:
            # a bug: whoever waits on these batches must not hang
            for outcome in outcomes:
                self._forget(outcome)
            for stored, future in pending:
                self._pending.pop(stored, None)
                future.set_result(ErrorCode.kafka_storage_error)
            raise
        finally:
            self._state.append_finished(start)
        if error is not None:
            for outcome in outcomes:
                if outcome.accepted:
                    self._forget(outcome)
                    self._refuse(outcome, error, reason)
            for stored, future in pending:
                self._pending.pop(stored, None)
                future.set_result(error)
            return
        stats = self._stats
        offset_iter = iter(offsets)
        for outcome in outcomes:
            for header, payload, tracked in outcome.accepted:
                offset = next(offset_iter)
                if outcome.base_offset < 0:
                    outcome.base_offset = offset
                if tracked is not None:
                    tracked.wal_offset = offset
                stats.batches_appended += 1
                stats.records_appended += header.record_count
                stats.bytes_appended += len(payload)
        for stored, future in pending:
            self._pending.pop(stored, None)
            future.set_result(ErrorCode.none)
        self._state.dirty = True

    # ------------------------------------------------------------------ 3. retried batches
    async def _settle_duplicates(self, outcomes: list[_PartitionOutcome]) -> None:
        """Answer retried batches like the original: wait for it if its append is running."""
        for outcome in outcomes:
            for stored, future in outcome.duplicates:
                self._stats.duplicate_batches += 1
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

    # ------------------------------------------------------------------ 4. respond
    @staticmethod
    def _response(request: Request, outcomes: list[_PartitionOutcome]) -> bytes:
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

    # ------------------------------------------------------------------ helpers
    def _refuse(self, outcome: _PartitionOutcome, error: ErrorCode, message: str) -> None:
        outcome.error = error
        outcome.message = message
        self._stats.refusals[error.name] += 1
        self._refusal_log.warning(
            error.name,
            "refusing produce to %s-%d with %s: %s",
            outcome.topic,
            outcome.partition,
            error.name.upper(),
            message,
        )

    def _refuse_invalid(self, outcome: _PartitionOutcome, error: InvalidRecordBatch) -> None:
        """Refuse an invalid batch with a broker's answer; counted by what is wrong."""
        self._stats.invalid_batches[error.reason] += 1
        self._refuse(outcome, invalid_batch_error(error), str(error))

    def _forget(self, outcome: _PartitionOutcome) -> None:
        """Undo the sequence bookkeeping of a partition's accepted batches (not stored)."""
        sequences = self._state.sequences
        for header, _, stored in outcome.accepted:
            if stored is not None:
                sequences.forget(outcome.topic, outcome.partition, header.producer_id, stored)
        outcome.accepted.clear()
        outcome.duplicates.clear()

    def _new_pending(self, stored: StoredBatch) -> asyncio.Future[ErrorCode]:
        future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        self._pending[stored] = future
        return future
