"""One Apache Kafka node (KRaft, broker and controller in one JVM) as a child process.

The jars come from Maven Central (``scripts/kafka/pom.xml``, installed by ``make tools`` into
``.tools/kafka/<version>/libs``; ``DURABLE_PRODUCER_KAFKA_LIBS`` points elsewhere). ``java``
is taken from ``JAVA_HOME`` or ``PATH``.

A node has its own work directory (``server.properties``, ``log4j2.properties``, ``data/``
and the log ``kafka.log``) and three loopback listeners, all fixed when it is created so that
it restarts on the same data and ports: ``CLIENT`` (what clients bootstrap from; it may
advertise another address, a fault proxy's), ``INTERNAL`` (replication between brokers) and
``CONTROLLER`` (the KRaft quorum). Its storage is formatted with ``kafka.tools.StorageTool``
before the first start. ``kill()`` is kill -9, ``stop()`` the graceful end (SIGTERM: a
controlled shutdown), ``suspend()``/``resume()`` SIGSTOP/SIGCONT, and ``start()`` again
restarts it. ``close()`` (and leaving a with-block) kills it and deletes a work directory
it created itself.

``KafkaBroker`` (a single node) and ``KafkaCluster`` (three) are built on it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from confluent_kafka.admin import AdminClient

from .ports import LOOPBACK, free_port
from .process import ManagedProcess

KAFKA_VERSION = "4.1.2"
"""The Kafka release the test bed runs; scripts/kafka/pom.xml pins the same (a unit test checks)."""
KAFKA_LIBS_ENV = "DURABLE_PRODUCER_KAFKA_LIBS"
"""Folder of Kafka's jars to use instead of ``<repo>/.tools/kafka/<version>/libs``."""
KAFKA_MAIN_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"
JVM_OPTIONS = (
    "-Xmx512m",
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""Small JVMs: three of them share two cores with the tests (C1 only, serial GC)."""
KAFKA_START_SCRIPT_JVM_OPTIONS = (
    "-Xmx1G",
    "-Xms1G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
"""What Kafka's own ``kafka-server-start.sh`` gives a broker (its heap and performance
options, C2 on): the benchmarks that compare with a broker run it this way by default."""
FORMAT_TIMEOUT_SECONDS = 60.0
STARTED_MARKER = b"Kafka Server started"
"""KafkaRaftServer logs it once the broker is unfenced (BrokerServer.startup waits for that)."""

SMALL_MACHINE_PROPERTIES: Mapping[str, str] = {
    # fewer threads and buffers than a production broker: the test bed runs on two cores
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "num.replica.fetchers": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    # internal topics with a handful of partitions are created in a moment (the default 50
    # make the first consumer group or transaction wait seconds)
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.num.partitions": "4",
    # a consumer group starts at once instead of waiting 3 s for more members
    "group.initial.rebalance.delay.ms": "0",
    # a broker that stops heartbeating is fenced after 6 s instead of 9 s: a killed leader
    # moves sooner, and a node restarted after kill -9 (which must wait for its previous
    # incarnation's session to expire) is back sooner
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1500",
}
"""Server settings every local node gets (test-bed sizing and timing; no semantic change)."""

LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaNotInstalled(RuntimeError):
    """Kafka's jars or java are missing; the message says what to do, in one line."""


def repository_roots() -> list[Path]:
    """Where ``.tools/`` may be: the checkout this package is installed from (editable
    install), then the current directory."""
    here = Path(__file__).resolve().parents[3]
    roots = [here, Path.cwd().resolve()]
    return list(dict.fromkeys(roots))


def kafka_libs() -> Path:
    """The folder of Kafka's jars; ``KafkaNotInstalled`` when there is none."""
    override = os.environ.get(KAFKA_LIBS_ENV)
    if override:
        libs = Path(override)
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise KafkaNotInstalled(
                f"{KAFKA_LIBS_ENV}={override} holds no Kafka jars (kafka_2.13-*.jar);"
                " unset it to use the ones `make tools` installs"
            )
        return libs
    candidates = [root / ".tools" / "kafka" / KAFKA_VERSION / "libs" for root in repository_roots()]
    for libs in candidates:
        if (libs / KAFKA_MAIN_JAR).is_file():
            return libs
    raise KafkaNotInstalled(
        f"Apache Kafka {KAFKA_VERSION} is not installed (no {candidates[0]}):"
        f" run `make tools` in the repository, or set {KAFKA_LIBS_ENV} to a folder of its jars"
    )


