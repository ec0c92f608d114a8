"""Hostile clients against a real agent process while a real producer keeps producing.

300 connections each send a 4 MiB size prefix and 1 KB, or 64 KiB for every third (before:
the agent allocated the announced 4 MiB for each, 62 MB -> 1.3 GB RSS, never returned; past
the 16 KiB staging buffer, the announced size is taken only while half the request budget
stays free), 50 send garbage and 20
trickle a request at one byte a second. In rounds of a phase alone then a phase under attack
(each begun with the forwarder idle), the producer's median throughput under attack stays
within 2x of its median alone, the RSS the attack adds stays under a stated bound, RSS returns
near its level before the attack once the hostile clients leave, and nothing acknowledged is
lost (docs/benchmarks.md, "Hostile clients").
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import KafkaBroker, consume_all, create_topic
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "hostile"
PARTITIONS = 4
RECORDS = 30_000
"""Records of one phase (alone or under attack)."""
ROUNDS = 3
"""Rounds of a phase alone then one under attack; throughputs are compared by their medians.

One phase of 100,000 records each, alone then under attack, decided nothing on a shared
2-core machine: with a busy loop or other integration tests beside it, the rate alone ranged
from 47,000 to 301,000 rec/s between runs (and 57,000-148,000 under attack, uncorrelated with
it: librdkafka's batches grow when its requests are answered late), and 2 of 20 such runs
failed the 2x ratio with no hostile cost at all (137,686 alone vs 51,448 under attack)."""
HALF_SENT, GARBAGE, SLOW = 300, 50, 20
ATTACK_RSS_BOUND_MB = 64 * 1.048576 + (HALF_SENT + GARBAGE + SLOW) * 16 / 1024 + 8
"""What the attack may add to RSS over its level just before (the forwarder idle): the 64 MiB
request-memory budget (67.1 MB), every hostile connection's 16 KiB staging buffer (5.8 MB),
and 8 MB for the forwarder's read-ahead of the phase under attack beyond what the phase
alone already made the heap keep (a phase is ~7 MB of batches). Measured additions: 48-54 MB
(up to half the budget holds announced sizes, 45.6 MB of requests held at the peak); one
82 MB with 100,000-record phases when the forwarder lagged by most of the phase under attack.
The absolute peak (up to 155 MB seen) is no bound: the level before it is the forwarder's
read-ahead (up to 64 MiB) and glibc's kept free heap, decided by how far Kafka lags. Allocating
the announced 4 MiB per half-sent connection again would add ~1.2 GB."""
RSS_RETURN_MARGIN_MB = 8
"""The agent trims its heap 2-10 s after a burst of closed connections; measured after it, with
100,000-record phases: from 6 MB below to 4 MB above the level before the attack, which
already held glibc's kept free heap. RSS rises with the first records stored (58-105 bytes
a record over 200,000-record runs, not given back by a trim) and then levels off: it is the
forwarder thread's glibc arena, which ``malloc_trim`` does not shrink (docs/benchmarks.md,
"RSS vs records stored"); a phase is 30,000 records to keep that rise small."""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def produce(bootstrap: str, tag: bytes, count: int) -> tuple[float, set[bytes]]:
    """Produce ``count`` 200 B records; (records per second, values acknowledged)."""
    acknowledged: set[bytes] = set()
    failures: list[object] = []

    def report(error: object, message: object) -> None:
        if error is None:
            acknowledged.add(message.value())  # type: ignore[attr-defined]
        else:
            failures.append(error)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "log_level": 2,
        }
    )
    started = time.monotonic()
    for index in range(count):
        value = (b"%s-%08d-" % (tag, index)).ljust(200, b"x")
        while True:
            try:
                producer.produce(TOPIC, value, partition=index % PARTITIONS, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        if index % 1000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    seconds = time.monotonic() - started
    assert not failures, failures[:3]
    return count / seconds, acknowledged


class Hostiles:
    """The hostile connections; a thread trickles the slow ones and samples the agent's RSS."""

    def __init__(self, bootstrap: str, pid: int) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self._address = (host, int(port))
        self._pid = pid
        self.sockets: list[socket.socket] = []
        self.peak_rss_mb = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=5)
        self.sockets.append(sock)
        return sock

    def __enter__(self) -> Hostiles:
        for n in range(HALF_SENT):
            sent = 64 << 10 if n % 3 == 0 else 1024
            self.connect().sendall(struct.pack(">i", 4 << 20) + os.urandom(sent))
        for _ in range(GARBAGE):
            with contextlib.suppress(OSError):  # closed by the agent already: fine
                self.connect().sendall(os.urandom(4096))
        slow = [self.connect() for _ in range(SLOW)]
        for target in (self._sample, lambda: self._trickle(slow)):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_rss_mb = max(self.peak_rss_mb, rss_mb(self._pid))
            time.sleep(0.1)

    def _trickle(self, slow: list[socket.socket]) -> None:
        request = struct.pack(">ihhi", 96, 18, 3, 1) + os.urandom(88)  # an ApiVersions
        for byte in range(len(request)):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(request[byte : byte + 1])
            if self._stop.wait(1.0):
                return

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentProcess, str]]:
    with KafkaBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        process = AgentProcess(tmp_path / "volume", broker.bootstrap, log_path=tmp_path / "a.log")
        with process:
            yield process, broker.bootstrap


