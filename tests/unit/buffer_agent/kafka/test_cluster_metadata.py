"""``ClusterMetadataSource`` ends its librdkafka client when closed, not at process exit.

A librdkafka client still alive when the process exits can kill it (SIGSEGV or a double free
in the OpenSSL cleanup ``exit()`` runs, with no Python frame to report it; an agent's log once
ended that way after a clean drain). What it answers a live cluster is tested against Apache
Kafka in ``tests/integration/buffer_agent/kafka/test_unknown_topics.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from durable_producer.buffer_agent.ingest.metadata import MetadataCache, TopicStatus
from durable_producer.buffer_agent.kafka import cluster_metadata
from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource
from durable_producer.local.ports import free_port
from support.threads import clients_freed


@pytest.fixture()
def destroyed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sources' AdminClients freed so far, the collector off (only a dropped last
    reference frees one)."""
    with clients_freed(monkeypatch, cluster_metadata, "AdminClient") as freed:
        yield freed


def unreachable() -> ClusterMetadataSource:
    return ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)


def test_close_ends_the_threads_of_its_client_at_once() -> None:
    # In a fresh process: no other test's client there, so every rdk: thread is this one's.
    code = """
        from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource
        from durable_producer.local.ports import free_port
        from support.threads import librdkafka_threads
        source = ClusterMetadataSource({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, 0.2)
        try:
            source(["any"])
        except ConnectionError:
            pass
        print(len(librdkafka_threads()))
        source.close()
        print(len(librdkafka_threads()))
    """
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-800:]
    alive, after_close = (int(line) for line in done.stdout.split())
    assert alive > 0, "the client started no thread: nothing to check"
    assert after_close == 0


def test_close_frees_the_client(destroyed: list[int]) -> None:
    source = unreachable()
    with pytest.raises(ConnectionError):
        source(["any"])
    assert destroyed == []
    source.close()  # source itself is still referenced here
    assert len(destroyed) == 1


def test_close_frees_the_client_even_while_a_failed_lookup_is_remembered(
    tmp_path: Path, destroyed: list[int]
) -> None:
    # The metadata cache's failed lookup leaves its error in a reference cycle (asyncio's
    # wait_for); the error's traceback went through frames holding the AdminClient. Only a
    # garbage collection would free those, and none may come before the process exits.
    source = unreachable()
    cache = MetadataCache(tmp_path, source, source_timeout_s=5.0)
    answer = asyncio.run(cache.lookup(["any"]))
    assert answer["any"].status is not TopicStatus.KNOWN  # the lookup failed
    source.close()
    assert len(destroyed) == 1


def test_a_closed_source_answers_as_an_unreachable_cluster() -> None:
    source = unreachable()
    source.close()
    source.close()  # twice is harmless
    with pytest.raises(ConnectionError, match="closed"):
        source(["any"])


def test_a_source_closed_during_a_call_asks_for_no_more_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Asking for an unlisted topic may create it on the cluster: not after the agent closed.
    source = unreachable()
    asked: list[str | None] = []

    def listing(_admin: object, topic: str | None, _timeout_s: float) -> SimpleNamespace:
        asked.append(topic)
        source.close()  # as the agent's shutdown does while a worker thread is in here
        return SimpleNamespace(topics={})

    monkeypatch.setattr(cluster_metadata, "_list_topics", listing)
    with pytest.raises(ConnectionError, match="closed"):
        source(["new-a", "new-b"])
    assert asked == [None]  # the listing only: neither new topic was asked for by name
