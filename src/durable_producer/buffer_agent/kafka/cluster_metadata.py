"""Partition counts and size limits from the real cluster, for the agent's Metadata answers
and its Produce checks.

``ClusterMetadataSource`` is called as ``topics -> {topic: TopicFacts}``; it fits, by its
shape alone, the ``MetadataSource`` the listener's metadata cache asks (so this layer needs
nothing from the listener), and its ``close`` ends its librdkafka client. ``TopicFacts``
holds the partition count and the topic's ``max.message.bytes`` (DescribeConfigs: the
topic's own value or the broker default it falls back to), so that the agent refuses a batch
the topic would refuse, as the broker would (MESSAGE_TOO_LARGE), instead of acknowledging
it. A cluster that does not answer DescribeConfigs (no DESCRIBE_CONFIGS permission, a broker
without it) leaves the limit unknown (None): such batches are acknowledged and, if Kafka
refuses them, dead-lettered. DescribeConfigs goes through the agent's own client
(``cluster_client``), which sees from ApiVersions whether a broker speaks it (librdkafka's
admin client waits for its timeout).

A topic the cluster does not list is asked for by name, in a Metadata request that allows
auto-creation exactly when a producer's would (librdkafka's ``allow.auto.create.topics``,
true for producers unless the agent's Kafka settings turn it off). So the agent does what
the cluster would do for a client writing to it directly:

- ``auto.create.topics.enable=true``: the cluster creates the topic (answering
  LEADER_NOT_AVAILABLE, or with Kafka 4.x UNKNOWN_TOPIC_OR_PARTITION, while it does); it is
  reported with its partition count, or with 0
  while still being created after ``creation_wait_s``;
- otherwise the cluster answers UNKNOWN_TOPIC_OR_PARTITION and the topic is left out of the
  result: it does not exist and will not be created (so are topics the cluster refuses this
  client, TOPIC_AUTHORIZATION_FAILED, and illegal names). Kafka 4.x answers the request that
  makes it create a topic with UNKNOWN_TOPIC_OR_PARTITION too, so that answer is final only
  after ``creation_wait_s`` of asking again. Any other error is reported as 0 partitions
  ("ask again"): it is no evidence that the topic is gone.

A broker's ``auto.create.topics.enable`` cannot be read reliably instead (DescribeConfigs
needs a broker id and the right ACL, and Kafka-compatible brokers may answer it with no
entries); asking is also what decides for a direct producer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from durable_producer.buffer_agent.kafka.client_config import KafkaConfigError
from durable_producer.buffer_agent.kafka.client_log import CLIENT_LOGGER, ClientLog
from durable_producer.buffer_agent.kafka.cluster_client import ClusterClient
from durable_producer.buffer_agent.kafka.connection import BrokerUnreachable


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the agent needs to know of one topic of the cluster."""

    partitions: int
    """0 while the cluster is creating the topic."""
    max_message_bytes: int | None = None
    """The largest record batch the topic takes (``max.message.bytes``), None if unknown."""


# Errors with which a cluster says a topic a Metadata request asked for is not there for this
# client. UNKNOWN_TOPIC_OR_PART is also how Kafka 4.x answers the very request that makes it
# create the topic, so it is final only once ``creation_wait_s`` has passed; any other error
# (leader not available while it is being created, a broker in the middle of a restart)
# means "ask again", never "missing".
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION})
_UNKNOWN = KafkaError.UNKNOWN_TOPIC_OR_PART
_CREATION_POLL_S = 0.1


