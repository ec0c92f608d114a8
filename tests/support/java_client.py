"""The Apache Kafka Java client in the tests: ``tests/support/java/JavaProducer.java``, compiled
with javac against the kafka-clients jars ``make tools`` installs (scripts/install-java-client.sh,
``.tools/java-client/<version>/libs``) and run as a child process.

The classes are compiled once per content (source and jars) into ``.tools/java-client/<version>/
classes-<hash>``, so a second run starts at once. ``JavaProducer(settings)`` takes producer
settings as the Java client spells them; ``send(records)`` produces ``ClientRecord``s and returns
what the client's callbacks said of each, and what it logged (slf4j-simple, on stderr).
Without the jars, javac or java, the fixtures fail in one line naming what to do.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durable_producer.local.kafka_node import KAFKA_VERSION, java_binary

from .client_records import ClientRecord, Outcome
from .tools import REPO_ROOT

JAVA_CLIENT_DIR = REPO_ROOT / ".tools" / "java-client" / KAFKA_VERSION
JAVA_CLIENT_LIBS = JAVA_CLIENT_DIR / "libs"
JAVA_SOURCE = Path(__file__).with_name("java") / "JavaProducer.java"
MAIN_CLASS = "JavaProducer"
JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData")
"""A small client JVM: it shares two cores with a broker, an agent and the test."""
COMPILE_TIMEOUT_SECONDS = 120.0
NULL_FIELD = "-"


class JavaClientNotInstalled(RuntimeError):
    """The Java client's jars, javac or java are missing; the message says what to do."""


def java_client_libs() -> Path:
    """The folder of kafka-clients and its runtime jars."""
    if not (JAVA_CLIENT_LIBS / f"kafka-clients-{KAFKA_VERSION}.jar").is_file():
        raise JavaClientNotInstalled(
            f"the Kafka Java client {KAFKA_VERSION} is not installed (no {JAVA_CLIENT_LIBS}):"
            " run `make tools` in the repository"
        )
    return JAVA_CLIENT_LIBS


def javac_binary() -> str:
    """``$JAVA_HOME/bin/javac``, else ``javac`` from ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise JavaClientNotInstalled(
            "javac not found: install a Java 17 JDK"
            " (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
        )
    return found


def classpath(classes: Path, libs: Path) -> str:
    return os.pathsep.join([str(classes), str(libs / "*")])


def compiled_classes() -> Path:
    """The compiled program: compiled now unless this source and these jars were before."""
    libs = java_client_libs()
    digest = hashlib.sha256(JAVA_SOURCE.read_bytes())
    for jar in sorted(libs.glob("*.jar")):
        digest.update(jar.name.encode())
    target = JAVA_CLIENT_DIR / f"classes-{digest.hexdigest()[:16]}"
    if (target / f"{MAIN_CLASS}.class").is_file():
        return target
    javac = javac_binary()
    JAVA_CLIENT_DIR.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="compiling-", dir=JAVA_CLIENT_DIR))
    try:
        done = subprocess.run(
            [javac, "-nowarn", "-d", str(staging), "-cp", str(libs / "*"), str(JAVA_SOURCE)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"javac {JAVA_SOURCE.name} failed:\n{done.stderr[-3000:]}")
        with contextlib.suppress(OSError):  # another test run compiled it meanwhile
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for stale in JAVA_CLIENT_DIR.glob("classes-*"):  # compiled from an older source
        if stale != target:
            shutil.rmtree(stale, ignore_errors=True)
    return target


def record_line(record: ClientRecord) -> str:
    """The record as a line of the program's records file (see JavaProducer.java)."""

    def field_text(data: bytes | None) -> str:
        return NULL_FIELD if data is None else base64.b64encode(data).decode()

    headers = ",".join(
        f"{field_text(name.encode())}:{field_text(value)}" for name, value in record.headers
    )
    return "\t".join(
        [
            record.topic,
            NULL_FIELD if record.partition is None else str(record.partition),
            NULL_FIELD if record.timestamp_ms is None else str(record.timestamp_ms),
            field_text(record.key),
            field_text(record.value),
            headers,
        ]
    )


