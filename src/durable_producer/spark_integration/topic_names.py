"""Kafka's topic naming rule, checked before anything is written.

Kafka accepts a topic name of 1 to 249 characters from ``[a-zA-Z0-9._-]``, other than ``.``
and ``..`` (``org.apache.kafka.common.internals.Topic.validate``; the rule itself is
``durable_producer/topic_names.py``, shared with the agent). The ``topic`` option is
checked on the driver; names from a ``topic`` column are checked in the task, once per
distinct name (``TopicNameCheck``), so a bad name fails the task at once with a clear message
instead of 30 s of metadata retries ending in "Unknown topic or partition".
"""

from __future__ import annotations

from durable_producer.spark_integration.errors import InvalidTopicError
from durable_producer.topic_names import ILLEGAL_TOPIC_CHARACTER as _ILLEGAL_CHARACTER
from durable_producer.topic_names import LEGAL_TOPIC_NAME as _LEGAL
from durable_producer.topic_names import MAX_TOPIC_NAME_LENGTH as MAX_TOPIC_NAME_LENGTH
from durable_producer.topic_names import RESERVED_TOPIC_NAMES


def topic_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name, or ``None`` when it is."""
    if not name:
        return "it is empty"
    if name in RESERVED_TOPIC_NAMES:
        return f"{name!r} is reserved"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"it is {len(name)} characters long (at most {MAX_TOPIC_NAME_LENGTH})"
    if _LEGAL.fullmatch(name) is None:
        found = _ILLEGAL_CHARACTER.search(name)
        assert found is not None
        return f"it contains {found.group()!r} at position {found.start()}"
    return None


def check_topic_name(name: str, where: str) -> str:
    """``name`` if legal, else ``InvalidTopicError`` saying what is wrong and where it came from."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidTopicError(
            f"durable-kafka: {where}: {name!r} is not a valid Kafka topic name: {problem}; "
            f"a topic name has 1 to {MAX_TOPIC_NAME_LENGTH} characters from "
            f"[a-zA-Z0-9._-] and is not '.' or '..'"
        )
    return name


class TopicNameCheck:
    """Checks the names of a ``topic`` column, each distinct name once per task."""

    def __init__(self) -> None:
        self._checked: set[str] = set()

    def check_all(self, names: list[str]) -> None:
        """Raise ``InvalidTopicError`` for the first illegal name not checked before."""
        for name in sorted(set(names) - self._checked):
            check_topic_name(name, "column 'topic'")
            self._checked.add(name)
