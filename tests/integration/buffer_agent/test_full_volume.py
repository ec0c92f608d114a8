"""A real small volume filled to 100 % while Kafka is unreachable: the agent never exits,
producers get retriable errors, and once Kafka returns every acknowledged record arrives and
the agent accepts again; also after a kill -9 and restart (as kubelet would), and through
``durable-agent drain`` on the full volume.

The volume is an 8 MiB tmpfs. The agent's default ``--max-buffer-bytes`` (1 GiB) is lowered
to what the volume holds; once the WAL is at that limit, a filler file takes the rest of the
volume (as an application writing its own files there would), so the checkpoint, the hint
and everything else the agent writes meet a completely full disk.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from durable_producer.local.agent_process import AgentProcess
from support.broker import ProxiedBroker, consume_all, create_topic
from support.volumes import fill, free_bytes, mounted_tmpfs
from support.waiting import wait_for

pytestmark = pytest.mark.integration

TOPIC = "full-volume"
PARTITIONS = 3
VOLUME = "8m"
AGENT_ARGS = [
    "--fsync",
    "always",
    "--segment-bytes",
    "262144",
    "--max-batch-bytes",
    "65536",
    "--checkpoint-interval",
    "0.5",
    "--default-partitions",
    str(PARTITIONS),
]
REFUSING = 'durable_agent_refusing_appends{reason="%s"}'


def value_of(key: int) -> bytes:
    """0.5 to 1.5 KB, different for every key."""
    return (b"%d:" % key) * (500 // 6 + key % 170)


class Feeder:
    """An idempotent confluent-kafka producer that never gives a record up; records which
    keys Kafka (through the agent) acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: set[int] = set()
        self.errors: list[str] = []
        self.fatal: list[str] = []
        self.next_key = 0
        self._lock = threading.Lock()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.size": 16384,
                "message.timeout.ms": 0,
                "retry.backoff.ms": 100,
                "error_cb": self._on_error,
                "log_level": 2,
            }
        )

    def __enter__(self) -> Feeder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """End the client now: purge what it still holds and serve those reports (each
        message's delivery callback, held from C, keeps this object and so the client alive),
        then drop it."""
        self.producer.purge()
        self.producer.poll(0)
        del self.producer

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal.append(error.str())

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        with self._lock:
            if error is None:
                self.acked.add(int(message.key()))
            else:
                self.errors.append(error.str())

    def produce(self, count: int) -> None:
        for _ in range(count):
            key = self.next_key
            self.next_key += 1
            while True:
                try:
                    self.producer.produce(
                        TOPIC, value_of(key), str(key).encode(), on_delivery=self._delivered
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.producer.poll(0)

    def poll_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.producer.poll(0.1)


def start_agent(volume: Path, broker: ProxiedBroker, log: Path) -> AgentProcess:
    return AgentProcess(volume, broker.bootstrap, extra_args=AGENT_ARGS, log_path=log)


def refusing(agent: AgentProcess) -> set[str]:
    metrics = agent.metrics()
    reasons = ("buffer_limit", "disk_full", "wal_failed")
    return {reason for reason in reasons if metrics.get(REFUSING % reason) == 1}


def produce_until_refused(agent: AgentProcess, feeder: Feeder) -> None:
    """Produce more than the volume holds until the agent stops acknowledging."""
    feeder.produce(12_000)  # about 12 MB: more than the whole volume
    wait_for(
        lambda: (feeder.producer.poll(0.1), feeder.acked or not agent.running)[1],
        timeout=30,
        what="the first acknowledgement",
    )
    acked = -1
    while len(feeder.acked) != acked:  # until no acknowledgement for 3 s
        acked = len(feeder.acked)
        feeder.poll_for(3.0)
    assert 0 < acked < feeder.next_key


def fill_the_volume(agent: AgentProcess, feeder: Feeder, volume: Path) -> None:
    """The WAL at its limit, then the rest of the volume taken by a filler file."""
    produce_until_refused(agent, feeder)
    assert agent.running, f"the agent exited:\n{agent.log_tail()}"
    fill(volume)
    assert free_bytes(volume) == 0, "the volume is 100 % full"


def assert_stays_up_and_refuses(agent: AgentProcess, feeder: Feeder, seconds: float) -> None:
    plateau = len(feeder.acked)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        feeder.poll_for(0.5)
        assert agent.running, f"the agent exited:\n{agent.log_tail()}"
        assert agent.is_ready(), "a full volume must not make the agent unready"
    assert len(feeder.acked) == plateau, "nothing is acknowledged while the volume is full"
    assert not feeder.errors and not feeder.fatal
    # The gauge shows why the latest append was refused, once the client retried. After a
    # restart that can take a while: a topic the agent has no cached count for waits for the
    # cluster's metadata answer (up to its 5 s timeout) before the client learns its leader.
    wait_for(
        lambda: feeder.poll_for(0.5) or refusing(agent) & {"buffer_limit", "disk_full"},
        timeout=30,
        what="a refusal for want of space",
    )
    assert len(feeder.acked) == plateau, "nothing is acknowledged while the volume is full"


def assert_everything_acked_arrived(broker: ProxiedBroker, acked: set[int]) -> None:
    records = consume_all(broker.direct_address, TOPIC, timeout=90, idle=3)
    found = {int(record.key): record.value for record in records}
    missing = sorted(acked - set(found))
    assert not missing, f"{len(missing)} acknowledged records missing, e.g. {missing[:10]}"
    assert all(found[key] == value_of(key) for key in acked)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "volume", VOLUME) as mount_point:
        yield mount_point


