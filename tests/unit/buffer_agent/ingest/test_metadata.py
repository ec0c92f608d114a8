"""metadata_cache: partition counts from the cluster, cached on the volume."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from durable_producer.buffer_agent.ingest.metadata import (
    MAX_DEFAULT_PARTITIONS,
    MAX_MESSAGE_BYTES_LIMIT,
    MAX_MISSING_TOPICS,
    METADATA_FILE,
    MetadataCache,
    TopicInfo,
    TopicStatus,
)
from durable_producer.buffer_agent.kafka.cluster_metadata import TopicFacts
from support.clock import Clock


class Cluster:
    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions
        self.limits: dict[str, int] = {}
        self.reachable = True
        self.delay = 0.0
        self.calls: list[list[str]] = []

    def __call__(self, topics: Sequence[str]) -> Mapping[str, TopicFacts]:
        self.calls.append(list(topics))
        if self.delay:
            threading.Event().wait(self.delay)
        if not self.reachable:
            raise ConnectionError("no route to cluster")
        return {
            topic: TopicFacts(self.partitions[topic], self.limits.get(topic))
            for topic in topics
            if topic in self.partitions
        }


def lookup(cache: MetadataCache, topics: list[str] | None) -> dict[str, TopicInfo]:
    async def scenario() -> dict[str, TopicInfo]:
        result = await cache.lookup(topics)
        await cache.close()
        return result

    return asyncio.run(scenario())


def test_counts_come_from_the_cluster_and_are_persisted(tmp_path: Path) -> None:
    cluster = Cluster({"orders": 6})
    cache = MetadataCache(tmp_path, cluster)
    assert lookup(cache, ["orders"]) == {"orders": TopicInfo(TopicStatus.KNOWN, 6)}
    stored = json.loads((tmp_path / METADATA_FILE).read_text())
    assert stored["topics"]["orders"]["partitions"] == 6
    assert cache.cached_partitions("orders") == 6


def test_cache_survives_restart_during_an_outage(tmp_path: Path) -> None:
    cluster = Cluster({"orders": 6})
    lookup(MetadataCache(tmp_path, cluster), ["orders"])
    cluster.reachable = False
    clock = Clock()
    clock.now += 10_000  # stale
    restarted = MetadataCache(tmp_path, cluster, clock=clock)
    assert restarted.cached_partitions("orders") == 6
    assert lookup(restarted, ["orders"]) == {"orders": TopicInfo(TopicStatus.KNOWN, 6)}
    assert lookup(restarted, None) == {"orders": TopicInfo(TopicStatus.KNOWN, 6)}


def test_unknown_topic_during_outage_is_unavailable_or_default(tmp_path: Path) -> None:
    cluster = Cluster({})
    cluster.reachable = False
    assert lookup(MetadataCache(tmp_path, cluster), ["new"])["new"].status is (
        TopicStatus.UNAVAILABLE
    )
    with_default = MetadataCache(tmp_path, cluster, default_partitions=3)
    info = lookup(with_default, ["new"])["new"]
    assert info == TopicInfo(TopicStatus.KNOWN, 3, from_default=True)
    assert not (tmp_path / METADATA_FILE).exists()  # a guess is never cached as truth


def test_topic_missing_on_the_cluster(tmp_path: Path) -> None:
    cache = MetadataCache(tmp_path, Cluster({"a": 1}))
    assert lookup(cache, ["nope"])["nope"].status is TopicStatus.MISSING


def test_fresh_entries_do_not_hit_the_cluster(tmp_path: Path) -> None:
    cluster = Cluster({"a": 2})
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, refresh_after_s=60, clock=clock)
    lookup(cache, ["a"])
    lookup(cache, ["a"])
    assert len(cluster.calls) == 1
    clock.now += 61
    cluster.partitions["a"] = 4
    assert lookup(cache, ["a"])["a"].partitions == 2  # stale answer now, refreshed behind
    assert cache.cached_partitions("a") == 4
    assert len(cluster.calls) == 2


def test_failures_back_off(tmp_path: Path) -> None:
    cluster = Cluster({})
    cluster.reachable = False
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, retry_after_s=5, clock=clock)
    lookup(cache, ["x"])
    lookup(cache, ["x"])
    assert len(cluster.calls) == 1
    clock.now += 6
    lookup(cache, ["x"])
    assert len(cluster.calls) == 2


def test_slow_cluster_is_bounded_by_timeout(tmp_path: Path) -> None:
    cluster = Cluster({"a": 1})
    cluster.delay = 1.0
    cache = MetadataCache(tmp_path, cluster, source_timeout_s=0.1)
    assert lookup(cache, ["a"])["a"].status is TopicStatus.UNAVAILABLE


def test_corrupt_cache_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / METADATA_FILE).write_text("[1, 2")
    assert MetadataCache(tmp_path, None).cached_topics() == []


def test_default_partitions_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MetadataCache(tmp_path, None, default_partitions=0)


def test_topic_being_created_is_unavailable_then_known(tmp_path: Path) -> None:
    """A cluster that creates topics on request reports 0 partitions until it is done."""
    cluster = Cluster({"fresh": 0})
    cache = MetadataCache(tmp_path, cluster, default_partitions=9)
    assert lookup(cache, ["fresh"])["fresh"] == TopicInfo(TopicStatus.UNAVAILABLE)
    cluster.partitions["fresh"] = 3
    assert lookup(cache, ["fresh"])["fresh"] == TopicInfo(TopicStatus.KNOWN, 3)
    assert len(cluster.calls) == 2


def test_missing_topic_is_asked_about_again_soon(tmp_path: Path) -> None:
    cluster = Cluster({})
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, missing_recheck_s=5, refresh_after_s=60, clock=clock)
    assert lookup(cache, ["later"])["later"].status is TopicStatus.MISSING
    assert lookup(cache, ["later"])["later"].status is TopicStatus.MISSING
    assert len(cluster.calls) == 1
    cluster.partitions["later"] = 2  # created by hand meanwhile
    clock.now += 6
    assert lookup(cache, ["later"])["later"] == TopicInfo(TopicStatus.KNOWN, 2)


def test_a_full_disk_keeps_the_old_cache_file_and_the_new_counts_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster({"orders": 3})
    cache = MetadataCache(tmp_path, cluster)
    lookup(cache, ["orders"])
    before = (tmp_path / METADATA_FILE).read_bytes()
    real_write = os.write

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    cluster.partitions["orders"] = 6
    cluster.partitions["new"] = 2
    cache.apply_source_result(["orders", "new"], cluster(["orders", "new"]), 2_000.0)
    cache.apply_source_result(["orders"], cluster(["orders"]), 2_001.0)
    assert cache.cached_partitions("orders") == 6 and cache.cached_partitions("new") == 2
    assert (tmp_path / METADATA_FILE).read_bytes() == before
    assert sum("cannot write the metadata cache" in r.message for r in caplog.records) == 1
    monkeypatch.setattr(os, "write", real_write)
    cache.apply_source_result(["orders"], cluster(["orders"]), 2_002.0)  # unchanged, retried
    assert json.loads((tmp_path / METADATA_FILE).read_text())["topics"]["new"]["partitions"] == 2


def test_one_answer_that_a_known_topic_is_missing_changes_nothing(tmp_path: Path) -> None:
    """Review finding 9: one stale broker answer (UNKNOWN_TOPIC_OR_PART during a rolling
    restart) turned a live topic into MISSING, a non-retriable error for every client, and
    dropped it from metadata.json."""
    cluster = Cluster({"orders": 12})
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, missing_recheck_s=5, refresh_after_s=60,
                          clock=clock)  # fmt: skip
    assert lookup(cache, ["orders"])["orders"] == TopicInfo(TopicStatus.KNOWN, 12)
    del cluster.partitions["orders"]  # the stale broker
    clock.now += 61

    lookup(cache, ["orders"])  # answered from the cache, refreshed behind: "missing"

    assert lookup(cache, ["orders"])["orders"] == TopicInfo(TopicStatus.KNOWN, 12)
    stored = json.loads((tmp_path / METADATA_FILE).read_text())
    assert stored["topics"]["orders"]["partitions"] == 12
    cluster.partitions["orders"] = 12  # the next answer is right again
    clock.now += 6
    lookup(cache, ["orders"])
    clock.now += 6
    del cluster.partitions["orders"]  # one stale answer again: still only one
    lookup(cache, ["orders"])
    assert lookup(cache, ["orders"])["orders"].status is TopicStatus.KNOWN


def test_a_known_topic_is_missing_once_two_answers_apart_say_so(tmp_path: Path) -> None:
    cluster = Cluster({"gone": 3})
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, missing_recheck_s=5, refresh_after_s=60,
                          clock=clock)  # fmt: skip
    lookup(cache, ["gone"])
    del cluster.partitions["gone"]  # deleted for real
    clock.now += 61
    lookup(cache, ["gone"])
    clock.now += 2
    lookup(cache, ["gone"])  # too soon to ask again: no confirmation yet
    assert lookup(cache, ["gone"])["gone"].status is TopicStatus.KNOWN
    clock.now += 4
    lookup(cache, ["gone"])  # asked again 6 s after the first answer: confirmed

    assert lookup(cache, ["gone"])["gone"].status is TopicStatus.MISSING
    assert "gone" not in json.loads((tmp_path / METADATA_FILE).read_text())["topics"]


def test_a_partition_count_never_goes_down_on_one_answer(tmp_path: Path) -> None:
    cluster = Cluster({"t": 12})
    clock = Clock()
    cache = MetadataCache(tmp_path, cluster, missing_recheck_s=5, refresh_after_s=60,
                          clock=clock)  # fmt: skip
    lookup(cache, ["t"])
    cluster.partitions["t"] = 6  # a lagging broker
    clock.now += 61
    lookup(cache, ["t"])
    assert cache.cached_partitions("t") == 12
    cluster.partitions["t"] = 16  # partitions added: taken at once
    clock.now += 6
    lookup(cache, ["t"])
    assert cache.cached_partitions("t") == 16
    cluster.partitions["t"] = 4  # deleted and created again with fewer
    clock.now += 61
    lookup(cache, ["t"])
    clock.now += 6
    lookup(cache, ["t"])
    assert cache.cached_partitions("t") == 4


def test_missing_topics_remembered_are_bounded(tmp_path: Path) -> None:
    """Review finding 16: every distinct unknown name a client asked about was kept."""
    cache = MetadataCache(tmp_path, Cluster({}))
    for number in range(3 * MAX_MISSING_TOPICS):
        cache.apply_source_result([f"no-such-{number}"], {}, 1000.0 + number)
    assert len(cache._missing) == MAX_MISSING_TOPICS
    assert f"no-such-{3 * MAX_MISSING_TOPICS - 1}" in cache._missing


def test_a_topics_size_limit_is_cached_and_kept_when_not_described_again(tmp_path: Path) -> None:
    cluster = Cluster({"small": 1, "plain": 2})
    cluster.limits["small"] = 20_000
    cache = MetadataCache(tmp_path, cluster)
    lookup(cache, ["small", "plain"])
    assert cache.max_message_bytes("small") == 20_000
    assert cache.max_message_bytes("plain") is None  # not described: unknown, not refused
    assert cache.max_message_bytes("never-seen") is None
    del cluster.limits["small"]  # DescribeConfigs not answered this time
    cache.apply_source_result(["small"], cluster(["small"]), 2_000.0)
    assert cache.max_message_bytes("small") == 20_000
    restarted = MetadataCache(tmp_path, None)
    assert restarted.max_message_bytes("small") == 20_000


def test_a_cache_file_without_size_limits_still_loads(tmp_path: Path) -> None:
    document = {"version": 1, "topics": {"old": {"partitions": 4, "refreshed_at": 1.0}}}
    (tmp_path / METADATA_FILE).write_text(json.dumps(document))
    cache = MetadataCache(tmp_path, None)
    assert cache.cached_partitions("old") == 4
    assert cache.max_message_bytes("old") is None


def test_a_limit_the_forwarder_heard_takes_effect_at_once_and_is_kept(tmp_path: Path) -> None:
    """Kafka refused a batch as too large and said the topic's limit: the produce path
    refuses larger batches from now on, not from the next refresh, and after a restart."""
    cluster = Cluster({"shrunk": 1})
    cluster.limits["shrunk"] = 1_048_588
    cache = MetadataCache(tmp_path, cluster)
    lookup(cache, ["shrunk"])
    cache.heard_max_message_bytes("shrunk", 2_000)
    assert cache.max_message_bytes("shrunk") == 2_000
    assert cache.cached_partitions("shrunk") == 1
    assert MetadataCache(tmp_path, None).max_message_bytes("shrunk") == 2_000
    cache.heard_max_message_bytes("never-asked", 2_000)  # no client wrote to it: not cached
    assert cache.max_message_bytes("never-asked") is None
    assert lookup(cache, ["shrunk"])["shrunk"].partitions == 1
    assert len(cluster.calls) == 1, "still fresh: the refresh comes on its own schedule"


def _cached(partitions: str, refreshed_at: str = "1000", limit: str = "null") -> str:
    return (
        f'{{"version": 1, "topics": {{"t1": {{"partitions": {partitions},'
        f' "refreshed_at": {refreshed_at}, "max_message_bytes": {limit}}}}}}}'
    )


@pytest.mark.parametrize(
    "text",
    [
        _cached("-1"),  # every produce to t1 timed out
        _cached("0"),
        _cached(str(MAX_DEFAULT_PARTITIONS + 1)),
        _cached("3000000"),  # one client Metadata request took the agent to 763 MB RSS
        _cached("1e400"),  # a float (inf): an OverflowError traceback, exit 1
        _cached("2.5"),
        _cached("true"),
        _cached("3", limit="0"),  # every batch refused as too large
        _cached("3", limit="-5"),
        _cached("3", limit=str(MAX_MESSAGE_BYTES_LIMIT + 1)),
        _cached("3", limit="1e400"),
        _cached("3", refreshed_at="1e400"),  # never refreshed
        _cached("3", refreshed_at="NaN"),
        _cached("3", refreshed_at="-1"),
        _cached("3", refreshed_at='"yesterday"'),
    ],
    ids=[
        "partitions=-1", "partitions=0", "partitions=max+1", "partitions=3000000",
        "partitions=1e400", "partitions=2.5", "partitions=true", "limit=0", "limit=-5",
        "limit=int32+1", "limit=1e400", "refreshed_at=1e400", "refreshed_at=NaN",
        "refreshed_at=-1", "refreshed_at=text",
    ],
)
def test_a_cached_topic_out_of_range_is_damage_and_set_aside(tmp_path: Path, text: str) -> None:
    (tmp_path / METADATA_FILE).write_text(text)

    cache = MetadataCache(tmp_path, source=None, clock=Clock())

    assert cache.damage is not None and cache.cached_topics() == []
    assert (tmp_path / f"{METADATA_FILE}.damaged").read_text() == text


def test_cached_topics_at_the_bounds_are_kept(tmp_path: Path) -> None:
    text = _cached(str(MAX_DEFAULT_PARTITIONS), limit=str(MAX_MESSAGE_BYTES_LIMIT))
    (tmp_path / METADATA_FILE).write_text(text)
    cache = MetadataCache(tmp_path, source=None, clock=Clock())
    assert cache.damage is None and cache.cached_partitions("t1") == MAX_DEFAULT_PARTITIONS


def test_a_refresh_time_in_the_future_counts_from_now(tmp_path: Path) -> None:
    """The clock set back: the entry is used, and refreshed after ``refresh_after_s`` from now,
    not once the clock reaches the stored time."""
    clock = Clock(1000.0)
    (tmp_path / METADATA_FILE).write_text(_cached("3", refreshed_at=str(time.time() * 2)))
    cache = MetadataCache(tmp_path, source=None, refresh_after_s=60, clock=clock)
    assert cache.damage is None and cache.cached_partitions("t1") == 3
    assert cache._is_fresh("t1", 1059.0) and not cache._is_fresh("t1", 1061.0)
