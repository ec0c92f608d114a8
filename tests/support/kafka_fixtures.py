"""Starting the local Kafka processes for pytest fixtures: one line, not a traceback, when Kafka
is not installed, and a unique topic name per test."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import pytest

from durable_producer.local.kafka_node import KafkaNotInstalled
from durable_producer.local.process import Managed
from durable_producer.local.topics import create_topic

M = TypeVar("M", bound=Managed)
_TOPIC_CHARACTERS = re.compile(r"[^a-zA-Z0-9._-]+")
_TOPIC_NAME_LIMIT = 200  # Kafka allows 249 characters
_topic_numbers = itertools.count(1)


@contextmanager
def started(make: Callable[[], M]) -> Iterator[M]:
    """``make()`` started in a with-block (closed even when the test fails); a missing Kafka
    installation fails the test with the one-line instruction instead of a traceback."""
    missing: KafkaNotInstalled | None = None
    try:
        managed = make().start()  # a start that fails has cleaned up after itself
    except KafkaNotInstalled as error:
        missing = error
    if missing is not None:  # outside the except block: no chained traceback
        pytest.fail(str(missing), pytrace=False)
    try:
        yield managed
    finally:
        managed.close()


def unique_topic_name(test_name: str) -> str:
    """A topic name no other test of this run uses: the test's name and a run-wide number."""
    stem = _TOPIC_CHARACTERS.sub("-", test_name).strip("-.")[:_TOPIC_NAME_LIMIT]
    return f"{stem}-{next(_topic_numbers)}"


class TopicFactory:
    """``new_topic(partitions=1, config=None, bootstrap=None)``: create a topic with a name unique
    to this test and run, on ``bootstrap`` (default: the session's single broker), and return
    the name. ``new_topic.name()`` only makes a name (for a topic that must not exist)."""

    def __init__(self, test_name: str, default_bootstrap: Callable[[], str]) -> None:
        self._test_name = test_name
        self._default_bootstrap = default_bootstrap

    def name(self) -> str:
        return unique_topic_name(self._test_name)

    def __call__(
        self,
        partitions: int = 1,
        *,
        config: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
        bootstrap: str | None = None,
    ) -> str:
        topic = self.name()
        create_topic(
            bootstrap or self._default_bootstrap(),
            topic,
            partitions,
            replication_factor=replication_factor,
            config=config,
        )
        return topic