class ClusterMetadataSource:
    """Asks the cluster with one long-lived AdminClient; ConnectionError when unreachable or
    closed. Its log lines go through ``client_log`` (one line per spell of connection failures).

    ``close`` destroys the AdminClient at once, its threads joined (a call still running
    keeps it until it returns). Whoever makes one closes it before the process exits:
    ``exit()`` runs the OpenSSL cleanup of librdkafka's bundled OpenSSL while a live
    client's threads still use it (a broker thread reconnecting draws its backoff jitter
    from OpenSSL's RAND), which killed a test process with SIGSEGV or a double free in 6 of
    2,952 exits (0 of 1,320 once it was destroyed first), after faulthandler could report
    anything. Their cores: a broker thread faulting in OpenSSL's hash table while computing
    its reconnect backoff; a thread's exit freeing memory again while the main thread was in
    ``OPENSSL_cleanup``.
    """

    def __init__(
        self, client_config: Mapping[str, Any], timeout_s: float = 5.0, creation_wait_s: float = 2.0
    ) -> None:
        self._client_config = client_config
        self._timeout_s = timeout_s
        self._client_log = ClientLog(logging.getLogger(CLIENT_LOGGER), "metadata")
        settings: dict[str, Any] = {"logger": self._client_log, **client_config}
        try:
            self._admin: AdminClient | None = AdminClient(settings)
        except (KafkaException, ValueError, TypeError) as error:  # e.g. a misspelt --kafka-setting
            raise KafkaConfigError([f"librdkafka rejected the configuration: {error}"]) from None
        if str(client_config.get("allow.auto.create.topics", "true")).lower() == "false":
            creation_wait_s = 0.0  # the request creates nothing: its first answer is final
        self._creation_wait_s = creation_wait_s

    def __call__(self, topics: Sequence[str]) -> Mapping[str, TopicFacts]:
        try:
            return self._facts(topics)
        except BaseException as error:
            # Its traceback's frames hold the AdminClient; a caller keeping the error (in a
            # reference cycle, as asyncio's wait_for does) would keep the client past close().
            _clear_frames(error)
            raise

    def _facts(self, topics: Sequence[str]) -> Mapping[str, TopicFacts]:
        admin = self._admin  # held here until this call returns, even if closed meanwhile
        if admin is None:
            raise ConnectionError(_CLOSED)
        metadata = _list_topics(admin, None, self._timeout_s)
        self._client_log.recovered()
        wanted = set(topics) if topics else None
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and (wanted is None or name in wanted)
        }
        for topic in dict.fromkeys(topics):
            if topic not in counts:
                if self._admin is None:  # closed meanwhile: ask (and create) nothing more
                    raise ConnectionError(_CLOSED)
                count = _ask_for_topic(admin, topic, self._timeout_s, self._creation_wait_s)
                if count is not None:
                    counts[topic] = count
        described = [topic for topic, count in counts.items() if count > 0]
        limits = _max_message_bytes(self._client_config, described, self._timeout_s)
        return {topic: TopicFacts(count, limits.get(topic)) for topic, count in counts.items()}

    def close(self) -> None:
        """Destroy the AdminClient (its librdkafka threads end); later calls are refused."""
        self._admin = None


_CLOSED = "the cluster metadata client is closed"


def _clear_frames(error: BaseException) -> None:
    """Drop the locals of every finished frame ``error``, its cause and its context went
    through (the running ones are left as they are)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


def _max_message_bytes(
    client_config: Mapping[str, Any], topics: list[str], timeout_s: float
) -> dict[str, int]:
    """``max.message.bytes`` of ``topics``, of those the cluster describes (DescribeConfigs,
    through the agent's own client: it knows at once when a broker does not speak it)."""
    if not topics:
        return {}

    async def describe() -> dict[str, int]:
        client = ClusterClient.for_config(client_config, timeout_s=timeout_s)
        try:
            return await client.max_message_bytes(topics)
        finally:
            client.close()

    try:
        return asyncio.run(describe())
    except (BrokerUnreachable, OSError, TimeoutError):
        return {}  # unknown this time; the cache keeps what it knew


def _ask_for_topic(
    admin: AdminClient, topic: str, timeout_s: float, creation_wait_s: float
) -> int | None:
    """Partition count of ``topic`` as a producer's Metadata request finds it (see above)."""
    deadline = time.monotonic() + creation_wait_s
    while True:
        found = _list_topics(admin, topic, timeout_s).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        code = None if found is None or found.error is None else found.error.code()
        if found is None or code in _REFUSED:
            return None
        if time.monotonic() >= deadline:
            return None if code == _UNKNOWN else 0
        time.sleep(_CREATION_POLL_S)


def _list_topics(admin: AdminClient, topic: str | None, timeout_s: float) -> Any:
    try:
        return admin.list_topics(topic, timeout=timeout_s)
    except KafkaException as error:
        raise ConnectionError(f"Kafka cluster unreachable: {error}") from error
    finally:
        admin.poll(0)  # serves the client's log lines
