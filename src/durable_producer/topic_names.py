"""Kafka's rule for topic names, as its brokers apply it (``o.a.k.common.internals.Topic``).

A legal name is 1 to 249 characters from ``[a-zA-Z0-9._-]`` and is neither ``.`` nor ``..``.
Defined once here for the agent (``buffer_agent/kafka/topic_names.py``, which answers an
illegal name with INVALID_TOPIC_EXCEPTION) and the Spark data source
(``spark_integration/topic_names.py``, which refuses it before anything is written); each
words its refusals for its own readers. A leaf: imports nothing from the package.
"""

from __future__ import annotations

import re
from typing import Final

MAX_TOPIC_NAME_LENGTH: Final = 249
"""Kafka's limit: 255 minus room for a partition suffix in directory names."""

RESERVED_TOPIC_NAMES: Final = frozenset({".", ".."})
"""Made of legal characters, but refused: they name directories."""

LEGAL_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]+")
"""A name made only of the characters Kafka allows (``fullmatch``; the length is apart)."""

ILLEGAL_TOPIC_CHARACTER: Final = re.compile(r"[^a-zA-Z0-9._-]")
"""The first character Kafka does not allow (``search``), to say where a name goes wrong."""
