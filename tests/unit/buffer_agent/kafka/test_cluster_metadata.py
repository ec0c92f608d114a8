"""``ClusterMetadataSource`` ends its librdkafka client when closed, not at interpreter exit.

A librdkafka client still alive while the interpreter finalizes can kill the process as it
exits (SIGSEGV with no Python frame to report it; an agent's log once ended that way after a
clean drain). What it answers a live cluster is tested against Apache Kafka in
``tests/integration/buffer_agent/kafka/test_unknown_topics.py``.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from types import SimpleNamespace

import pytest

from durable_producer.buffer_agent.ingest.metadata import MetadataCache, TopicStatus
from durable_producer.buffer_agent.kafka import cluster_metadata
from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource
from durable_producer.local.ports import free_port
from support.threads import librdkafka_threads


def test_close_ends_the_threads_of_its_client_at_once() -> None:
    before = librdkafka_threads()
    source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)
    with pytest.raises(ConnectionError):
        source(["any"])
    its_own = librdkafka_threads() - before
    assert its_own, "the client started no thread of its own: nothing to check"
    source.close()
    assert not librdkafka_threads() & its_own  # source is still referenced here


def test_a_closed_source_answers_as_an_unreachable_cluster() -> None:
    source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)
    source.close()
    source.close()  # twice is harmless
    with pytest.raises(ConnectionError, match="closed"):
        source(["any"])


def test_close_ends_the_client_even_while_a_failed_lookup_is_remembered(
    tmp_path: Path,
) -> None:
    # The metadata cache's failed lookup leaves its error in a reference cycle (asyncio's
    # wait_for); the error's traceback went through frames holding the AdminClient. Only a
    # garbage collection would free those, and none may come before the process exits.
    before = librdkafka_threads()
    source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)
    cache = MetadataCache(tmp_path, source, source_timeout_s=5.0)
    gc.disable()
    try:
        answer = asyncio.run(cache.lookup(["any"]))
        assert answer["any"].status is not TopicStatus.KNOWN  # the lookup failed
        its_own = librdkafka_threads() - before
        assert its_own
        source.close()
        assert not librdkafka_threads() & its_own
    finally:
        gc.enable()


def test_a_source_closed_during_a_call_asks_for_no_more_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Asking for an unlisted topic may create it on the cluster: not after the agent closed.
    source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)
    asked: list[str | None] = []

    def listing(_admin: object, topic: str | None, _timeout_s: float) -> SimpleNamespace:
        asked.append(topic)
        source.close()  # as the agent's shutdown does while a worker thread is in here
        return SimpleNamespace(topics={})

    monkeypatch.setattr(cluster_metadata, "_list_topics", listing)
    with pytest.raises(ConnectionError, match="closed"):
        source(["new-a", "new-b"])
    assert asked == [None]  # the listing only: neither new topic was asked for by name
