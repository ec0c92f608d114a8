"""Kafka's topic naming rule, as the driver and the tasks check it."""

from __future__ import annotations

import pytest

from durable_producer.spark_integration.errors import InvalidTopicError, SinkOptionError
from durable_producer.spark_integration.options import parse_options
from durable_producer.spark_integration.topic_names import (
    MAX_TOPIC_NAME_LENGTH,
    TopicNameCheck,
    check_topic_name,
    topic_name_problem,
)


@pytest.mark.parametrize(
    "name", ["events", "a", "Orders.v2_raw-1", "x" * MAX_TOPIC_NAME_LENGTH, "...", "_-."]
)
def test_legal_names(name: str) -> None:
    assert topic_name_problem(name) is None
    assert check_topic_name(name, "option 'topic'") == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "it is empty"),
        (".", "'.' is reserved"),
        ("..", "'..' is reserved"),
        ("x" * 250, "it is 250 characters long (at most 249)"),
        ("bad topic!", "it contains ' ' at position 3"),
        ("orders/eu", "it contains '/' at position 6"),
        ("заказы", "it contains 'з' at position 0"),
    ],
)
def test_illegal_names_say_why(name: str, problem: str) -> None:
    assert topic_name_problem(name) == problem


def test_topic_option_is_checked_when_options_are_parsed() -> None:
    with pytest.raises(InvalidTopicError) as raised:
        parse_options({"topic": "bad topic!"})
    assert str(raised.value).startswith(
        "durable-kafka: option 'topic': 'bad topic!' is not a valid Kafka topic name: "
        "it contains ' ' at position 3; a topic name has 1 to 249 characters"
    )
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, SinkOptionError)


def test_column_names_are_checked_once_each() -> None:
    check = TopicNameCheck()
    check.check_all(["a", "b", "a"])
    check.check_all(["b"])
    with pytest.raises(InvalidTopicError, match="column 'topic': 'no way' is not a valid"):
        check.check_all(["a", "no way"])
