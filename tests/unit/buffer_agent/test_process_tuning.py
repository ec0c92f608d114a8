"""The process-wide settings the agent applies once it serves."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from durable_producer.buffer_agent.process_tuning import YOUNG_COLLECTION_THRESHOLD

REFAULTS_AFTER_FREE = textwrap.dedent(
    """
    import resource, sys
    from durable_producer.buffer_agent.process_tuning import keep_freed_memory

    if sys.argv[1] == "keep":
        assert keep_freed_memory()

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    buffers = [bytearray(1_000_000) for _ in range(40)]  # 40 request buffers of 1 MB
    del buffers
    before = faults()
    buffers = [bytearray(1_000_000) for _ in range(40)]  # the next 40
    print(faults() - before)
    """
)


def printed_by(script: str, mode: str) -> str:
    """What ``script`` prints, run in a fresh interpreter with ``mode`` as its argument."""
    result = subprocess.run(
        [sys.executable, "-c", script, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


def page_faults_of_reallocation(mode: str) -> int:
    return int(printed_by(REFAULTS_AFTER_FREE, mode))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_freed_request_buffers_are_reused_without_page_faults() -> None:
    # glibc's defaults hand the 40 MB back to the kernel and fault every page in again
    # (~10,000 faults); kept, the second round reuses the same pages.
    default = page_faults_of_reallocation("default")
    kept = page_faults_of_reallocation("keep")
    assert default > 5_000, f"expected glibc's defaults to refault, saw {default} faults"
    assert kept < default // 20, f"{kept} faults with freed memory kept, {default} without"


REFAULTS_AFTER_FREEING_SMALL_OBJECTS = textwrap.dedent(
    """
    import resource, sys
    from durable_producer.buffer_agent.process_tuning import keep_freed_arenas

    if sys.argv[1] == "keep":
        assert keep_freed_arenas()

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def read_ahead():  # one-record frames as the forwarder holds them: about 40 MB
        return [(n + 10**6, bytes(270), n + 5_000) for n in range(100_000)]

    frames = read_ahead()
    del frames  # acknowledged
    before = faults()
    frames = read_ahead()  # the next read-ahead
    print(faults() - before)
    """
)

COLLECTIONS_WHILE_READING_AHEAD = textwrap.dedent(
    """
    import gc, json, sys
    from durable_producer.buffer_agent.process_tuning import prepare_to_serve

    if sys.argv[1] == "serving":
        prepare_to_serve()
    before = [generation["collections"] for generation in gc.get_stats()]
    read_ahead = []
    for n in range(100_000):  # numbered frames: tuples of ints and bytes, as the forwarder's
        read_ahead.append((n + 10**6, b"x" * 200, 1, n + 5_000, 0))
    after = [generation["collections"] for generation in gc.get_stats()]
    print(json.dumps([a - b for a, b in zip(after, before)]))
    """
)


def collections_while_reading_ahead(mode: str) -> list[int]:
    counts: list[int] = json.loads(printed_by(COLLECTIONS_WHILE_READING_AHEAD, mode))
    return counts


def test_a_read_ahead_of_frames_costs_few_collections_once_serving() -> None:
    # CPython counts every tuple made as an allocation, untracked or not: by default 100,000
    # frames read ahead cost ~140 young collections and, every 100 of them, a full one that
    # walks every frame held; serving, a young collection every YOUNG_COLLECTION_THRESHOLD.
    young, _, _ = collections_while_reading_ahead("default")
    assert young > 100, f"expected CPython's default threshold to collect often, saw {young}"
    young, _, full = collections_while_reading_ahead("serving")
    assert young <= 100_000 // YOUNG_COLLECTION_THRESHOLD + 1, f"{young} young collections"
    assert full == 0, f"{full} full collections while reading ahead"


def test_freed_small_object_arenas_are_reused_without_page_faults() -> None:
    # CPython unmaps an arena once its last object is freed: the next read-ahead faults
    # ~40 MB of pages in again (~10,000 faults); with the freed arenas kept, it reuses them.
    pytest.importorskip("durable_producer.buffer_agent._arena_cache")
    default = int(printed_by(REFAULTS_AFTER_FREEING_SMALL_OBJECTS, "default"))
    kept = int(printed_by(REFAULTS_AFTER_FREEING_SMALL_OBJECTS, "keep"))
    assert default > 5_000, f"expected freed arenas to be unmapped and refaulted, saw {default}"
    assert kept < default // 20, f"{kept} faults with freed arenas kept, {default} without"


def test_released_arenas_go_back_to_the_kernel() -> None:
    # release_free_memory (after a burst) empties the cache: the memory leaves the process.
    pytest.importorskip("durable_producer.buffer_agent._arena_cache")
    script = textwrap.dedent(
        """
        from durable_producer.buffer_agent import _arena_cache
        from durable_producer.buffer_agent.process_tuning import (
            keep_freed_arenas, release_free_memory,
        )

        assert keep_freed_arenas()
        frames = [(n, bytes(270)) for n in range(100_000)]
        del frames
        print(_arena_cache.held())
        release_free_memory()
        print(_arena_cache.held())
        """
    )
    held, after = (int(line) for line in printed_by(script, "").split())
    assert held >= 16 << 20, f"only {held} bytes of freed arenas held"
    assert after == 0, f"{after} bytes still held after release_free_memory"
