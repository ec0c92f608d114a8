"""A multi-broker Kafka cluster with injectable faults: librdkafka's mock cluster, in a child
process.

``MockCluster`` is used like the other local processes (``process.ManagedProcess``): a
with-block starts it and always kills it, ``start`` returns once it answers::

    with MockCluster(brokers=3) as cluster:
        cluster.topic_create("events", partitions=3)
        producer = Producer({"bootstrap.servers": cluster.bootstrap})
        cluster.broker_set_down(2)                        # one broker gone, leaders stay
        cluster.partition_set_leader("events", 0, 3)      # a leader move
        cluster.push_request_errors(API_PRODUCE, [KafkaError.NOT_ENOUGH_REPLICAS] * 5)
        cluster.broker_set_rtt(1, 1500)                   # a slow broker
        cluster.low_watermark("events", 0)                # what the mock has dropped

The brokers (ids ``1..brokers``) speak the Kafka protocol on real loopback TCP ports, so an
agent process and any Kafka client can use them unchanged.

Why a child process (``python -m durable_producer.local.mock_cluster``, controlled over a
loopback ``multiprocessing.connection`` socket with a random key) rather than in the test's
own process: a mistake in a ctypes call, or one of the mock's own assertions (``rd_assert``
aborts), ends only the mock, and the test reports it with the mock's log instead of dying;
the mock's CPU use can be measured on its own (benchmarks); the whole cluster can be
SIGSTOPped or killed like any broker. The control calls cost well under a millisecond each.

Limits of the mock (librdkafka 2.16, ``rdkafka_mock.c``), to keep in mind when reading a
test's result:

- It keeps at most ``PARTITION_LOG_MAX_BYTES`` (5 MiB) and 100,000 record batches per
  partition, then drops its oldest batches and advances the log start offset *silently*:
  keep a test's data below that, or compare ``low_watermark`` with 0 before calling
  records lost.
- An error pushed with ``push_request_errors`` replaces the whole request: a Produce so
  answered is not written (a real ``REQUEST_TIMED_OUT`` may have been written). Its
  idempotence check remembers the last 5 batches per producer and partition, like Kafka.
- ``broker_set_down`` does not move leaders: partitions led by a down broker are unavailable
  until ``partition_set_leader`` moves them (a real controller would elect a new leader).
- With ``NOT_ENOUGH_REPLICAS`` pushed on Produce it was seen losing records that a plain
  idempotent producer had been told were delivered (1 run in 4): compare with a direct
  producer before blaming a client.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from .ports import LOOPBACK, free_port
from .process import ManagedProcess
from .rdkafka_mock import (
    API_INIT_PRODUCER_ID,
    API_METADATA,
    API_PRODUCE,
    PARTITION_LOG_MAX_BATCHES,
    PARTITION_LOG_MAX_BYTES,
    MockClusterError,
    RdKafkaMockCluster,
)

__all__ = [
    "API_INIT_PRODUCER_ID",
    "API_METADATA",
    "API_PRODUCE",
    "PARTITION_LOG_MAX_BATCHES",
    "PARTITION_LOG_MAX_BYTES",
    "MockCluster",
    "MockClusterError",
]

AUTHKEY_ENV = "DURABLE_MOCK_CLUSTER_AUTHKEY"
# The calls the control connection serves: RdKafkaMockCluster's methods of these names.
_CALLS = frozenset(
    {
        "bootstraps",
        "topic_create",
        "topic_set_error",
        "partition_set_leader",
        "broker_set_down",
        "broker_set_up",
        "broker_set_rtt",
        "push_request_errors",
        "clear_request_errors",
    }
)


class MockCluster(ManagedProcess):
    """librdkafka's mock cluster of ``brokers`` brokers in a child process (module docstring).

    Every fault method returns once the mock has applied it. ``stop`` ends the child
    gracefully, ``kill`` (or leaving the with-block) at once; a stopped cluster's data is gone.
    """

    name = "mock-cluster"
    ready_timeout = 20.0
    log_tail_size = 3000
    new_session = True

    def __init__(self, brokers: int = 3, *, debug: str = "", log_path: Path | None = None) -> None:
        """``debug``: librdkafka debug contexts for the child's log (``log_path``), e.g.
        ``"mock"`` to see every log append and refused batch."""
        super().__init__(log_path)
        self.debug = debug
        if brokers < 1:
            raise ValueError(f"a mock cluster needs at least one broker, not {brokers}")
        self.brokers = brokers
        self.control_port = free_port()
        self._authkey = secrets.token_hex(16)
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        self._bootstrap = ""

    # ----------------------------------------------------------------- the process
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "durable_producer.local.mock_cluster",
            "--brokers",
            str(self.brokers),
            "--control-port",
            str(self.control_port),
            *(["--debug", self.debug] if self.debug else []),
        ]

    def environment(self) -> dict[str, str]:
        return dict(os.environ, **{AUTHKEY_ENV: self._authkey}, PYTHONUNBUFFERED="1")

    def is_ready(self) -> bool:
        try:
            connection = Client((LOOPBACK, self.control_port), authkey=self._authkey.encode())
        except OSError:
            return False
        self._connection = connection
        self._bootstrap = str(self._call("bootstraps"))
        return True

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def stop(self, timeout: float = 10.0) -> int | None:
        """Destroy the cluster and let the child exit; SIGKILL after ``timeout``."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(OSError, EOFError):
                connection.send(("close", ()))
            connection.close()
            process = self.process
            if process is not None:  # it exits by itself once closed: no SIGTERM race (-15)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=timeout)
        return super().stop(timeout)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
        super().close()

    def _call(self, call: str, *args: Any) -> Any:
        with self._lock:
            connection = self._connection
            if connection is None:
                raise MockClusterError(f"{self.name} is not running")
            try:
                connection.send((call, args))
                ok, result = connection.recv()
            except (OSError, EOFError) as error:
                raise MockClusterError(
                    f"{self.name} did not answer {call}: {error}\n{self.log_tail()}"
                ) from error
        if not ok:
            raise MockClusterError(str(result))
        return result

    # ----------------------------------------------------------------- the cluster
    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of every broker, for ``bootstrap.servers``."""
        return self._bootstrap

    @property
    def broker_ids(self) -> range:
        return range(1, self.brokers + 1)

    def topic_create(self, topic: str, partitions: int, replication_factor: int = 3) -> None:
        """Create ``topic``; the replication factor is capped at the number of brokers."""
        self._call("topic_create", topic, partitions, replication_factor)

    def topic_set_error(self, topic: str, error: int) -> None:
        """Metadata requests answer ``error`` for ``topic``; 0 clears it."""
        self._call("topic_set_error", topic, error)

    def partition_set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        self._call("partition_set_leader", topic, partition, broker_id)

    def broker_set_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones; its partitions keep it as
        leader (and are unavailable) until ``partition_set_leader`` moves them."""
        self._call("broker_set_down", broker_id)

    def broker_set_up(self, broker_id: int) -> None:
        self._call("broker_set_up", broker_id)

    def broker_set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Every response of the broker is delayed by ``rtt_ms`` milliseconds (0: none)."""
        self._call("broker_set_rtt", broker_id, rtt_ms)

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """The next ``len(errors)`` requests of ``api_key`` (``API_PRODUCE``, ...) to any
        broker, from any client, get these error codes in order, instead of being served."""
        self._call("push_request_errors", api_key, [int(code) for code in errors])

    def clear_request_errors(self, api_key: int) -> None:
        """Drop the errors still pushed for ``api_key``."""
        self._call("clear_request_errors", api_key)

    # ----------------------------------------------------------------- conveniences
    @contextlib.contextmanager
    def brokers_down(self, broker_ids: Iterable[int]) -> Iterator[None]:
        """Brokers down for the duration of the block; always up again afterwards."""
        down = list(broker_ids)
        for broker_id in down:
            self.broker_set_down(broker_id)
        try:
            yield
        finally:
            for broker_id in down:
                self.broker_set_up(broker_id)

    @contextlib.contextmanager
    def slow(self, rtt_ms: int, broker_ids: Iterable[int] | None = None) -> Iterator[None]:
        """Every broker (or those given) answers ``rtt_ms`` late for the block's duration."""
        slowed = list(self.broker_ids if broker_ids is None else broker_ids)
        for broker_id in slowed:
            self.broker_set_rtt(broker_id, rtt_ms)
        try:
            yield
        finally:
            for broker_id in slowed:
                self.broker_set_rtt(broker_id, 0)

    def watermarks(self, topic: str, partition: int, timeout: float = 10.0) -> tuple[int, int]:
        """(low, high) offsets of a partition, asked of the cluster like any client would."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "watermarks"})
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
        finally:
            consumer.close()
        return int(low), int(high)

    def low_watermark(self, topic: str, partition: int) -> int:
        """The partition's log start offset: above 0, the mock dropped its oldest records."""
        return self.watermarks(topic, partition)[0]


