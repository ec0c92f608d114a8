"""Zero loss, proven with real processes: agent SIGKILLs, broker cut off and hung.

A producer pushes through the agent while the agent is SIGKILLed and restarted at random
moments and the broker is cut off (fault proxy) and hung (SIGSTOP). Afterwards a consumer
reads the topic: every record the producer had acknowledged is there with identical content,
nothing else is, and the duplicates stay within the bound implied by the checkpoint interval.

The CI version is short; ``-m slow`` runs the long one (tens of seconds of outage).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import ProxiedBroker, consume_all, create_topic

pytestmark = pytest.mark.integration

TOPIC = "chaos"
CHECKPOINT_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Scenario:
    kills: int
    cut_s: float
    hang_s: float
    rate: int
    seconds_between_kills: tuple[float, float]


SHORT = Scenario(kills=10, cut_s=6, hang_s=6, rate=1500, seconds_between_kills=(0.5, 2.0))
LONG = Scenario(kills=20, cut_s=30, hang_s=20, rate=3000, seconds_between_kills=(1.0, 4.0))


def value_for(index: int) -> bytes:
    seed = f"chaos-{index}:".encode()
    return (seed * 20)[:200]


@dataclass
class Load:
    acked: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def produce(bootstrap: str, rate: int, load: Load) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 0,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )

    def delivered(error: object, message: object) -> None:
        with load.lock:
            if error is None:
                load.acked.add(int(message.key()))  # type: ignore[attr-defined]
            else:
                load.errors.append(str(error))

    started = time.monotonic()
    index = 0
    while not load.stop.is_set():
        due = int(rate * (time.monotonic() - started))
        while index < due:
            producer.produce(
                TOPIC,
                key=str(index).encode(),
                value=value_for(index),
                headers=[("index", str(index).encode())],
                on_delivery=delivered,
            )
            index += 1
        load.sent = index
        producer.poll(0.02)
    remaining = producer.flush(180)
    assert remaining == 0, f"{remaining} records never acknowledged by the agent"


def run_chaos(tmp_path: Path, scenario: Scenario) -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", time.time_ns())))
    with ProxiedBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, 4)
        agent = AgentProcess(
            tmp_path / "volume",
            broker.bootstrap,
            extra_args=[
                "--checkpoint-interval",
                str(CHECKPOINT_INTERVAL_S),
                "--drain-timeout",
                "60",
                "--fsync",
                "interval",
            ],
            log_path=tmp_path / "agent.log",
        )
        with agent:
            load = Load()
            producer = threading.Thread(target=produce, args=(agent.bootstrap, scenario.rate, load))
            producer.start()
            try:
                outage_after = rng.randint(2, scenario.kills - 3)
                hang_after = rng.randint(outage_after + 1, scenario.kills - 1)
                for kill in range(scenario.kills):
                    time.sleep(rng.uniform(*scenario.seconds_between_kills))
                    agent.restart()
                    if kill == outage_after:
                        broker.proxy.cut()
                        time.sleep(scenario.cut_s / 2)
                        agent.restart()  # a crash while the broker is unreachable
                        time.sleep(scenario.cut_s / 2)
                        broker.proxy.restore()
                    if kill == hang_after:
                        assert broker.broker is not None
                        broker.broker.suspend()
                        try:
                            time.sleep(scenario.hang_s)
                        finally:
                            broker.broker.resume()
                time.sleep(1)
            finally:
                load.stop.set()
                producer.join()
            assert agent.stop(timeout=120) == 0, agent.log_tail()
        restarts = scenario.kills + 1
        consumed = consume_all(broker.direct_address, TOPIC, timeout=120, idle=3)

    assert not load.errors, f"producer errors: {load.errors[:5]}"
    counts: dict[int, int] = {}
    for record in consumed:
        index = int(record.key)
        assert record.value == value_for(index), f"record {index} damaged"
        assert record.headers == (("index", str(index).encode()),)
        counts[index] = counts.get(index, 0) + 1
    missing = load.acked - counts.keys()
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:10]}"
    unexpected = counts.keys() - set(range(load.sent))
    assert not unexpected, f"records nobody sent: {sorted(unexpected)[:10]}"
    duplicates = sum(count - 1 for count in counts.values())
    # Each agent start replays at most what was delivered since the last checkpoint: one
    # checkpoint interval (plus the in-flight window) of traffic at the producer's rate.
    bound = int(restarts * scenario.rate * (CHECKPOINT_INTERVAL_S + 2))
    print(
        f"\nchaos: sent {load.sent}, acknowledged {len(load.acked)}, consumed {len(consumed)},"
        f" duplicates {duplicates} (bound {bound}), agent restarts {restarts}"
    )
    assert duplicates <= bound
    assert len(load.acked) > scenario.rate * 5, "the producer must have made real progress"


def test_no_acknowledged_record_lost_under_chaos(tmp_path: Path) -> None:
    run_chaos(tmp_path, SHORT)


@pytest.mark.slow
def test_no_acknowledged_record_lost_under_long_chaos(tmp_path: Path) -> None:
    run_chaos(tmp_path, LONG)
