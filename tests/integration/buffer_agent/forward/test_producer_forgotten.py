"""After a restart, a broker that forgot the forwarding producer gets no uncounted duplicate.

A broker keeps an idempotent producer's last sequences for ``producer.id.expiration.ms``
after its last batch (a day by default), and drops them with the log segments that held its
batches. A producer it no longer knows may start at any sequence: frames the previous run
sent (Kafka holds them, the answer never came) and the restarted agent sends again with the
same numbers are written a second time. Kafka cannot tell; the agent can: a partition whose
next frame is numbered above 0 had frames of this producer acknowledged, so a leader that
knows nothing of it forgot it. Those frames must count as possible duplicates (the agent's
only promise where Kafka forgot), under a new epoch, as the Java producer does on
UNKNOWN_PRODUCER_ID. Before this, the agent counted none: the duplicates were silent.

Apache Kafka with a 3 s expiration checked every 0.5 s (the broker's own settings); the
answers are lost on the way back by the fault proxy (requests reach the broker), then the
agent is killed with SIGKILL and started again once the broker forgot the producer.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from support.broker import ProxiedBroker, consume_all
from support.kafka_clients import produce_values
from support.kafka_fixtures import TopicFactory
from support.producer_state import EXPIRATION_MS, knows_producer
from support.raw_fetch import high_watermark, stored_batches
from support.waiting import wait_for

pytestmark = pytest.mark.integration

CLIENT = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}


def test_frames_sent_before_a_kill_count_as_possible_duplicates_when_kafka_forgot_the_producer(
    forgetful_broker: ProxiedBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    proxy = forgetful_broker.proxy
    direct = forgetful_broker.direct_address
    topic = new_topic(1, bootstrap=forgetful_broker.bootstrap)
    agent = AgentProcess(tmp_path / "volume", forgetful_broker.bootstrap)
    with agent:
        first = [b"first-%03d" % n for n in range(100)]
        assert len(produce_values(agent.bootstrap, topic, first, CLIENT).delivered) == 100
        wait_for(
            lambda: agent.metric("durable_agent_forwarded_records_total") >= 100,
            what="the first records delivered through the agent",
        )
        producer_id = stored_batches(forgetful_broker.bootstrap, topic, 0)[0].header.producer_id

        proxy.lose_answers()  # the next frames reach Kafka; the agent never hears back
        second = [b"second-%03d" % n for n in range(100)]
        assert len(produce_values(agent.bootstrap, topic, second, CLIENT).delivered) == 100
        wait_for(
            lambda: high_watermark(direct, topic, 0) >= 200,
            what="the second records written by Kafka, their answers lost",
        )
        assert agent.metric("durable_agent_forwarded_records_total") == 100
        agent.kill()

        proxy.restore()
        wait_for(
            lambda: not knows_producer(forgetful_broker.bootstrap, topic, producer_id),
            timeout=EXPIRATION_MS / 1000 * 5,
            what="the broker to forget the agent's producer",
        )
        agent.start()
        wait_for(
            lambda: agent.metric("durable_agent_forwarded_records_total") >= 100,
            timeout=60,
            what="the restarted agent to deliver the second records",
        )
        possible = agent.metric("durable_agent_possible_duplicates_total")
        resets = agent.metric("durable_agent_producer_resets_total")
        assert agent.stop(timeout=60) == 0, agent.log_tail()

    consumed = consume_all(forgetful_broker.bootstrap, topic, timeout=60)
    copies = Counter(record.value for record in consumed)
    assert set(copies) == set(first) | set(second), "every acknowledged record is in Kafka"
    duplicates = sum(count - 1 for count in copies.values())
    assert duplicates == 100, f"Kafka, having forgotten the producer, stored {duplicates} twice"
    assert all(copies[value] == 1 for value in first)
    assert possible >= duplicates, (
        f"{duplicates} records stored twice, {possible:.0f} counted as possible duplicates"
    )
    assert resets >= 1, "the partition goes on under a new epoch"
