"""Kafka's rule for topic names, as its brokers apply it (``o.a.k.common.internals.Topic``).

A legal name is 1 to 249 characters from ``[a-zA-Z0-9._-]`` and is neither ``.`` nor ``..``.
A broker answers any other name with INVALID_TOPIC_EXCEPTION, which clients treat as final;
the agent does the same rather than UNKNOWN_TOPIC_OR_PARTITION, which they retry until their
delivery timeout.
"""

from __future__ import annotations

import functools

from durable_producer.topic_names import LEGAL_TOPIC_NAME as _LEGAL
from durable_producer.topic_names import MAX_TOPIC_NAME_LENGTH as MAX_TOPIC_NAME_LENGTH


def topic_name_problem(name: str | None) -> str | None:
    """Why ``name`` is not a legal Kafka topic name; None when it is."""
    if not name:
        return "the topic name is empty"
    if name in (".", ".."):
        return f"topic name {name!r} is reserved"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (
            f"topic name of {len(name)} characters is longer than the"
            f" {MAX_TOPIC_NAME_LENGTH} Kafka allows"
        )
    if _LEGAL.fullmatch(name) is None:
        return (
            f"topic name {name!r} has characters Kafka does not allow"
            " (only ASCII letters, digits, '.', '_' and '-')"
        )
    return None


@functools.lru_cache(maxsize=4096)
def is_legal_topic_name(name: str | None) -> bool:
    """``topic_name_problem(name) is None``, remembered (every produce request asks)."""
    return topic_name_problem(name) is None
