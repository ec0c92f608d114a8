"""Damaged state files beside the WAL never stop the agent (review finding 14).

Each case stopped the real agent at start before (a traceback and exit 1, or "cannot listen
there" and exit 2): a crash loop under Kubernetes although the WAL and Kafka were fine. Now the
file is moved aside, counted in a metric, and the agent serves: an idempotent client's records
are acknowledged. Kafka is unreachable here on purpose: ingest must not depend on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer.local.agent_process import AgentProcess

pytestmark = pytest.mark.integration

UNREACHABLE_KAFKA = "127.0.0.1:1"
RECORDS = 20


def garbage(path: Path) -> None:
    path.write_bytes(b"{")


def directory(path: Path) -> None:
    (path / "inside").mkdir(parents=True)


def deeply_nested(path: Path) -> None:
    path.write_bytes(b"[" * 100_000)  # a RecursionError in the JSON parser, not a ValueError


def producer_id_out_of_range(path: Path) -> None:
    path.write_text('{"next_unreserved": 9223372036854775900}')  # above Kafka's int64


def producer_id_infinite(path: Path) -> None:
    path.write_text('{"next_unreserved": 1e400}')  # a float, inf


def cached_orders(path: Path, partitions: str) -> None:
    entry = f'"partitions": {partitions}, "refreshed_at": {time.time()}, "max_message_bytes": null'
    path.write_text('{"version": 1, "topics": {"orders": {' + entry + "}}}")


def no_partitions(path: Path) -> None:  # every produce to the topic timed out
    cached_orders(path, "0")


def infinite_partitions(path: Path) -> None:  # a float (inf): an OverflowError traceback
    cached_orders(path, "1e400")


def wrong_shape(path: Path) -> None:
    path.write_text('{"next_unreserved": "many", "topics": [1], "wal_offset": {}}')


# Each stopped the agent before; garbage in metadata.json and producer_state.json was
# already tolerated (unit tests cover the shapes).
CASES: list[tuple[str, Callable[[Path], None]]] = [
    ("producer_ids.json", garbage),
    ("producer_ids.json", directory),
    ("producer_ids.json", wrong_shape),
    # Every InitProducerId failed ("closing connection ... after an internal error"), no line
    # saying why; 1e400: an OverflowError traceback, exit 1.
    ("producer_ids.json", producer_id_out_of_range),
    ("producer_ids.json", producer_id_infinite),
    ("metadata.json", directory),
    ("metadata.json", no_partitions),
    ("metadata.json", infinite_partitions),
    ("producer_state.json", directory),
    ("metadata.json", deeply_nested),  # the next two: a RecursionError traceback, exit 1
    ("producer_state.json", deeply_nested),
    # The forwarder's identity (issue 27): a directory in its place was never counted or moved
    # aside (every later write failed: after a crash, a new producer id and duplicates), and
    # garbage was ignored without a word.
    ("producer-identity", garbage),
    ("producer-identity", directory),
]


def produce(agent: AgentProcess) -> list[str]:
    """RECORDS records from an idempotent client; the errors its callbacks got."""
    errors: list[str] = []
    delivered: list[bool] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            errors.append(str(error))
        delivered.append(True)

    producer = Producer({
        "bootstrap.servers": agent.bootstrap, "enable.idempotence": True,
        "message.timeout.ms": 20000,
    })  # fmt: skip
    for number in range(RECORDS):
        producer.produce("orders", f"record-{number}".encode(), on_delivery=on_delivery)
    producer.flush(30)
    assert len(delivered) == RECORDS, "not every record got an answer"
    return errors


@pytest.mark.parametrize(("name", "damage"), CASES, ids=[f"{n}-{d.__name__}" for n, d in CASES])
def test_the_agent_serves_with_a_damaged_state_file(
    tmp_path: Path, name: str, damage: Callable[[Path], None]
) -> None:
    data_dir = tmp_path / "volume"
    flags = ["--default-partitions", "3", "--drain-timeout", "0.5", "--log-level", "INFO"]
    with AgentProcess(data_dir, UNREACHABLE_KAFKA, extra_args=flags) as agent:
        assert produce(agent) == []
        agent.stop()
        state_file = data_dir / "state" / name
        if state_file.is_dir():
            state_file.rmdir()
        elif state_file.exists():
            state_file.unlink()
        damage(state_file)

        agent.start()
        assert produce(agent) == []  # a second producer: a new id, new records
        assert agent.metrics()["durable_agent_state_files_damaged"] == 1
        assert (data_dir / "state" / f"{name}.damaged").exists()
        log = agent.log_path.read_text()
        assert "Traceback" not in log
        assert f"state file {state_file} is unusable" in log

        agent.stop()
        agent.start()  # the file was written anew: nothing damaged any more
        assert agent.metrics()["durable_agent_state_files_damaged"] == 0