# --------------------------------------------------------------------- the child
def serve(cluster: RdKafkaMockCluster, listener: Listener) -> None:
    """Answer control calls, one connection at a time, until a ``close`` call."""
    while True:
        with listener.accept() as connection:
            while True:
                try:
                    call, args = connection.recv()
                except (EOFError, OSError):
                    break  # that client went away; wait for the next
                if call == "close":
                    return
                if call not in _CALLS:
                    connection.send((False, f"unknown mock-cluster call {call!r}"))
                    continue
                try:
                    result = getattr(cluster, call)(*args)
                except (MockClusterError, ValueError, TypeError) as error:
                    connection.send((False, str(error)))
                else:
                    connection.send((True, result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_producer.local.mock_cluster",
        description="Run librdkafka's mock Kafka cluster; control it with MockCluster.",
    )
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--debug", default="", help="librdkafka debug contexts, e.g. mock")
    args = parser.parse_args(argv)
    authkey = os.environ.get(AUTHKEY_ENV)
    if not authkey:
        print(f"mock cluster: set {AUTHKEY_ENV} (the control connection's key)", file=sys.stderr)
        return 2

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, terminate)
    cluster = RdKafkaMockCluster(args.brokers, debug=args.debug)
    try:
        with Listener((LOOPBACK, args.control_port), authkey=authkey.encode()) as listener:
            print(
                f"mock cluster ready: {args.brokers} brokers at {cluster.bootstraps()}"
                f" (librdkafka {cluster.librdkafka_version}), pid {os.getpid()}",
                flush=True,
            )
            serve(cluster, listener)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
