"""The listener's answers to everything but Produce.

- **ApiVersions**: exactly :data:`~kafka_protocol.SUPPORTED_API_VERSIONS`. An unsupported
  ApiVersions version is answered in v0 with UNSUPPORTED_VERSION and the ranges (clients then
  retry with a version in range; the server does that check before parsing the request).
- **Metadata**: the agent is the only broker and the leader of every partition; partition
  counts come from :class:`MetadataCache`. Never-seen topics while the cluster is unreachable
  get LEADER_NOT_AVAILABLE (retriable) unless a default partition count is configured; topics
  the cluster neither has nor creates on request get TOPIC_AUTHORIZATION_FAILED, Kafka's own
  answer for a missing topic a client may not create: non-retriable, so clients fail at once
  (UNKNOWN_TOPIC_OR_PARTITION would have them retry for 30 s or more).
  Names Kafka does not allow (``kafka.topic_names``) get INVALID_TOPIC_EXCEPTION, which clients
  do not retry, and are never looked up.
- **InitProducerId**: idempotent producers get a fresh producer id (epoch 0). Transactional
  ids are refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED: transactions cannot be honoured
  through a buffer (the agent cannot make a commit atomic with the real cluster).
- **Fetch** and **FindCoordinator** are advertised only because librdkafka derives its
  record-format and compression support from them; they are refused (Fetch partitions with
  TOPIC_AUTHORIZATION_FAILED, group coordinators with GROUP_AUTHORIZATION_FAILED, transaction
  coordinators with TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and logged: the agent is
  write-only, consumers must read from the real cluster.

Each answer is a kio response entity; the server encodes it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.ingest.config import IngestConfig
from durable_producer.buffer_agent.ingest.metadata import MetadataCache, TopicStatus
from durable_producer.buffer_agent.ingest.producer_ids import ProducerIdAllocator
from durable_producer.buffer_agent.ingest.stats import IngestStats
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_FETCH,
    API_FIND_COORDINATOR,
    API_INIT_PRODUCER_ID,
    API_METADATA,
    SUPPORTED_API_VERSIONS,
    Request,
    build,
    nested_schema,
    response_schema,
)
from durable_producer.buffer_agent.kafka.topic_names import topic_name_problem
from durable_producer.buffer_agent.log_limits import RateLimitedLog

log = logging.getLogger(__name__)

_ZERO = datetime.timedelta(0)
_MIN_INT32 = -(2**31)  # "authorized operations not requested"


def api_versions_body(version: int, error: ErrorCode) -> Any:
    """The ApiVersions response listing every supported API's version range."""
    schema = response_schema(API_API_VERSIONS, version)
    api_version_schema = nested_schema(schema, "ApiVersion")
    keys = tuple(
        build(api_version_schema, api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(SUPPORTED_API_VERSIONS.items())
    )
    return build(schema, error_code=error, api_keys=keys, throttle_time=_ZERO)


class Answers:
    """ApiVersions, Metadata and InitProducerId answers, and the Fetch/FindCoordinator refusals.

    ``bound_port`` is the port the listener is bound to (advertised unless
    ``config.advertised_port`` is set); ``config`` may be replaced while serving.
    """

    def __init__(
        self,
        config: IngestConfig,
        metadata: MetadataCache,
        producer_ids: ProducerIdAllocator,
        stats: IngestStats,
        bound_port: Callable[[], int],
    ) -> None:
        self.config = config
        self._metadata = metadata
        self._producer_ids = producer_ids
        self._stats = stats
        self._bound_port = bound_port
        self._refusal_log = RateLimitedLog(log)

    # ------------------------------------------------------------------ ApiVersions
    async def api_versions(self, request: Request) -> Any:
        return api_versions_body(request.api_version, ErrorCode.none)

    # ------------------------------------------------------------------ Metadata
    async def metadata(self, request: Request) -> Any:
        body = request.body
        requested: list[str] | None
        if body.topics is None or (request.api_version == 0 and not body.topics):
            requested = None
        else:
            requested = [topic.name for topic in body.topics if topic.name is not None]
        illegal: dict[str, str] = {}
        if requested is not None:
            for name in requested:
                problem = topic_name_problem(name)
                if problem is not None:
                    illegal[name] = problem
            requested = [name for name in requested if name not in illegal]
        infos = await self._metadata.lookup(requested)
        schema = response_schema(API_METADATA, request.api_version)
        broker_schema = nested_schema(schema, "MetadataResponseBroker")
        topic_schema = nested_schema(schema, "MetadataResponseTopic")
        partition_schema = nested_schema(schema, "MetadataResponsePartition")
        config = self.config
        node = config.node_id
        broker = build(
            broker_schema,
            node_id=node,
            host=config.advertised_host or config.host,
            port=config.advertised_port or self._bound_port(),
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
                    ErrorCode.topic_authorization_failed
                    if info.status is TopicStatus.MISSING
                    else ErrorCode.leader_not_available
                )
                partitions = ()
                self._refusal_log.warning(
                    f"metadata:{name}",
                    "metadata for topic %r: %s (%s)",
                    name,
                    error.name.upper(),
                    "the cluster neither has it nor creates it on request: create it first"
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
        for name, problem in illegal.items():
            self._stats.refusals["invalid_topic_exception"] += 1
            self._refusal_log.warning(
                "metadata:invalid_topic",
                "metadata for topic %r: INVALID_TOPIC_EXCEPTION (%s)",
                name,
                problem,
            )
            topics.append(
                build(
                    topic_schema,
                    error_code=ErrorCode.invalid_topic_exception,
                    name=name,
                    topic_id=None,
                    is_internal=False,
                    partitions=(),
                    topic_authorized_operations=_MIN_INT32,
                )
            )
        return build(
            schema,
            throttle_time=_ZERO,
            brokers=(broker,),
            cluster_id=config.cluster_id,
            controller_id=node,
            topics=tuple(topics),
            cluster_authorized_operations=_MIN_INT32,
        )

    # ------------------------------------------------------------------ InitProducerId
    async def init_producer_id(self, request: Request) -> Any:
        schema = response_schema(API_INIT_PRODUCER_ID, request.api_version)
        if request.body.transactional_id is not None:
            self._stats.refusals["transactional"] += 1
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

    # ------------------------------------------------------------------ refused reads
    async def fetch(self, request: Request) -> Any:
        self._stats.refusals["fetch"] += 1
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

    async def find_coordinator(self, request: Request) -> Any:
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
        self._stats.refusals["find_coordinator"] += 1
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