@dataclass
class JavaRun:
    """A finished run: one outcome per record (in order), progress lines, the client's log."""

    outcomes: list[Outcome]
    seconds: float
    log: str
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [outcome.error for outcome in self.outcomes if outcome.error is not None]

    @property
    def acknowledged(self) -> list[int]:
        return [index for index, outcome in enumerate(self.outcomes) if outcome.error is None]


class RunningSend:
    """A ``send`` in progress: ``progress()`` is the latest progress line, ``wait()`` the run."""

    def __init__(self, process: subprocess.Popen[str], stderr: IO[str], work_dir: Path) -> None:
        self._process = process
        self._stderr = stderr
        self._work_dir = work_dir
        self._progress: list[dict[str, Any]] = []
        self._final: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            if "progress" in message:
                self._progress.append(message["progress"])
            else:
                self._final = message

    def progress(self) -> dict[str, Any]:
        return self._progress[-1] if self._progress else {"sent": 0, "acked": 0, "failed": 0}

    def log(self) -> str:
        self._stderr.flush()
        return (self._work_dir / "client.log").read_text(errors="replace")

    def wait(self, timeout: float) -> JavaRun:
        try:
            returncode = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the Java producer did not finish within {timeout}s; last progress"
                f" {self.progress()}; its log ends:\n{self.log()[-3000:]}"
            ) from None
        self._reader.join(10)
        log = self.log()
        if returncode != 0 or self._final is None:
            raise AssertionError(f"the Java producer exited with {returncode}:\n{log[-3000:]}")
        outcomes = [
            Outcome(
                partition=item.get("partition"),
                offset=item.get("offset"),
                timestamp_ms=item.get("timestamp"),
                error=item["error"],
            )
            for item in self._final["results"]
        ]
        return JavaRun(outcomes, float(self._final["seconds"]), log, list(self._progress))

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(30)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


class JavaProducer:
    """The Java producer with ``settings`` (Java client names: ``bootstrap.servers``,
    ``compression.type``, ``transactional.id``...); ``log_level`` is slf4j-simple's
    (``warn`` shows retries and refusals without the configuration dump of ``info``)."""

    def __init__(
        self, settings: Mapping[str, str | int | bool], work_dir: Path, *, log_level: str = "warn"
    ) -> None:
        self.settings = {name: _java_text(value) for name, value in settings.items()}
        self.work_dir = work_dir
        self.log_level = log_level
        self.classes = compiled_classes()
        self.java = java_binary()

    def _command(self, mode: str, harness: Mapping[str, str], records: Path | None) -> list[str]:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        settings_file = self.work_dir / f"{mode}.properties"
        lines = [f"{name}={value}" for name, value in self.settings.items()]
        lines += [f"harness.{name}={value}" for name, value in harness.items()]
        settings_file.write_text("\n".join(lines) + "\n")
        return [
            self.java,
            *JVM_OPTIONS,
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={self.log_level}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-cp",
            classpath(self.classes, java_client_libs()),
            MAIN_CLASS,
            mode,
            str(settings_file),
            *([str(records)] if records is not None else []),
        ]

    def start_send(self, records: Iterable[ClientRecord], *, rate: float = 0.0) -> RunningSend:
        """Start sending ``records`` (``rate`` records a second; 0: as fast as it can)."""
        records_file = self.work_dir / "records.tsv"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        records_file.write_text("".join(record_line(record) + "\n" for record in records))
        command = self._command("send", {"rate": str(rate)}, records_file)
        stderr = open(self.work_dir / "client.log", "w")  # noqa: SIM115 (closed by RunningSend)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True
        )
        return RunningSend(process, stderr, self.work_dir)

    def send(
        self, records: Sequence[ClientRecord], *, rate: float = 0.0, timeout: float = 180.0
    ) -> JavaRun:
        """Send ``records``, flush and close; every record's outcome."""
        with contextlib.closing(self.start_send(records, rate=rate)) as running:
            return running.wait(timeout)

    def init_transactions(self, timeout: float = 120.0) -> dict[str, Any] | None:
        """``initTransactions()``: the exception it raised (class, message, causes), or None."""
        done = subprocess.run(
            self._command("init-transactions", {}, None),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"the Java producer exited with {done.returncode}:\n{done.stderr}")
        exception: dict[str, Any] | None = json.loads(done.stdout.splitlines()[-1])["exception"]
        if exception is not None:
            exception["log"] = done.stderr
        return exception


def _java_text(value: str | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
