"""``ClusterMetadataSource`` ends its librdkafka client when closed, not at interpreter exit.

A librdkafka client still alive while the interpreter finalizes can kill the process as it
exits (SIGSEGV with no Python frame to report it; an agent's log once ended that way after a
clean drain). What it answers a live cluster is tested against Apache Kafka in
``tests/integration/buffer_agent/kafka/test_unknown_topics.py``.
"""

from __future__ import annotations

import pytest

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