@pytest.fixture
def broker() -> Iterator[ProxiedBroker]:
    with ProxiedBroker() as proxied:
        create_topic(proxied.bootstrap, TOPIC, PARTITIONS)
        proxied.proxy.cut()
        yield proxied


def test_full_volume_with_kafka_down_agent_stays_up_then_delivers_everything(
    volume: Path, broker: ProxiedBroker, tmp_path: Path
) -> None:
    with start_agent(volume, broker, tmp_path / "agent.log") as agent:
        log = agent.log_tail(20_000)
        assert "--max-buffer-bytes 1073741824 does not fit on the volume" in log
        limit = agent.metrics()["durable_agent_buffer_limit_bytes"]
        assert 2 * 262_144 <= limit < 8 << 20
        with Feeder(agent.bootstrap) as feeder:
            fill_the_volume(agent, feeder, volume)
            assert_stays_up_and_refuses(agent, feeder, seconds=6)

            broker.proxy.restore()
            assert feeder.producer.flush(180) == 0
            assert not feeder.errors and not feeder.fatal
            assert feeder.acked == set(range(feeder.next_key))
            # accepting again, the filler file still there (the gauges are published every s)
            wait_for(lambda: not refusing(agent), timeout=5, what="the refusal gauges to clear")
            feeder.produce(200)
            assert feeder.producer.flush(60) == 0
            assert feeder.acked == set(range(feeder.next_key))
        assert agent.stop() == 0
    assert_everything_acked_arrived(broker, feeder.acked)


def test_kill_9_on_a_full_volume_and_restart_loses_nothing(
    volume: Path, broker: ProxiedBroker, tmp_path: Path
) -> None:
    agent = start_agent(volume, broker, tmp_path / "agent.log")
    with agent:
        with Feeder(agent.bootstrap) as feeder:
            fill_the_volume(agent, feeder, volume)
            feeder.poll_for(1.0)
            agent.kill()
            agent.start()  # as kubelet restarts a sidecar, on the same 100 % full volume
            assert_stays_up_and_refuses(agent, feeder, seconds=6)

            broker.proxy.restore()
            assert feeder.producer.flush(180) == 0
            assert not feeder.errors and not feeder.fatal
            assert feeder.acked == set(range(feeder.next_key))
        assert agent.stop() == 0
    assert_everything_acked_arrived(broker, feeder.acked)


def test_drain_forwards_a_full_volume(
    volume: Path, broker: ProxiedBroker, tmp_path: Path
) -> None:
    agent = start_agent(volume, broker, tmp_path / "agent.log")
    with agent, Feeder(agent.bootstrap) as feeder:
        produce_until_refused(agent, feeder)
        acked = set(feeder.acked)
        agent.kill()  # the pod is gone; its volume is left full
    fill(volume)
    assert free_bytes(volume) == 0, "the volume is 100 % full"

    broker.proxy.restore()
    drain = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_producer.buffer_agent.cli",
            "drain",
            "--data-dir",
            str(volume),
            "--kafka-bootstrap",
            broker.bootstrap,
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert drain.returncode == 0, drain.stderr[-4000:]
    assert "drain complete" in drain.stderr
    assert_everything_acked_arrived(broker, acked)
