"""The forwarder's state tells "Kafka is down" from "Kafka refuses" from "the agent is stuck"."""

from __future__ import annotations

import logging

import pytest

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.health import ForwarderHealth, ForwarderState
from support.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _health(clock: Clock, errors: list[tuple[str, int, str]] | None = None) -> ForwarderHealth:
    return ForwarderHealth(
        stall_after_s=10,
        clock=clock,
        on_error=None if errors is None else lambda *error: errors.append(error),
    )


def test_idle_then_delivering_while_acknowledgements_keep_coming(clock: Clock) -> None:
    health = _health(clock)
    assert health.state() is ForwarderState.IDLE

    health.beat(in_flight=50, unread=3, refused_waiting=0)
    clock.now += 9
    assert health.state() is ForwarderState.DELIVERING, "within stall_after_s of the start"
    health.delivered()
    clock.now += 9
    health.beat(in_flight=50, unread=0, refused_waiting=0)
    assert health.state() is ForwarderState.DELIVERING
    assert health.seconds_since_delivery() == 9


def test_connection_errors_after_the_last_delivery_mean_kafka_is_unreachable(
    clock: Clock,
) -> None:
    errors: list[tuple[str, int, str]] = []
    health = _health(clock, errors)
    health.beat(in_flight=10, unread=0, refused_waiting=0)
    health.error("transport", -195, "_TRANSPORT", "Connect to 127.0.0.1:9 failed")
    clock.now += 11
    health.beat(in_flight=10, unread=0, refused_waiting=0)

    assert health.state() is ForwarderState.KAFKA_UNREACHABLE
    assert errors == [("transport", -195, "_TRANSPORT")]
    note = health.last_error("transport")
    assert note is not None and note.name == "_TRANSPORT"


def test_kafka_down_at_the_start_shows_at_the_first_error_not_after_the_grace(
    clock: Clock,
) -> None:
    health = _health(clock)
    health.beat(in_flight=0, unread=20, refused_waiting=0)
    clock.now += 1
    assert health.state() is ForwarderState.DELIVERING, "nothing wrong yet, just started"
    health.error("transport", -195, "NETWORK_EXCEPTION", "connect to 127.0.0.1:9 refused")
    clock.now += 0.5
    assert health.state() is ForwarderState.KAFKA_UNREACHABLE

    refused = _health(clock)
    refused.beat(in_flight=3, unread=0, refused_waiting=0)
    refused.error("delivery", 31, "CLUSTER_AUTHORIZATION_FAILED", "InitProducerId")
    assert refused.state() is ForwarderState.KAFKA_REFUSING


def test_refused_records_waiting_mean_kafka_refuses(clock: Clock) -> None:
    health = _health(clock)
    health.error("delivery", 29, "TOPIC_AUTHORIZATION_FAILED", "not authorized")
    clock.now += 11
    health.beat(in_flight=0, unread=5, refused_waiting=7)

    assert health.state() is ForwarderState.KAFKA_REFUSING


def test_silence_with_records_in_the_client_is_waiting_for_kafka(clock: Clock) -> None:
    health = _health(clock)
    clock.now += 11
    health.beat(in_flight=10, unread=0, refused_waiting=0)
    assert health.state() is ForwarderState.WAITING_FOR_KAFKA

    clock.now += 60  # errors older than the fresh window do not explain a stall
    health.error("transport", -195, "_TRANSPORT", "old")
    clock.now += 31
    health.beat(in_flight=10, unread=0, refused_waiting=0)
    assert health.state() is ForwarderState.WAITING_FOR_KAFKA


def test_frames_waiting_in_the_wal_with_nothing_sent_or_a_silent_loop_mean_stuck(
    clock: Clock,
) -> None:
    health = _health(clock)
    clock.now += 11
    health.beat(in_flight=0, unread=40, refused_waiting=0)
    assert health.state() is ForwarderState.STUCK

    health.beat(in_flight=10, unread=0, refused_waiting=0)
    clock.now += 11  # the forwarding loop stopped turning: no heartbeat
    assert health.state() is ForwarderState.STUCK


def test_each_change_of_state_is_logged_once_with_its_cause(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    health = _health(clock)
    health.beat(in_flight=10, unread=0, refused_waiting=0)
    caplog.set_level(logging.INFO, "durable_producer.buffer_agent.forward.health")
    health.check()
    health.error("transport", -195, "_TRANSPORT", "Connect to 127.0.0.1:9 failed")
    clock.now += 11
    health.beat(in_flight=10, unread=0, refused_waiting=0)
    for _ in range(5):
        health.check()
    health.delivered()
    health.check()

    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "forwarder state idle -> delivering after 0 s",
        "forwarder state delivering -> kafka_unreachable after 11 s:"
        " _TRANSPORT: Connect to 127.0.0.1:9 failed",
        "forwarder state kafka_unreachable -> delivering after 0 s",
    ]


def test_the_gauges_are_computed_when_scraped(clock: Clock) -> None:
    metrics = AgentMetrics()
    health = ForwarderHealth(stall_after_s=10, clock=clock, on_error=metrics.count_kafka_error)
    metrics.watch_forwarder(
        states=[state.value for state in ForwarderState],
        state=lambda: health.state().value,
        seconds_since_delivery=health.seconds_since_delivery,
        refused_records=lambda: health.refused_waiting,
    )
    health.beat(in_flight=0, unread=4, refused_waiting=0)
    health.error("fatal", 45, "OUT_OF_ORDER_SEQUENCE_NUMBER", "desynchronized")
    clock.now += 30  # nothing runs in between: the scrape alone sees time pass

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("durable_agent_seconds_since_last_delivery") == 30
    assert sample("durable_agent_forwarder_state", state="stuck") == 1
    assert sample("durable_agent_forwarder_state", state="delivering") == 0
    assert sample("durable_agent_kafka_last_error_code", kind="fatal") == 45
    assert sample("durable_agent_kafka_last_error_code", kind="transport") == 0
    labels = {"kind": "fatal", "error": "OUT_OF_ORDER_SEQUENCE_NUMBER"}
    assert sample("durable_agent_kafka_errors_total", **labels) == 1
    assert sample("durable_agent_replayed_duplicates_total", cause="restart") == 0
    assert sample("durable_agent_possible_duplicates_total", cause="reset") == 0
