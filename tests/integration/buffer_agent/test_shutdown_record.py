"""The agent's shutdown record: what a SIGTERM-stopped agent leaves in its termination message
(``shutdown_record.py``), read by the operator to let a drained volume go without a drain Job
(issue 29, D2 (b)). Real agent processes; real Kafka, or none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from durable_producer import shutdown_record
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, RefusedBatch
from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import KafkaBroker
from durable_producer.local.topics import consume_all
from support.ingest_harness import record_batch
from support.kafka_fixtures import TopicFactory

pytestmark = pytest.mark.integration

RECORDS = 50
UNREACHABLE_KAFKA = "127.0.0.1:1"


def produce(agent: AgentProcess, topic: str) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 20000})
    for number in range(RECORDS):
        producer.produce(topic, f"record-{number}".encode())
    assert producer.flush(30) == 0, "not every record was acknowledged"


def stopped_with_record(agent: AgentProcess, message_file: Path) -> shutdown_record.ShutdownRecord:
    assert agent.stop() == 0, agent.log_tail()
    text = message_file.read_text()
    print(f"\ntermination message: {text.strip()}")
    record = shutdown_record.parse(text)
    assert record is not None, f"no shutdown record in {text!r}"
    assert len(text.encode()) <= 4096, "Kubernetes keeps at most 4096 bytes of the message"
    return record


def test_an_agent_that_forwarded_everything_says_its_volume_is_empty(
    tmp_path: Path, kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    message_file = tmp_path / "termination-log"
    message_file.touch()  # the kubelet creates it
    with AgentProcess(tmp_path / "data", kafka_broker.bootstrap, extra_args=[
            "--termination-message-path", str(message_file)]) as agent:
        produce(agent, topic)
        record = stopped_with_record(agent, message_file)

    assert record.volume_empty, record
    assert len(consume_all(kafka_broker.bootstrap, topic, expected=RECORDS)) == RECORDS


def test_an_agent_stopped_while_kafka_is_down_says_what_it_keeps(tmp_path: Path) -> None:
    message_file = tmp_path / "termination-log"
    message_file.touch()
    with AgentProcess(tmp_path / "data", UNREACHABLE_KAFKA, extra_args=[
            "--termination-message-path", str(message_file), "--default-partitions", "1",
            "--drain-timeout", "1"]) as agent:
        produce(agent, "orders")
        record = stopped_with_record(agent, message_file)

    assert not record.volume_empty, record
    assert not record.drained and record.backlog_records == RECORDS, record


def test_no_record_is_written_where_there_is_no_termination_message_file(
    tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir" / "termination-log"
    with AgentProcess(tmp_path / "data", UNREACHABLE_KAFKA, extra_args=[
            "--termination-message-path", str(missing), "--default-partitions", "1",
            "--drain-timeout", "0.5"]) as agent:
        assert agent.stop() == 0, agent.log_tail()
    assert not missing.exists() and not missing.parent.exists()


def drain(volume: Path, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_producer.buffer_agent.cli", "drain", "--data-dir",
         str(volume), "--kafka-bootstrap", bootstrap, "--timeout", "60"],
        capture_output=True, text=True, timeout=120, check=False)


def test_a_drain_does_not_call_a_volume_with_dead_letters_empty(
    tmp_path: Path, kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The operator deletes a volume whose drain Job succeeded: with dead letters still on it
    (records Kafka refused, kept to be re-sent) the drain used to exit 0 and they went with
    it. Now it exits 4 and says why; once they are re-sent the drain succeeds."""
    topic = new_topic()
    volume = tmp_path / "volume"
    message_file = tmp_path / "termination-log"
    message_file.touch()
    with AgentProcess(volume, kafka_broker.bootstrap, extra_args=[
            "--termination-message-path", str(message_file)]) as agent:
        produce(agent, topic)
        assert agent.stop() == 0, agent.log_tail()
    letter = RefusedBatch(0, topic, 0, record_batch([b"refused-once"]), "record too large",
                          "MESSAGE_TOO_LARGE")
    assert DeadLetterStore(volume / "dead-letter").add_batches([letter]) == (1, None)

    kept = drain(volume, kafka_broker.bootstrap)
    print(f"\n{kept.stderr.strip().splitlines()[-1]}")
    assert kept.returncode == 4, kept.stderr[-3000:]
    assert "the volume is not empty: 1 dead letter(s)" in kept.stderr

    resend = subprocess.run(
        [sys.executable, "-m", "durable_producer.buffer_agent.cli", "dead-letters", "resend",
         "--data-dir", str(volume), "--kafka-bootstrap", kafka_broker.bootstrap],
        capture_output=True, text=True, timeout=120, check=False)
    assert resend.returncode == 0, resend.stderr[-3000:]
    assert drain(volume, kafka_broker.bootstrap).returncode == 0
    values = {record.value for record in consume_all(kafka_broker.bootstrap, topic,
                                                     expected=RECORDS + 1)}
    assert b"refused-once" in values


def test_a_drain_does_not_call_a_volume_with_a_damaged_dead_letter_empty(
    tmp_path: Path, kafka_broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """A dead-letters file whose lines hold no letter (damage) was read as none: the drain
    exited 0 and the operator deleted the volume with what they held."""
    topic = new_topic()
    volume = tmp_path / "volume"
    with AgentProcess(volume, kafka_broker.bootstrap) as agent:
        produce(agent, topic)
        assert agent.stop() == 0, agent.log_tail()
    (volume / "dead-letter" / "dead-letters.jsonl").write_bytes(b"\x8f damaged\n")

    kept = drain(volume, kafka_broker.bootstrap)
    assert kept.returncode == 4, kept.stderr[-3000:]
    said = kept.stderr.strip().splitlines()[-1]
    print(f"\n{said}")
    assert "0 dead letter(s) Kafka refused and 1 line(s) that hold no letter" in said
    assert "dead-letters.jsonl line 1" in said