def java_binary() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` from ``PATH``; ``KafkaNotInstalled`` if neither."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaNotInstalled("java not found: install Java 17 or set JAVA_HOME")
    return found


def new_cluster_id() -> str:
    """A KRaft cluster id (what ``kafka-storage random-uuid`` prints: a url-safe base64 UUID).

    Like Kafka's ``Uuid.randomUuid`` it never starts with "-": StorageTool's argument parser
    takes ``--cluster-id -x...`` for a missing value (1 id in 64 failed to format)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def quiet_admin(bootstrap: str) -> AdminClient:
    """An admin client that does not log to stderr about brokers that are down (tests kill
    them on purpose; the helpers report what they wait for themselves)."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})


class KafkaNode(ManagedProcess):
    """One combined-mode Kafka node; see the module docstring.

    ``voters`` lists every controller of the quorum as ``(node id, "host:port")``; without it
    the node is a quorum of its own (formatted ``--standalone``). ``advertise`` is the address
    clients are told to use for the ``CLIENT`` listener. ``properties`` override or add
    server settings; ``jvm_options`` replace the small test-bed JVM's.
    """

    name = "kafka"
    ready_timeout = 90.0
    log_tail_size = 6000
    new_session = True

    def __init__(
        self,
        node_id: int = 1,
        *,
        work_dir: Path | None = None,
        client_port: int | None = None,
        controller_port: int | None = None,
        advertise: str | None = None,
        voters: Sequence[tuple[int, str]] | None = None,
        cluster_id: str | None = None,
        properties: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = JVM_OPTIONS,
    ) -> None:
        self._temporary_dir = work_dir is None
        if work_dir is None:
            work_dir = Path(tempfile.mkdtemp(prefix=f"kafka-node-{node_id}-"))
        work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = work_dir
        super().__init__(log_path=work_dir / "kafka.log")
        self.node_id = node_id
        self.client_port = client_port or free_port()
        self.internal_port = free_port()
        self.controller_port = controller_port or free_port()
        self.advertise = advertise or f"{LOOPBACK}:{self.client_port}"
        self.voters = list(voters) if voters is not None else None
        self.cluster_id = cluster_id or new_cluster_id()
        self.extra_properties = dict(properties or {})
        self.jvm_options = tuple(jvm_options)
        self.suspended = False
        self._log_offset = 0
        self._started_seen = False
        self.libs = kafka_libs()
        self.java = java_binary()

    # -- addresses -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The address clients should bootstrap from (the advertised one)."""
        return self.advertise

    @property
    def direct_address(self) -> str:
        """The node's own client listener, bypassing any proxy."""
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def controller_address(self) -> str:
        return f"{LOOPBACK}:{self.controller_port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    # -- configuration ---------------------------------------------------------------------

    def server_properties(self) -> dict[str, str]:
        """Every setting written to ``server.properties``."""
        listeners = {
            "CLIENT": f"{LOOPBACK}:{self.client_port}",
            "INTERNAL": f"{LOOPBACK}:{self.internal_port}",
            "CONTROLLER": self.controller_address,
        }
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": ",".join(f"{name}://{address}" for name, address in listeners.items()),
            "advertised.listeners": (
                f"CLIENT://{self.advertise},INTERNAL://{listeners['INTERNAL']}"
            ),
            "listener.security.protocol.map": ",".join(f"{name}:PLAINTEXT" for name in listeners),
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data_dir),
            **SMALL_MACHINE_PROPERTIES,
        }
        if self.voters is None:
            settings["controller.quorum.bootstrap.servers"] = self.controller_address
        else:
            settings["controller.quorum.voters"] = ",".join(
                f"{voter}@{address}" for voter, address in self.voters
            )
        settings.update(self.extra_properties)
        return settings

    def _write_config(self) -> None:
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        (self.work_dir / "server.properties").write_text("\n".join(lines) + "\n")
        (self.work_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)

    def _java(self, main_class: str, *arguments: str) -> list[str]:
        return [
            self.java,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            str(self.libs / "*"),
            main_class,
            *arguments,
        ]

    @property
    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()

    def format(self) -> None:
        """Write the config and format the storage (once; a restart keeps the data)."""
        self._write_config()
        if self.formatted:
            return
        command = self._java(
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(self.work_dir / "server.properties"),
            "--cluster-id",
            self.cluster_id,
            *(["--standalone"] if self.voters is None else []),
        )
        with open(self.log_path, "ab") as log:
            result = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=FORMAT_TIMEOUT_SECONDS,
                check=False,
            )
        if result.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka node {self.node_id} storage failed"
                f" (exit {result.returncode}):\n{self.log_tail()}"
            )

    # -- process ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        return self._java("kafka.Kafka", str(self.work_dir / "server.properties"))

    def launch(self) -> None:
        self.format()
        with contextlib.suppress(OSError):
            self._log_offset = self.log_path.stat().st_size
        self._started_seen = False
        self.suspended = False
        super().launch()

    def start(self, timeout: float | None = None) -> Self:
        """Format if needed, start, and wait until the broker serves clients. A node that
        fails to start is killed, its data kept (``close`` deletes it)."""
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def is_ready(self) -> bool:
        """The broker logged that it started (it is unfenced), and its own listener lists it
        in a metadata response."""
        if not self._started_seen:
            try:
                with open(self.log_path, "rb") as log:
                    log.seek(self._log_offset)
                    self._started_seen = STARTED_MARKER in log.read()
            except OSError:
                return False
            if not self._started_seen:
                return False
        try:
            metadata = quiet_admin(self.direct_address).list_topics(timeout=2.0)
        except Exception:
            return False
        return self.node_id in metadata.brokers

    def stop(self, timeout: float = 60.0) -> int | None:
        """Graceful: SIGTERM (a controlled shutdown) and wait; SIGKILL after ``timeout``."""
        if self.suspended:
            self.resume()
        return super().stop(timeout)

    def kill(self) -> None:
        super().kill()
        self.suspended = False

    def suspend(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered (a hung broker)."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"Kafka node {self.node_id} is not running")
        os.kill(self.process.pid, signal.SIGSTOP)
        self.suspended = True

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
        self.suspended = False

    def close(self) -> None:
        super().close()
        if self._temporary_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
