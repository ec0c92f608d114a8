"""Whether a librdkafka client is destroyed when the code under test says it is.

Other tests of the same process may leave clients whose threads come and go (a broker thread
ends, another starts), so a test cannot tell a client's own ``rdk:`` threads by comparing
snapshots. ``noting_destruction`` makes a subclass of a client type that notes its instances'
destruction (``__del__`` runs as the object is freed, just before ``rd_kafka_destroy``); run
the code with the garbage collector off, and only a dropped last reference frees it.
``librdkafka_threads`` counts the ``rdk:`` threads, for a check in a fresh child process;
``live_librdkafka_clients`` counts the clients themselves (each has one ``rdk:main`` thread).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def noting_destruction(client_type: type[Any]) -> tuple[type[Any], list[int]]:
    """A subclass of ``client_type`` and the list its instances append their id to when freed."""
    destroyed: list[int] = []

    class Noting(client_type):  # type: ignore[misc, valid-type]
        def __del__(self) -> None:
            destroyed.append(id(self))

    return Noting, destroyed


@contextlib.contextmanager
def clients_freed(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str
) -> Iterator[list[int]]:
    """``module.name`` (a client type) replaced by ``noting_destruction``'s subclass, the
    collector off inside: the ids of the clients freed so far."""
    noting, freed = noting_destruction(getattr(module, name))
    monkeypatch.setattr(module, name, noting)
    gc.disable()
    try:
        yield freed
    finally:
        gc.enable()


def librdkafka_threads(prefix: str = "rdk:") -> set[int]:
    """Thread ids of this process whose name starts with ``prefix`` (Linux ``/proc``)."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            name = (task / "comm").read_text()
        except OSError:
            continue  # the thread ended while we looked
        if name.startswith(prefix):
            found.add(int(task.name))
    return found


def live_librdkafka_clients() -> int:
    """How many librdkafka clients this process holds: each has exactly one ``rdk:main``."""
    return len(librdkafka_threads("rdk:main\n"))
