"""The cluster as the forwarder sees it: brokers, partition leaders, one connection per broker.

``ClusterClient`` keeps a connection to each broker it talks to (``connection.py``), learns the
brokers and the leader of every partition it is asked about from Metadata requests, and makes
the few other requests the agent needs: InitProducerId (a new producer id), DescribeProducers
(KIP-664: what a partition leader holds of a producer: its epoch and last sequence) and
DescribeConfigs (a topic's ``max.message.bytes``). Everything here is asyncio, on the caller's
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.kafka.connection import (
    BrokerConnection,
    BrokerUnreachable,
    Security,
    decode_answer,
)
from durable_producer.buffer_agent.kafka.protocol import (
    API_INIT_PRODUCER_ID,
    API_METADATA,
    build,
    encode_body,
    nested_schema,
    request_schema,
)
from durable_producer.buffer_agent.kafka.sasl import SaslFailed

API_DESCRIBE_PRODUCERS = 61
API_DESCRIBE_CONFIGS = 32
HIGHEST_ASKED: Final = {
    API_METADATA: 12,
    API_INIT_PRODUCER_ID: 4,
    API_DESCRIBE_PRODUCERS: 0,
    API_DESCRIBE_CONFIGS: 4,
}
"""The highest version of each request the client asks for (at most what the broker speaks);
kio reads their answers, after ``wire_bounds`` walked them (``test_wire_bounds.py`` walks
every version up to these)."""
_TOPIC_RESOURCE = 2
NO_LEADER = -1


MAX_MESSAGE_BYTES = "max.message.bytes"
"""The topic config that bounds a batch (``max_message_bytes`` asks it)."""

class KafkaRequestFailed(Exception):
    """A request the forwarder needs was answered with an error (``code``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ProducerOnPartition:
    """What a partition leader holds of one producer (DescribeProducers)."""

    epoch: int
    last_sequence: int


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    addresses = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


class ClusterClient:
    def __init__(
        self, bootstrap: str, security: Security | None = None, *, timeout_s: float = 10.0
    ) -> None:
        self._bootstrap = parse_bootstrap(bootstrap)
        self._security = security or Security()
        self.timeout_s = timeout_s
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[tuple[str, int], int] = {}
        """(topic, partition) -> leader's node id (``NO_LEADER`` while there is none)."""
        self.topic_errors: dict[str, int] = {}
        """Topics the last Metadata answer refused, with its error code."""
        self.partition_counts: dict[str, int] = {}
        self.topic_ids: dict[str, str] = {}
        """Each topic's id (Metadata v10+, hex), kept while the topic is missing: a topic
        deleted and created again has a new one. Absent where the cluster gives none."""
        self._connections: dict[int, BrokerConnection] = {}
        self._opening: dict[int, asyncio.Task[BrokerConnection]] = {}

    @classmethod
    def for_config(cls, client_config: Mapping[str, Any], *, timeout_s: float) -> ClusterClient:
        """A client for the cluster and the security a librdkafka-style config names."""
        return cls(
            str(client_config.get("bootstrap.servers", "")),
            Security.from_client_config(client_config),
            timeout_s=timeout_s,
        )

    # ----------------------------------------------------------------- connections
    async def connection(self, node_id: int) -> BrokerConnection:
        """An open connection to ``node_id``; ``BrokerUnreachable`` if it cannot be had."""
        connection = self._connections.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        opening = self._opening.get(node_id)
        if opening is None:
            address = self.brokers.get(node_id)
            if address is None:
                raise BrokerUnreachable(f"broker {node_id} is not in the cluster's metadata")
            opening = asyncio.ensure_future(
                BrokerConnection.open(*address, self._security, self.timeout_s)
            )
            self._opening[node_id] = opening
        try:
            opened = await asyncio.shield(opening)
        finally:
            if self._opening.get(node_id) is opening and opening.done():
                del self._opening[node_id]
        self._connections[node_id] = opened
        return opened

    def open_connection(self, node_id: int) -> BrokerConnection | None:
        connection = self._connections.get(node_id)
        return connection if connection is not None and not connection.closed else None

    @contextlib.asynccontextmanager
    async def _any_broker(self) -> AsyncIterator[BrokerConnection]:
        """A connection to some broker, closed after use unless it is a kept one."""
        connection = await self._any_connection()
        try:
            yield connection
        finally:
            if connection not in self._connections.values():
                connection.close()

    async def _any_connection(self) -> BrokerConnection:
        """A connection to a known broker, or else to a bootstrap address."""
        for connection in self._connections.values():
            if not connection.closed:
                return connection
        nodes = list(self.brokers)
        random.shuffle(nodes)
        errors: list[OSError] = []
        for node in nodes:
            try:
                return await self.connection(node)
            except OSError as error:  # BrokerUnreachable, SaslFailed among them
                errors.append(error)
        for host, port in self._bootstrap:
            try:
                return await BrokerConnection.open(host, port, self._security, self.timeout_s)
            except OSError as error:
                errors.append(error)
        message = "; ".join(map(str, errors)) or "no broker address known"
        refusals = [error for error in errors if isinstance(error, SaslFailed)]
        if refusals:  # a broker answered and refused the login: the credentials are wrong
            raise SaslFailed(message, refusals[0].code)
        raise BrokerUnreachable(message)

    async def _call(
        self, connection: BrokerConnection, api_key: int, **values: object
    ) -> object:
        version = connection.version(api_key, HIGHEST_ASKED[api_key])
        body = encode_body(api_key, version, **values)
        data = await asyncio.wait_for(connection.request(api_key, version, body), self.timeout_s)
        return decode_answer(connection, api_key, version, data)

    # ----------------------------------------------------------------- metadata
    async def refresh(self, topics: Iterable[str]) -> None:
        """Brokers and the leaders of ``topics``' partitions, from one Metadata request."""
        names = sorted(set(topics))
        async with self._any_broker() as connection:
            try:
                answer: object = await self._call(
                    connection,
                    API_METADATA,
                    topics=tuple(_metadata_topic(connection, name) for name in names),
                    allow_auto_topic_creation=False,
                    include_cluster_authorized_operations=False,
                    include_topic_authorized_operations=False,
                )
            except TimeoutError:
                connection.close()
                raise BrokerUnreachable(
                    f"{connection.address}: no metadata within {self.timeout_s} s"
                ) from None
        self.brokers = {
            int(b.node_id): (str(b.host), int(b.port))
            for b in answer.brokers  # type: ignore[attr-defined]
        }
        for topic in answer.topics:  # type: ignore[attr-defined]
            name = str(topic.name)
            code = int(topic.error_code)
            if code and code != ErrorCode.leader_not_available:
                self.topic_errors[name] = code
                for key in [key for key in self.leaders if key[0] == name]:
                    self.leaders[key] = NO_LEADER
                continue
            self.topic_errors.pop(name, None)
            self.partition_counts[name] = len(topic.partitions)
            topic_id = getattr(topic, "topic_id", None)  # Metadata v10+ only
            if topic_id is not None and topic_id.int:  # zero: the cluster has no topic ids
                self.topic_ids[name] = topic_id.hex
            for partition in topic.partitions:
                leader = int(partition.leader_id)
                if int(partition.error_code) == ErrorCode.leader_not_available:
                    leader = NO_LEADER
                self.leaders[(name, int(partition.partition_index))] = leader
        for node in [node for node in self._connections if node not in self.brokers]:
            self._connections.pop(node).close()

    # ----------------------------------------------------------------- producers
    async def init_producer_id(self, attempts_s: float = 30.0) -> tuple[int, int]:
        """A new idempotent producer id and its epoch; retried while the cluster loads."""
        deadline = asyncio.get_running_loop().time() + attempts_s
        while True:
            async with self._any_broker() as connection:
                answer: object = await self._call(
                    connection,
                    API_INIT_PRODUCER_ID,
                    transactional_id=None,
                    transaction_timeout=datetime.timedelta(milliseconds=2**31 - 1),
                    producer_id=-1,
                    producer_epoch=-1,
                )
            code = int(answer.error_code)  # type: ignore[attr-defined]
            if not code:
                return int(answer.producer_id), int(answer.producer_epoch)  # type: ignore[attr-defined]
            if asyncio.get_running_loop().time() > deadline or code not in _LOADING:
                raise KafkaRequestFailed(code, f"InitProducerId refused: {ErrorCode(code).name}")
            await asyncio.sleep(0.2)

    async def describe_producers(
        self, node_id: int, topic: str, partitions: list[int], producer_id: int
    ) -> dict[int, ProducerOnPartition | int | None]:
        """Per partition: what ``node_id`` (its leader) holds of ``producer_id`` (None: nothing)
        or, as an int, the error code it answered for that partition."""
        connection = await self.connection(node_id)
        answer: object = await self._call(
            connection,
            API_DESCRIBE_PRODUCERS,
            topics=(_describe_topic(topic, partitions),),
        )
        found: dict[int, ProducerOnPartition | int | None] = {}
        for topic_answer in answer.topics:  # type: ignore[attr-defined]
            for partition in topic_answer.partitions:
                index = int(partition.partition_index)
                if int(partition.error_code):
                    found[index] = int(partition.error_code)
                    continue
                found[index] = None
                for producer in partition.active_producers:
                    if int(producer.producer_id) == producer_id:
                        found[index] = ProducerOnPartition(
                            int(producer.producer_epoch), int(producer.last_sequence)
                        )
        return found

    async def topic_configs(self, topics: Iterable[str], name: str) -> dict[str, str]:
        """The value of config ``name`` of each of ``topics`` that the cluster describes
        (DescribeConfigs to any broker); {} at once if the broker does not speak it."""
        async with self._any_broker() as connection:
            if API_DESCRIBE_CONFIGS not in connection.versions:
                return {}
            version = connection.version(API_DESCRIBE_CONFIGS, HIGHEST_ASKED[API_DESCRIBE_CONFIGS])
            resource = nested_schema(
                request_schema(API_DESCRIBE_CONFIGS, version), "DescribeConfigsResource"
            )
            answer: object = await self._call(
                connection,
                API_DESCRIBE_CONFIGS,
                resources=tuple(
                    build(
                        resource,
                        resource_type=_TOPIC_RESOURCE,
                        resource_name=topic,
                        configuration_keys=(name,),
                    )
                    for topic in sorted(set(topics))
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        values = {}
        for result in answer.results:  # type: ignore[attr-defined]
            if int(result.error_code):
                continue  # not described (no permission): unknown
            for config in result.configs:
                if str(config.name) == name and config.value is not None:
                    values[str(result.resource_name)] = str(config.value)
        return values

    async def max_message_bytes(self, topics: Iterable[str]) -> dict[str, int]:
        """``max.message.bytes`` of each of ``topics`` the cluster describes (a value that is
        no number is left out: unknown)."""
        said = await self.topic_configs(topics, MAX_MESSAGE_BYTES)
        return {topic: int(value) for topic, value in said.items() if value.isdecimal()}

    def close(self) -> None:
        for task in self._opening.values():
            task.cancel()
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        with contextlib.suppress(Exception):
            self._opening.clear()


_LOADING = frozenset(
    {
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.request_timed_out,
        ErrorCode.concurrent_transactions,
    }
)


def _metadata_topic(connection: BrokerConnection, name: str) -> object:
    version = connection.version(API_METADATA, HIGHEST_ASKED[API_METADATA])
    schema = nested_schema(request_schema(API_METADATA, version), "MetadataRequestTopic")
    return build(schema, name=name, topic_id=None)


def _describe_topic(topic: str, partitions: list[int]) -> object:
    version = HIGHEST_ASKED[API_DESCRIBE_PRODUCERS]  # its only version
    schema = nested_schema(request_schema(API_DESCRIBE_PRODUCERS, version), "TopicRequest")
    return schema(name=topic, partition_indexes=tuple(partitions))
