"""A topic's ``max.message.bytes`` lowered under a backlog, against Apache Kafka.

The agent learns each topic's limit with its partition count and refuses a larger client
batch at ingest, as the topic would; its cache is refreshed at most once a minute. Here the
limit drops from 1 MB to 2,000 bytes while Kafka is out of reach, and clients keep writing
through the agent: small client batches (each fits) and large ones (each too large now). The
agent still holds the old limit and takes them all. Once Kafka is back, the forwarder must
deliver every batch that fits, dead-letter every one that does not, and do both soon.

Before: the forwarder merged the small batches with the rest, halved its merges down to
16 kB after each refusal, and sent the same 16 kB batch again at once, for ever (thousands of
refused requests a second, the backlog never delivered, a drain never done); and each large
batch waited a dead-letter window of its own. Now a refusal as too large makes the forwarder
ask the topic's limit (DescribeConfigs), merges keep within it, a merged batch that merging
less would not split goes client batch by client batch, and after one batch is dead-lettered
the next one refused the same way is not kept waiting again. The ingest hears the limit too
and refuses a large batch at once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from durable_producer.buffer_agent.forward.dead_letter import list_dead_letters
from durable_producer.buffer_agent.kafka.record_decode import iter_decoded
from durable_producer.local.agent_process import AgentProcess
from support.broker import ProxiedBroker, consume_all
from support.kafka_clients import produce_values
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for

pytestmark = pytest.mark.integration

LIMIT = 2000
ONE_RECORD_A_BATCH = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 0,
    "batch.num.messages": 1,
}
SMALL = [b"small-%04d-" % n + b"s" * 200 for n in range(270)]
"""Client batches of about 480 bytes (the value is the key too): each fits."""
LARGE = [b"large-%04d-" % n + b"L" * 2500 for n in range(30)]
"""Client batches of about 5 kB: each too large for the lowered limit."""
DEAD_LETTER_AFTER_S = 2.0


def _set_max_message_bytes(bootstrap: str, topic: str, limit: int) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)


def _too_large_answers(agent: AgentProcess) -> float:
    return sum(
        value
        for name, value in agent.metrics().items()
        if name.startswith("durable_agent_kafka_errors_total")
        and 'error="MESSAGE_TOO_LARGE"' in name
    )


def test_a_limit_lowered_under_a_backlog_delivers_what_fits_and_dead_letters_the_rest_soon(
    proxied_broker: ProxiedBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(1, bootstrap=proxied_broker.bootstrap)
    volume = tmp_path / "volume"
    agent = AgentProcess(
        volume, proxied_broker.bootstrap, extra_args=["--dead-letter-after", "2"]
    )
    with agent:
        warm = [b"warm-%02d" % n for n in range(10)]  # the agent caches the topic: 1 MB
        assert len(produce_values(agent.bootstrap, topic, warm, ONE_RECORD_A_BATCH).delivered) == 10
        wait_for(
            lambda: agent.metric("durable_agent_forwarded_records_total") >= 10,
            what="the first records forwarded",
        )
        _set_max_message_bytes(proxied_broker.direct_address, topic, LIMIT)
        proxied_broker.proxy.cut()
        values = [LARGE[n // 10] if n % 10 == 9 else SMALL[n - n // 10] for n in range(300)]
        taken = produce_values(agent.bootstrap, topic, values, ONE_RECORD_A_BATCH)
        assert sorted(taken.delivered) == sorted(values), taken.errors  # the old limit
        proxied_broker.proxy.restore()
        back = time.monotonic()
        wait_for(
            lambda: agent.metric("durable_agent_backlog_records") == 0,
            timeout=90,
            interval=0.2,
            what="the backlog delivered or dead-lettered",
        )
        settled_s = time.monotonic() - back
        refused_answers = _too_large_answers(agent)
        print(f"settled {settled_s:.1f} s after Kafka came back; {refused_answers:.0f} refusals")
        late = produce_values(agent.bootstrap, topic, [LARGE[0]], ONE_RECORD_A_BATCH)
        assert agent.stop(timeout=60) == 0, agent.log_tail()

    assert late.errors == Counter({"MSG_SIZE_TOO_LARGE": 1}), (
        "the ingest refuses a batch larger than the limit the forwarder heard"
    )
    in_kafka = Counter(record.value for record in consume_all(proxied_broker.bootstrap, topic))
    assert in_kafka == Counter(warm + SMALL), "every batch that fits is in Kafka, once"
    letters = list_dead_letters(volume / "dead-letter")
    assert all(letter.payload is not None and len(letter.payload) > LIMIT for letter in letters)
    lettered = [
        record.value
        for letter in letters
        if letter.payload is not None
        for batch in iter_decoded(letter.payload)
        for record in batch.records
    ]
    assert sorted(lettered) == sorted(LARGE), "every batch too large is dead-lettered, whole"
    assert letters[0].reason == "refused by Kafka with MESSAGE_TOO_LARGE for 2 s"
    assert any("dead-lettered for it within the last 2 s" in letter.reason for letter in letters)
    assert settled_s < 30, f"the backlog took {settled_s:.0f} s to settle"
    assert refused_answers < 3 * len(LARGE), f"{refused_answers:.0f} refusals for {len(LARGE)}"