def forwarded_all(process: AgentProcess) -> bool:
    """Every record ingested is acknowledged by Kafka (metrics are published once a second)."""
    metrics = process.metrics()
    return (
        metrics["durable_agent_forwarded_records_total"]
        >= metrics["durable_agent_ingest_records_total"]
    )


def test_hostile_clients_cost_neither_memory_nor_throughput_nor_records(
    agent: tuple[AgentProcess, str],
) -> None:
    process, broker = agent
    assert process.process is not None
    pid = process.process.pid
    produce(process.bootstrap, b"warm-up", RECORDS)
    acknowledged: set[bytes] = set()
    rates: dict[str, list[float]] = {"alone": [], "attack": []}

    def idle() -> None:  # each phase starts from the same state: the forwarder caught up
        wait_for(lambda: forwarded_all(process), timeout=60, interval=0.2, what="forwarder idle")

    for round_ in range(ROUNDS):
        idle()
        rate, values = produce(process.bootstrap, b"alone%d" % round_, RECORDS)
        rates["alone"].append(rate)
        acknowledged |= values
        idle()
        before_mb = rss_mb(pid)
        with Hostiles(process.bootstrap, pid) as hostiles:
            time.sleep(1.0)
            rate, values = produce(process.bootstrap, b"attack%d" % round_, RECORDS)
            peak_mb = max(hostiles.peak_rss_mb, rss_mb(pid))
        rates["attack"].append(rate)
        acknowledged |= values
        print(
            f"round {round_}: alone {rates['alone'][-1]:,.0f} rec/s, under attack {rate:,.0f}"
            f" rec/s; RSS before {before_mb:.1f} MB, peak {peak_mb:.1f} MB"
            f" (+{peak_mb - before_mb:.1f})"
        )
        assert peak_mb - before_mb < ATTACK_RSS_BOUND_MB

        def hostiles_gone(dropped_before: float = round_ * (HALF_SENT + GARBAGE)) -> bool:
            metrics = process.metrics()
            dropped = sum(
                v for k, v in metrics.items() if k.startswith("durable_agent_ingest_drop")
            )
            return (
                metrics["durable_agent_ingest_connections"] == 0
                and dropped >= dropped_before + HALF_SENT + GARBAGE
            )

        wait_for(hostiles_gone, timeout=30, interval=0.5, what="every hostile connection closed")
        wait_for(
            lambda limit=before_mb + RSS_RETURN_MARGIN_MB: rss_mb(pid) <= limit,
            timeout=30,
            interval=0.5,
            what=f"RSS back within {RSS_RETURN_MARGIN_MB} MB of {before_mb:.1f} MB",
        )
        print(f"round {round_}: RSS after the hostile clients left: {rss_mb(pid):.1f} MB")

    alone, attack = statistics.median(rates["alone"]), statistics.median(rates["attack"])
    print(f"median alone {alone:,.0f} rec/s, under attack {attack:,.0f} rec/s")
    assert attack >= alone / 2

    expected = len(acknowledged) + RECORDS  # and the warm-up
    values = {r.value for r in consume_all(broker, TOPIC, expected=expected)}
    assert acknowledged <= values, f"{len(acknowledged - values)} acknowledged records lost"
