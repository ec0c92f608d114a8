"""librdkafka's mock cluster through the typed ctypes binding, run as a child process.

Real TCP brokers, real clients: each fault the wrapper offers is checked by what a Kafka
client then sees.
"""

from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer

from durable_producer.local import rdkafka_mock
from durable_producer.local.mock_cluster import (
    API_PRODUCE,
    PARTITION_LOG_MAX_BYTES,
    MockCluster,
    MockClusterError,
)
from durable_producer.local.topics import consume_all


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1) as sock:
            sock.settimeout(1)
            # The mock accepts and closes at once while a broker is down: send a byte and
            # see whether the connection stays open.
            sock.sendall(b"\0")
            try:
                return sock.recv(1) != b""
            except TimeoutError:
                return True
    except OSError:
        return False


def _produce(bootstrap: str, topic: str, values: list[bytes], **settings: object) -> list[str]:
    """Produce to partition 0; the error name of each delivery report ("" for success)."""
    outcomes: list[str] = []

    def report(error: KafkaError | None, message: Message) -> None:
        outcomes.append("" if error is None else error.name())

    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2, **settings})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=report)
    assert producer.flush(30) == 0
    return outcomes


@pytest.fixture(scope="module")
def cluster() -> MockCluster:
    with MockCluster(brokers=3) as running:
        yield running  # type: ignore[misc]


def test_every_binding_has_explicit_argument_and_result_types() -> None:
    library = rdkafka_mock.load_librdkafka()
    for name, (argtypes, restype) in rdkafka_mock._SIGNATURES.items():
        function = getattr(library, name)
        assert function.argtypes == argtypes, name
        assert function.restype is restype, name


def test_three_brokers_on_real_ports_serve_a_producer_and_a_consumer(cluster: MockCluster) -> None:
    addresses = cluster.bootstrap.split(",")
    assert len(addresses) == 3 and list(cluster.broker_ids) == [1, 2, 3]
    cluster.topic_create("basics", partitions=3)

    assert _produce(cluster.bootstrap, "basics", [b"a", b"b"]) == ["", ""]

    values = [record.value for record in consume_all(cluster.bootstrap, "basics", expected=2)]
    assert values == [b"a", b"b"]
    assert cluster.watermarks("basics", 0) == (0, 2)


def test_a_broker_set_down_refuses_clients_until_it_is_up(cluster: MockCluster) -> None:
    address = cluster.bootstrap.split(",")[1]
    with cluster.brokers_down([2]):
        assert not _reachable(address)
    assert _reachable(address)


def test_pushed_produce_errors_answer_the_next_requests_in_order(cluster: MockCluster) -> None:
    cluster.topic_create("refused", partitions=1)
    cluster.push_request_errors(API_PRODUCE, [KafkaError.TOPIC_AUTHORIZATION_FAILED])

    outcomes = _produce(cluster.bootstrap, "refused", [b"x"], retries=0)

    assert outcomes == ["TOPIC_AUTHORIZATION_FAILED"]
    assert _produce(cluster.bootstrap, "refused", [b"y"]) == [""]
    cluster.push_request_errors(API_PRODUCE, [KafkaError.NOT_ENOUGH_REPLICAS] * 3)
    cluster.clear_request_errors(API_PRODUCE)
    assert _produce(cluster.bootstrap, "refused", [b"z"], retries=0) == [""]


def test_leader_moves_and_round_trip_time_are_applied(cluster: MockCluster) -> None:
    cluster.topic_create("slow", partitions=1)
    cluster.partition_set_leader("slow", 0, 3)
    assert _produce(cluster.bootstrap, "slow", [b"warm"]) == [""]
    with cluster.slow(600, [3]):
        started = time.monotonic()
        assert _produce(cluster.bootstrap, "slow", [b"late"]) == [""]
        assert time.monotonic() - started >= 0.5


def test_the_mock_keeps_about_5_mib_per_partition_and_says_so_in_the_low_watermark(
    cluster: MockCluster,
) -> None:
    cluster.topic_create("bounded", partitions=1)
    value = b"v" * (512 * 1024)
    batches = PARTITION_LOG_MAX_BYTES // len(value) + 3
    for _ in range(batches):  # one request each: the mock drops whole batches
        assert _produce(cluster.bootstrap, "bounded", [value], **{"linger.ms": 0}) == [""]

    low, high = cluster.watermarks("bounded", 0)

    assert high == batches
    assert low > 0, "older batches were dropped: a missing record there is not lost"


def test_bad_calls_say_what_was_wrong(cluster: MockCluster) -> None:
    with pytest.raises(MockClusterError, match=r"no broker 7: the brokers are 1\.\.3"):
        cluster.broker_set_down(7)
    with pytest.raises(ValueError, match="at least one broker"):
        MockCluster(brokers=0)


def test_stop_ends_the_child_and_later_calls_fail_clearly() -> None:
    cluster = MockCluster(brokers=1).start()
    try:
        # The child exits by itself (0) once closed; stop() used to send SIGTERM at once and
        # raced it (-15 in a fresh clone's CI).
        assert cluster.stop(timeout=60) == 0
        with pytest.raises(MockClusterError, match="not running"):
            cluster.broker_set_up(1)
    finally:
        cluster.close()


def test_a_killed_cluster_is_reported_not_hung() -> None:
    with MockCluster(brokers=1) as cluster:
        assert cluster.process is not None
        cluster.process.kill()
        cluster.process.wait(10)
        with pytest.raises(MockClusterError, match="did not answer"):
            cluster.topic_create("gone", 1)
