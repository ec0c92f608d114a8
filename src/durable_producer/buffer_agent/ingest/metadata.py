"""Partition counts and size limits of the real cluster's topics, cached on the buffer volume.

The agent tells its clients it leads every partition of every topic, but the partition *count*
must be the real cluster's, or records land in partitions that do not exist. Counts come from
a :class:`MetadataSource` (wired to the cluster, e.g. confluent-kafka's ``list_topics``) and are
kept in ``DATA/state/metadata.json`` so the agent keeps answering during an outage and after a
restart. With each count comes the topic's ``max.message.bytes`` where the cluster says it
(``kafka.cluster_metadata``): the produce path refuses a larger batch with MESSAGE_TOO_LARGE,
as the topic would, rather than acknowledge what Kafka will refuse.

The cache file is replaced through a temporary copy, which needs new blocks: on a full disk
the write is skipped with one log line and the previous file stays; the counts in memory are
current and are written at the next refresh from the cluster once there is room. The
consequence: an agent restarted before that answers from the older counts until the cluster
is reachable again.

A topic never seen before while the cluster is unreachable gets ``default_partitions`` if one is
configured; otherwise it is answered ``UNAVAILABLE`` (the ingest maps that to the retriable
LEADER_NOT_AVAILABLE, so clients keep retrying metadata until the cluster answers).

A topic the cluster does not have is treated as the cluster would treat it: the source asks for
it the way a producer does (``kafka.cluster_metadata``), so a cluster that creates topics on
first use creates it. While it is being created (the source reports 0 partitions) it is
``UNAVAILABLE`` too, and the client's next metadata request gets the real partition count. A
topic the cluster neither has nor creates is ``MISSING``: the ingest answers it with a
non-retriable error, so clients fail at once instead of retrying for 30 s or more. A missing
topic is asked about again after ``missing_recheck_s`` (it may have been created meanwhile).

One answer never takes back what the cache knows. A broker with stale metadata (a rolling
restart, a lagging replica of the metadata log) can say a topic does not exist, or has fewer
partitions: a topic the cache knows stays known, and a partition count never goes down,
until a second answer at least ``missing_recheck_s`` after the first says the same (Kafka
never removes partitions; only a topic deleted and created again has fewer). Meanwhile the
cache answers what it knew and asks again.

The topics the cache knows to be missing are bounded (``MAX_MISSING_TOPICS``, oldest first):
a client asking for ever new names costs no memory.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeGuard

from durable_producer.buffer_agent.kafka.cluster_metadata import TopicFacts
from durable_producer.buffer_agent.volume.atomic_file import write_atomic
from durable_producer.buffer_agent.volume.state_file import StateDamage, read_json_state, set_aside

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
_FORMAT_VERSION = 1
MAX_MISSING_TOPICS = 1024
"""Topics remembered as missing; the oldest is forgotten first (asked about again)."""
MAX_DEFAULT_PARTITIONS = 100_000
"""``--default-partitions`` at most: a metadata answer of 100,000 partitions is a few MB. Also
the most a cached count may be: ``metadata.json`` saying 3,000,000 took one client's metadata
request to 763 MB RSS."""
MAX_MESSAGE_BYTES_LIMIT = 2**31 - 1
"""The largest ``max.message.bytes`` a topic can have (a 32-bit int config in Kafka)."""


class MetadataSource(Protocol):
    """What the cache asks the cluster: any callable of this shape (``kafka.cluster_metadata``)."""

    def __call__(self, topics: Sequence[str], /) -> Mapping[str, TopicFacts]:
        """Facts of those ``topics`` that exist on the cluster.

        Topics absent from the result do not exist (and the cluster did not create them when
        asked); a partition count of 0 means "being created". Raise any exception when the
        cluster cannot be reached. Called from a worker thread; may block up to its own
        timeout.
        """
        ...


class TopicStatus(enum.Enum):
    KNOWN = "known"
    MISSING = "missing"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    status: TopicStatus
    partitions: int = 0
    from_default: bool = False


@dataclass(slots=True)
class _Entry:
    partitions: int
    refreshed_at: float  # wall-clock seconds, persisted
    max_message_bytes: int | None = None


class MetadataCache:
    def __init__(
        self,
        state_dir: Path,
        source: MetadataSource | None,
        *,
        default_partitions: int | None = None,
        refresh_after_s: float = 60.0,
        missing_recheck_s: float = 5.0,
        source_timeout_s: float = 10.0,
        retry_after_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if default_partitions is not None and default_partitions < 1:
            raise ValueError("default_partitions must be at least 1")
        self._path = Path(state_dir) / METADATA_FILE
        self._source = source
        self._default_partitions = default_partitions
        self._refresh_after_s = refresh_after_s
        self._missing_recheck_s = missing_recheck_s
        self._source_timeout_s = source_timeout_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._failed_at: float | None = None
        self._background: asyncio.Task[None] | None = None
        self.damage: StateDamage | None = None
        """The cache file was unusable at start."""
        self._entries: dict[str, _Entry] = self._load()
        self._save_failing = False
        self._missing: dict[str, float] = {}
        self._doubted: dict[str, float] = {}
        """Known topics one answer said are missing or smaller, and when (module doc)."""
        self._creating: set[str] = set()
        self._refresh_lock = asyncio.Lock()

    def _load(self) -> dict[str, _Entry]:
        fallback = "partition counts are asked of the cluster again"
        read = read_json_state(self._path, fallback=fallback)
        self.damage = read.damage
        if read.document is None:
            return {}
        now = self._clock()
        try:
            return {
                str(name): _entry_of(entry, now)
                for name, entry in read.document["topics"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            self.damage = set_aside(self._path, f"not a metadata cache ({error!r})", fallback)
            return {}

    def _save(self) -> None:
        document = {
            "version": _FORMAT_VERSION,
            "topics": {
                name: {
                    "partitions": entry.partitions,
                    "refreshed_at": entry.refreshed_at,
                    "max_message_bytes": entry.max_message_bytes,
                }
                for name, entry in sorted(self._entries.items())
            },
        }
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._path, json.dumps(document, indent=1).encode())
        except OSError as error:
            if not self._save_failing:
                self._save_failing = True
                log.warning(
                    "cannot write the metadata cache %s (%s); keeping the previous file and"
                    " serving the current partition counts from memory",
                    self._path,
                    error,
                )
            return
        if self._save_failing:
            self._save_failing = False
            log.info("metadata cache %s written again", self._path)

    def cached_partitions(self, topic: str) -> int | None:
        """Partition count known without asking the cluster (hot path: a dict lookup)."""
        entry = self._entries.get(topic)
        if entry is not None:
            return entry.partitions
        return self._default_partitions

    def max_message_bytes(self, topic: str) -> int | None:
        """The topic's ``max.message.bytes`` if the cluster said it (any thread; a lookup)."""
        entry = self._entries.get(topic)
        return None if entry is None else entry.max_message_bytes

    def heard_max_message_bytes(self, topic: str, limit: int) -> None:
        """The cluster told the forwarder ``topic``'s ``max.message.bytes`` (asked after it
        refused a batch as too large): the produce path refuses larger batches from now on,
        not from the next refresh (up to ``refresh_after_s`` of batches acknowledged, then
        refused). On the ingest's loop, as every write of the cache."""
        entry = self._entries.get(topic)
        if entry is None or entry.max_message_bytes == limit:
            return
        log.info(
            "topic %s: max.message.bytes %d (was %s), as Kafka said after refusing a batch",
            topic,
            limit,
            entry.max_message_bytes,
        )
        self._entries[topic] = _Entry(entry.partitions, entry.refreshed_at, limit)
        self._save()

    def cached_topics(self) -> list[str]:
        return sorted(self._entries)

    def _is_fresh(self, topic: str, now: float) -> bool:
        entry = self._entries.get(topic)
        doubted_since = self._doubted.get(topic)
        if doubted_since is not None:  # ask again once a confirmation would count
            return now - doubted_since < self._missing_recheck_s
        if entry is not None:
            return now - entry.refreshed_at < self._refresh_after_s
        missing_since = self._missing.get(topic)
        return missing_since is not None and now - missing_since < self._missing_recheck_s

    def _answer(self, topic: str) -> TopicInfo:
        entry = self._entries.get(topic)
        if entry is not None:
            return TopicInfo(TopicStatus.KNOWN, entry.partitions)
        if topic in self._missing:
            return TopicInfo(TopicStatus.MISSING)
        if topic in self._creating:
            return TopicInfo(TopicStatus.UNAVAILABLE)
        if self._default_partitions is not None:
            return TopicInfo(TopicStatus.KNOWN, self._default_partitions, from_default=True)
        return TopicInfo(TopicStatus.UNAVAILABLE)

    def apply_source_result(
        self, requested: Iterable[str], facts: Mapping[str, TopicFacts], now: float
    ) -> None:
        """Record what the cluster said about ``requested`` topics; persist if anything changed."""
        changed = False
        for topic in requested:
            found = facts.get(topic)
            count = None if found is None else found.partitions
            previous = self._entries.get(topic)
            if count is None or (previous is not None and 0 < count < previous.partitions):
                if previous is not None and not self._confirmed(topic, count, now):
                    continue  # one answer does not take back what the cache knows
            else:
                self._doubted.pop(topic, None)
            if count is None:
                self._creating.discard(topic)
                self._remember_missing(topic, now)
                changed |= self._entries.pop(topic, None) is not None
                continue
            self._missing.pop(topic, None)
            if count < 1:
                if topic not in self._entries:
                    self._creating.add(topic)
                continue
            self._creating.discard(topic)
            assert found is not None
            limit = found.max_message_bytes
            if limit is None and previous is not None:
                limit = previous.max_message_bytes  # not described this time: keep what was
            if previous is None or (previous.partitions, previous.max_message_bytes) != (
                count,
                limit,
            ):
                changed = True
                if previous is not None:
                    log.info(
                        "topic %s: %d partitions, max.message.bytes %s (were %d, %s)",
                        topic,
                        count,
                        limit,
                        previous.partitions,
                        previous.max_message_bytes,
                    )
            self._entries[topic] = _Entry(count, now, limit)
        if changed or self._save_failing:
            self._save()

    def _confirmed(self, topic: str, count: int | None, now: float) -> bool:
        """Whether this answer (missing: None, or fewer partitions) confirms an earlier one
        at least ``missing_recheck_s`` ago; the first such answer is only noted."""
        since = self._doubted.setdefault(topic, now)
        if now - since < self._missing_recheck_s or since == now:
            if since == now:
                said = "does not exist" if count is None else f"has {count} partitions"
                log.warning(
                    "the cluster says topic %s %s, but it was known with %d partitions;"
                    " keeping that until a second answer at least %g s later says the same",
                    topic,
                    said,
                    self._entries[topic].partitions,
                    self._missing_recheck_s,
                )
            return False
        del self._doubted[topic]
        return True

    def _remember_missing(self, topic: str, now: float) -> None:
        self._missing.pop(topic, None)
        self._missing[topic] = now
        while len(self._missing) > MAX_MISSING_TOPICS:
            del self._missing[next(iter(self._missing))]

    async def lookup(self, topics: Sequence[str] | None) -> dict[str, TopicInfo]:
        """Partition counts for ``topics`` (``None``: every cached topic).

        Topics never seen are fetched from the source before answering; stale cached ones are
        answered from the cache and refreshed in the background. A failing or slow source never
        fails the lookup, and after a failure the source is left alone for ``retry_after_s``.
        """
        if topics is None:
            return {name: self._answer(name) for name in self.cached_topics()}
        now = self._clock()
        stale = [topic for topic in dict.fromkeys(topics) if not self._is_fresh(topic, now)]
        if stale and self._source is not None and not self._backing_off(now):
            unseen = [topic for topic in stale if topic not in self._entries]
            if unseen:
                await self._refresh(stale)
            elif self._background is None or self._background.done():
                self._background = asyncio.create_task(self._refresh(stale))
        return {topic: self._answer(topic) for topic in topics}

    def _backing_off(self, now: float) -> bool:
        return self._failed_at is not None and now - self._failed_at < self._retry_after_s

    async def _refresh(self, topics: list[str]) -> None:
        assert self._source is not None
        async with self._refresh_lock:
            now = self._clock()
            topics = [topic for topic in topics if not self._is_fresh(topic, now)]
            if not topics or self._backing_off(now):
                return
            try:
                counts = await asyncio.wait_for(
                    asyncio.to_thread(self._source, topics), self._source_timeout_s
                )
            except Exception as exc:
                self._failed_at = self._clock()
                log.warning(
                    "cluster metadata unavailable for %s (%s: %s); serving cached partition counts",
                    ", ".join(topics),
                    type(exc).__name__,
                    exc,
                )
                return
            self._failed_at = None
            self.apply_source_result(topics, counts, self._clock())

    async def close(self) -> None:
        """Wait for a background refresh, if one is running."""
        if self._background is not None and not self._background.done():
            await asyncio.gather(self._background, return_exceptions=True)


def _entry_of(entry: Mapping[str, object], now: float) -> _Entry:
    """A cached topic as ``_save`` wrote it; ValueError or TypeError for anything else.

    Out of range is damage too: 0 or fewer partitions made every produce to the topic time
    out, millions took the agent past its memory limit, ``1e400`` (a float, inf) raised
    OverflowError; a ``max.message.bytes`` below 1 refuses every batch. A ``refreshed_at``
    in the future (the clock set back) counts from now, so the entry is refreshed on time."""
    partitions = _whole(entry["partitions"], "partitions", 1, MAX_DEFAULT_PARTITIONS)
    limit = entry.get("max_message_bytes")
    if limit is not None:
        limit = _whole(limit, "max_message_bytes", 1, MAX_MESSAGE_BYTES_LIMIT)
    refreshed_at = entry["refreshed_at"]
    if not _is_number(refreshed_at) or not 0 <= refreshed_at < math.inf:
        raise ValueError(f"refreshed_at is {refreshed_at!r}, not a time")
    return _Entry(partitions, min(float(refreshed_at), now), limit)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object, name: str, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{name} is {value!r}, not a whole number in {least}..{most}")
    return value
