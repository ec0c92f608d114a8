"""Ingest through the buffer agent vs producing straight to the local broker (Apache Kafka, one
KRaft node, or with ``--cluster`` three brokers: RF 3, ``min.insync.replicas=2``).

Not a test: prints figures side by side, as ratios, from one run on one machine.

    .venv/bin/python benchmarks/ingest_bench.py [--records 2000000] [--rounds 3] [--cluster]
        [--baseline-src CHECKOUT_OF_AN_OLDER_COMMIT]

Each figure comes from a fresh endpoint (a new Kafka node or 3-node cluster, or a new agent
process with an empty WAL, fsync ``interval``), and broker and agent alternate within every
round, so the noise of
this shared machine hits both (with ``--baseline-src``, a third endpoint runs the agent of an
older checkout, for before/after figures from one run). Three measurements, each for 200 B
and 2 KiB records:

1. **Throughput with real clients**: ``--producers`` librdkafka producer processes send the
   same records with the same settings (acks=all, idempotence, linger.ms=5, batch.size 1 MB,
   no compression) to either endpoint; ``--linger-ms 0`` for clients that send each record
   at once (a batch holds what queued while the requests before it were in flight). The
   default client is ``rdkafka_producer.c``, the smallest librdkafka application (one shared
   payload, reports only on failure), compiled here against the librdkafka that
   confluent-kafka ships: on two shared cores the clients' CPU caps what any endpoint can
   take, so the load generator should cost no more than librdkafka itself. ``--client kcat``
   uses kcat instead (it reads and copies each record from a file: ~2.2 client CPU-us a
   200 B record against ~1.6; Debian's kcat links librdkafka 2.0.2; it runs on the wheel's
   library, as it had to with the earlier stand-in broker), and ``--client python``
   confluent-kafka producer processes (a Python loop caps near 200k records/s, DESIGN.md 4).
2. **Capacity with replayed requests**: ``--connections`` connections pipelining pre-encoded
   Produce requests of one ~1 MB batch each (the size librdkafka builds under this load),
   acks=all: the client costs almost nothing, so the endpoint is the bottleneck.
3. **Latency**: one confluent-kafka producer process paced at ``--paced-bytes-per-s``, well
   below both endpoints' capacity; p50/p99 of delivery-report time minus produce() time,
   sampled on up to 20,000 records. (Several paced processes on two cores measure the CPU
   scheduler instead: the producers' polling loops starve whichever endpoint has one thread.)

Next to each rate, the endpoint's own CPU (user + system seconds of its process) per million
records: what the agent costs the pod, whatever the load generator does (with ``--cluster``,
the three brokers' CPU together).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

TOPIC = "bench"
PARTITIONS = 8
LATENCY_SAMPLES = 20_000
"""Records whose delivery time is sampled in a paced run (a callback per record costs)."""
REPLAY_BATCH_BYTES = 960_000
"""Records per replayed batch: as many as fit here (the agent's default max batch is 1 MB)."""


LINGER_MS = 5
"""``--linger-ms``: the clients' ``linger.ms`` (the Python and paced producers' too)."""


def producer_config(bootstrap: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    }


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of processes so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- endpoints
@dataclass(frozen=True)
class Endpoint:
    name: str
    bootstrap: str
    pids: tuple[int, ...]


CLUSTER = False
"""``--cluster``: the broker side is three Kafka nodes (RF 3, min.insync.replicas 2)."""
BROKER_JVM = "kafka"
"""``--broker-jvm`` (``bench_brokers.BROKER_JVMS``)."""


def broker_jvm_options() -> tuple[str, ...]:
    from bench_brokers import BROKER_JVMS  # not at the top: --serve-agent may run older code

    return BROKER_JVMS[BROKER_JVM]


@contextmanager
def fresh_broker() -> Iterator[Endpoint]:
    """A new Kafka node, or with ``--cluster`` a new 3-node cluster, with the topic, warmed up
    by one idempotent record (so the clock does not time the creation of its internal topics)."""
    from confluent_kafka import Producer

    from support.broker import KafkaBroker, KafkaCluster, create_topic

    jvm = broker_jvm_options()
    kafka = KafkaCluster(jvm_options=jvm) if CLUSTER else KafkaBroker(jvm_options=jvm)
    with kafka:
        create_topic(kafka.bootstrap, TOPIC, PARTITIONS)
        warm = Producer(producer_config(kafka.bootstrap))
        warm.produce(TOPIC, b"warm-up", partition=0)
        if warm.flush(60):
            raise RuntimeError("the broker did not take the warm-up record")
        nodes = kafka.nodes if isinstance(kafka, KafkaCluster) else [kafka]
        pids = tuple(node.process.pid for node in nodes if node.process is not None)
        yield Endpoint("broker", kafka.bootstrap, pids)


def broker_description() -> str:
    kind = "3 brokers (KRaft), RF 3, min.insync.replicas 2" if CLUSTER else "one KRaft node"
    return f"Apache Kafka, {kind}, fresh per measurement, JVM: {' '.join(broker_jvm_options())}"


AGENT_FSYNC = "interval"


BASELINE_SRC: Path | None = None
"""``--baseline-src``: another source tree (its ``src``) served as a third endpoint."""


@contextmanager
def fresh_agent() -> Iterator[Endpoint]:
    """An agent process (ingest only) with an empty WAL; the topic has PARTITIONS partitions."""
    with serve_agent_process("agent", None) as endpoint:
        yield endpoint


@contextmanager
def fresh_baseline_agent() -> Iterator[Endpoint]:
    """The same, running the code of ``--baseline-src`` (an older commit, say)."""
    assert BASELINE_SRC is not None
    with serve_agent_process("base", BASELINE_SRC) as endpoint:
        yield endpoint


@contextmanager
def serve_agent_process(name: str, source: Path | None) -> Iterator[Endpoint]:
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as scratch:
        port_file = Path(scratch) / "port"
        env = dict(os.environ)
        if source is not None:  # ahead of the editable install's path
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve-agent", scratch, str(port_file), AGENT_FSYNC],
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the agent did not start")
                time.sleep(0.05)
            yield Endpoint(name, f"127.0.0.1:{port_file.read_text()}", (process.pid,))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def serve_agent(data_dir: Path, port_file: Path, fsync: str) -> None:
    from durable_producer.buffer_agent.ingest.metadata import MetadataCache

    try:
        from durable_producer.buffer_agent.ingest.config import IngestConfig
        from durable_producer.buffer_agent.ingest.server import IngestServer
    except ImportError:  # a --baseline-src from before issue 26 named them Ingress*
        from durable_producer.buffer_agent.ingest.config import (  # type: ignore[attr-defined,no-redef]
            IngressConfig as IngestConfig,
        )
        from durable_producer.buffer_agent.ingest.server import (  # type: ignore[attr-defined,no-redef]
            IngressServer as IngestServer,
        )
    from durable_producer.buffer_agent.kafka.cluster_metadata import TopicFacts
    from durable_producer.buffer_agent.process_tuning import prepare_to_serve
    from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog

    def partitions(topics: Sequence[str]) -> Mapping[str, TopicFacts]:
        return {topic: TopicFacts(PARTITIONS) for topic in topics}

    async def main() -> None:
        wal = WriteAheadLog.open(
            data_dir / "wal",
            WalConfig(fsync=FsyncPolicy(fsync), max_bytes=32 << 30, segment_bytes=256 << 20),
        )
        server = IngestServer(
            wal,
            MetadataCache(data_dir / "state", partitions),
            data_dir / "state",
            IngestConfig(port=0),
        )
        await server.start()
        prepare_to_serve()  # as the agent does once it serves
        port_file.write_text(str(server.port))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop()
        wal.close()

    asyncio.run(main())


# ---------------------------------------------------------------------- measurements
@dataclass
class Rate:
    records: int
    seconds: float
    endpoint_cpu_s: float
    size: int

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.records * self.size / self.seconds / 1e6

    @property
    def cpu_s_per_m(self) -> float:
        return self.endpoint_cpu_s / self.records * 1e6


def measure(endpoint: Endpoint, size: int, run: Callable[[], int]) -> Rate:
    before = cpu_seconds(endpoint.pids)
    started = time.perf_counter()
    records = run()
    seconds = time.perf_counter() - started
    return Rate(records, seconds, cpu_seconds(endpoint.pids) - before, size)


def wheel_librdkafka() -> Path | None:
    """The librdkafka shared library inside the confluent-kafka wheel (2.x, current)."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(glob.glob(str(libs / "librdkafka*.so*")))
    return Path(found[0]) if found else None


def build_rdkafka_producer(scratch: Path) -> Path | None:
    """Compile ``rdkafka_producer.c`` against the wheel's librdkafka.

    None (with the reason on stderr) without a C compiler, librdkafka's header (Debian's
    librdkafka-dev; ``make bench-tools`` installs both) or the wheel's library.
    """
    library = wheel_librdkafka()
    compiler = shutil.which("cc") or shutil.which("gcc")
    if library is None or compiler is None:
        print("no C compiler or no librdkafka in the confluent-kafka wheel", file=sys.stderr)
        return None
    binary = scratch / "rdkafka_producer"
    source = Path(__file__).with_name("rdkafka_producer.c")
    command = [compiler, "-O2", "-o", str(binary), str(source), str(library)]
    command.append(f"-Wl,-rpath,{library.parent}")
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        print(f"could not compile {source.name}: {built.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return binary


def kcat_library_dir(scratch: Path) -> Path | None:
    """A directory whose librdkafka.so.1 is the one inside the confluent-kafka wheel."""
    library = wheel_librdkafka()
    if library is None:
        return None
    target = scratch / "librdkafka"
    target.mkdir(exist_ok=True)
    link = target / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(library)
    return target


def write_record_file(path: Path, records: int, size: int) -> None:
    """``records`` lines of ``size`` random hex characters (kcat sends one record a line)."""
    line = os.urandom(size // 2).hex().encode() + b"\n"
    assert len(line) == size + 1
    with path.open("wb") as out:
        chunk = line * 10_000
        for _ in range(records // 10_000):
            out.write(chunk)
        out.write(line * (records % 10_000))


def client_settings(bootstrap: str) -> list[str]:
    """``producer_config`` as ``-X key=value`` arguments (kcat's and rdkafka_producer's)."""
    arguments = []
    for key, value in producer_config(bootstrap).items():
        if key != "bootstrap.servers":
            arguments += ["-X", f"{key}={str(value).lower()}"]
    return arguments


def kcat_command(bootstrap: str, record_file: Path) -> list[str]:
    command = ["kcat", "-P", "-q", "-b", bootstrap, "-t", TOPIC, "-l", str(record_file)]
    return command + client_settings(bootstrap)


def rdkafka_command(binary: Path, bootstrap: str, records: int, size: int) -> list[str]:
    command = [str(binary), bootstrap, TOPIC, str(records), str(size)]
    return command + client_settings(bootstrap)


def run_client_processes(
    command: list[str], records_each: int, processes: int, library_dir: Path | None = None
) -> Callable[[], int]:
    """Start ``processes`` copies of ``command`` at once; the records they all sent."""

    def run() -> int:
        env = dict(os.environ)
        if library_dir is not None:
            env["LD_LIBRARY_PATH"] = str(library_dir)
        producers = [
            subprocess.Popen(command, env=env, stderr=subprocess.PIPE) for _ in range(processes)
        ]
        failures = []
        for producer in producers:
            _, stderr = producer.communicate(timeout=600)
            if producer.returncode != 0:
                failures.append(stderr.decode(errors="replace")[-500:])
        if failures:
            raise RuntimeError(f"{command[0]} failed: {failures}")
        return records_each * processes

    return run


def produce_worker(
    config: dict[str, object],
    records: int,
    size: int,
    start_at: float,
    rate: float | None,
    results: multiprocessing.Queue,
) -> None:
    """Produce ``records`` as fast as possible, or paced at ``rate`` records/s, with ``config``
    (``producer_config``, made in the parent: a spawned child has the module's defaults)."""
    from confluent_kafka import Producer

    producer = Producer(config)
    producer.list_topics(TOPIC, timeout=10)
    value = os.urandom(size)
    latencies: list[float] = []
    errors = 0
    sample_every = max(1, records // LATENCY_SAMPLES)

    def on_delivery(error: object, _message: object, sent: float | None = None) -> None:
        nonlocal errors
        if error is not None:
            errors += 1
        elif sent is not None:
            latencies.append(time.perf_counter() - sent)

    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    for index in range(records):
        if rate is not None:
            while index > (time.perf_counter() - began) * rate:
                producer.poll(0.0005)
        while True:
            try:
                if index % sample_every == 0:
                    sent = time.perf_counter()
                    producer.produce(
                        TOPIC,
                        value,
                        partition=index % PARTITIONS,
                        on_delivery=lambda e, m, s=sent: on_delivery(e, m, s),
                    )
                else:
                    producer.produce(
                        TOPIC, value, partition=index % PARTITIONS, on_delivery=on_delivery
                    )
                break
            except BufferError:
                producer.poll(0.005)
        if index % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    results.put({"latencies": latencies, "errors": errors + left})


def run_python_producers(
    bootstrap: str, records: int, size: int, processes: int, rate: float | None = None
) -> tuple[int, list[float]]:
    """(records delivered, sampled latencies); raises if any record failed."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 2.0
    share = records // processes
    workers = [
        context.Process(
            target=produce_worker,
            args=(producer_config(bootstrap), share, size, start_at, rate, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(30)
    errors = sum(report["errors"] for report in reports)
    if errors:
        raise RuntimeError(f"{errors} records failed against {bootstrap}")
    return share * processes, sorted(x for report in reports for x in report["latencies"])


def python_producers(
    bootstrap: str, records: int, size: int, args: argparse.Namespace
) -> Callable[[], int]:
    def run() -> int:
        return run_python_producers(bootstrap, records, size, args.producers)[0]

    return run


def replay_requests(size: int) -> tuple[list[bytes], int]:
    """One size-prefixed Produce request (acks=all) per partition, and its record count."""
    from durable_producer.buffer_agent.kafka.protocol import API_PRODUCE
    from support.batch_builder import SampleRecord, build_batch
    from support.kafka_wire import encode_request, produce_body

    count = REPLAY_BATCH_BYTES // (size + 8)
    value = os.urandom(size)
    batch = build_batch([SampleRecord(None, value, 1_732_240_000_000 + i) for i in range(count)])
    requests = [
        encode_request(API_PRODUCE, 9, 1, produce_body(TOPIC, partition, batch))
        for partition in range(PARTITIONS)
    ]
    return requests, count


def replay_targets(bootstrap: str) -> list[tuple[str, list[int]]]:
    """Each partition leader's address and the partitions it leads (from metadata, as a
    client finds them: the agent leads every partition, a cluster's brokers share them)."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10)
    led: dict[int, list[int]] = {}
    for number, partition in sorted(metadata.topics[TOPIC].partitions.items()):
        led.setdefault(partition.leader, []).append(number)
    return [
        (f"{metadata.brokers[leader].host}:{metadata.brokers[leader].port}", partitions)
        for leader, partitions in sorted(led.items())
    ]


def run_replay(
    targets: list[tuple[str, list[int]]],
    requests: list[bytes],
    per_request: int,
    total: int,
    connections: int,
) -> Callable[[], int]:
    """``connections`` connections spread over the leaders, each pipelining the requests of
    the partitions its leader leads."""

    def connection(address: str, mine: list[bytes], count: int, failures: list[str]) -> None:
        from support.kafka_wire import recv_exactly

        try:
            host, port = address.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sent = answered = 0
                while answered < count:
                    while sent < count and sent - answered < 4:
                        sock.sendall(mine[sent % len(mine)])
                        sent += 1
                    (length,) = struct.unpack(">i", recv_exactly(sock, 4))
                    response = recv_exactly(sock, length)
                    error = produce_error_code(response)
                    if error:
                        failures.append(f"error code {error} from {address}")
                    answered += 1
        except Exception as error:  # reported by run()
            failures.append(f"{address}: {error!r}")

    def run() -> int:
        requests_each = max(1, total // per_request // connections)
        failures: list[str] = []
        threads = []
        for index in range(connections):
            address, partitions = targets[index % len(targets)]
            mine = [requests[partition] for partition in partitions]
            threads.append(
                threading.Thread(target=connection, args=(address, mine, requests_each, failures))
            )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise RuntimeError(f"replayed produce failed: {failures[:3]}")
        return requests_each * connections * per_request

    return run


def produce_error_code(response: bytes) -> int:
    from kio.serial import entity_reader

    from durable_producer.buffer_agent.kafka.protocol import API_PRODUCE, response_schema

    schema = response_schema(API_PRODUCE, 9)
    _, header_size = entity_reader(schema.__header_schema__)(response, 0)
    body, _ = entity_reader(schema)(response, header_size)
    return int(body.responses[0].partition_responses[0].error_code)


# ---------------------------------------------------------------------- the run
def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def main() -> None:
    global AGENT_FSYNC, BASELINE_SRC, CLUSTER, BROKER_JVM, LINGER_MS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, default=2_000_000, help="200 B records a run (2 KiB: a fifth)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2048])
    parser.add_argument("--client", choices=["rdkafka", "kcat", "python"], default="rdkafka")
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--connections", type=int, default=4, help="replay connections")
    parser.add_argument(
        "--paced-bytes-per-s",
        type=float,
        default=8e6,
        help="offered load of the latency run (below both endpoints' capacity)",
    )
    parser.add_argument("--paced-seconds", type=float, default=8.0)
    parser.add_argument(
        "--linger-ms", type=int, default=LINGER_MS, help="the clients' linger.ms (0: no wait)"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["clients", "replay", "latency"])
    parser.add_argument(
        "--fsync", choices=["interval", "always", "never"], default="interval", help="agent's"
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also serve the agent from this source tree's src/ (e.g. a `git worktree` of an"
        " older commit), alternating with the others in every round",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="produce straight to a 3-broker cluster (RF 3, min.insync.replicas 2) instead of"
        " one node",
    )
    parser.add_argument(
        "--broker-jvm",
        default=BROKER_JVM,
        help="kafka: the JVM options of Kafka's own start script (C2, G1, 1 GB heap; default);"
        " test-bed: the small C1-only JVM the tests use",
    )
    parser.add_argument("--serve-agent", nargs=3, metavar=("DATA_DIR", "PORT_FILE", "FSYNC"))
    args = parser.parse_args()
    if args.serve_agent:
        serve_agent(Path(args.serve_agent[0]), Path(args.serve_agent[1]), args.serve_agent[2])
        return
    from bench_brokers import BROKER_JVMS  # not at the top: --serve-agent may run older code

    if args.broker_jvm not in BROKER_JVMS:
        parser.error(f"--broker-jvm: choose one of {', '.join(BROKER_JVMS)}")
    AGENT_FSYNC = args.fsync
    LINGER_MS = args.linger_ms
    CLUSTER = args.cluster
    BROKER_JVM = args.broker_jvm
    print(
        f"broker: {broker_description()}; agent: ingest only, fsync {args.fsync};"
        f" clients' linger.ms {LINGER_MS}",
        flush=True,
    )

    endpoints: tuple[Callable[[], Any], ...] = (fresh_broker, fresh_agent)
    if args.baseline_src is not None:
        BASELINE_SRC = args.baseline_src.resolve() / "src"
        if not (BASELINE_SRC / "durable_producer").is_dir():
            parser.error(f"--baseline-src {args.baseline_src}: no src/durable_producer there")
        endpoints = (fresh_broker, fresh_baseline_agent, fresh_agent)
    rates: dict[tuple[str, int, str], list[Rate]] = {}
    latencies: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as scratch_name:
        scratch = Path(scratch_name)
        rdkafka_producer = None
        if args.client == "rdkafka":
            rdkafka_producer = build_rdkafka_producer(scratch)
            if rdkafka_producer is None:
                print(
                    "falling back to kcat (`make bench-tools` installs gcc and librdkafka-dev)",
                    file=sys.stderr,
                )
                args.client = "kcat"
        if args.client == "kcat" and shutil.which("kcat") is None:
            print(
                "kcat is not installed (Debian package kcat; `make bench-tools` installs it):"
                " using Python producer processes instead",
                file=sys.stderr,
            )
            args.client = "python"
        library_dir = kcat_library_dir(scratch) if args.client == "kcat" else None
        for size in args.sizes:
            records = args.records if size <= 512 else args.records // 5
            records_each = records // args.producers
            record_file = scratch / f"records-{size}.txt"
            if args.client == "kcat" and "clients" not in args.skip:
                write_record_file(record_file, records_each, size)
            requests, per_request = replay_requests(size)
            for round_number in range(1, args.rounds + 1):
                for fresh in endpoints:
                    if "clients" not in args.skip:
                        with fresh() as endpoint:
                            if rdkafka_producer is not None:
                                command = rdkafka_command(
                                    rdkafka_producer, endpoint.bootstrap, records_each, size
                                )
                                run = run_client_processes(command, records_each, args.producers)
                            elif args.client == "kcat":
                                command = kcat_command(endpoint.bootstrap, record_file)
                                run = run_client_processes(
                                    command, records_each, args.producers, library_dir
                                )
                            else:
                                run = python_producers(endpoint.bootstrap, records, size, args)
                            rate = measure(endpoint, size, run)
                            rates.setdefault(("clients", size, endpoint.name), []).append(rate)
                            report("clients", size, round_number, endpoint.name, rate)
                    if "replay" not in args.skip:
                        with fresh() as endpoint:
                            warm_up(endpoint.bootstrap)
                            run = run_replay(
                                replay_targets(endpoint.bootstrap),
                                requests,
                                per_request,
                                records,
                                args.connections,
                            )
                            rate = measure(endpoint, size, run)
                            rates.setdefault(("replay", size, endpoint.name), []).append(rate)
                            report("replay", size, round_number, endpoint.name, rate)
                    if "latency" not in args.skip:
                        with fresh() as endpoint:
                            paced_rate = args.paced_bytes_per_s / size
                            _, sampled = run_python_producers(
                                endpoint.bootstrap,
                                int(paced_rate * args.paced_seconds),
                                size,
                                1,
                                paced_rate,
                            )
                            p50, p99 = percentile(sampled, 0.5), percentile(sampled, 0.99)
                            latencies.setdefault((size, endpoint.name), []).append((p50, p99))
                            print(
                                f"latency {size:>5} B round {round_number} {endpoint.name:>6}:"
                                f" p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
                                f" ({len(sampled)} samples)",
                                flush=True,
                            )
    summarize(args, rates, latencies)


def warm_up(bootstrap: str) -> None:
    """Fetch metadata once, as any client does first (the agent learns the topic)."""
    from confluent_kafka import Producer

    Producer({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10)


def report(kind: str, size: int, round_number: int, name: str, rate: Rate) -> None:
    print(
        f"{kind:>7} {size:>5} B round {round_number} {name:>6}: {rate.records_per_s:>10,.0f}"
        f" rec/s {rate.mb_per_s:>7.1f} MB/s, endpoint CPU {rate.cpu_s_per_m:.2f} s/M records",
        flush=True,
    )


def summarize(
    args: argparse.Namespace,
    rates: dict[tuple[str, int, str], list[Rate]],
    latencies: dict[tuple[int, str], list[tuple[float, float]]],
) -> None:
    titles = {
        "clients": f"throughput, {args.producers} {args.client} producer processes",
        "replay": f"capacity, replayed ~1 MB produce requests on {args.connections} connections",
    }
    agents = ("base", "agent") if args.baseline_src is not None else ("agent",)
    summary: list[dict[str, Any]] = []
    print(f"\nmedians of {args.rounds} rounds (ratio = agent / broker, per round then median)")
    if args.baseline_src is not None:
        print(f"base: the agent of {args.baseline_src}; agent: this tree's")
    for kind, title in titles.items():
        if kind in args.skip:
            continue
        print(f"\n{title}")
        print(
            f"{'size':>6} {'':>5} {'broker rec/s':>13} {'agent rec/s':>12} {'ratio':>6}"
            f" {'per-round ratios':>22} {'CPU s/M broker':>15} {'agent':>6} {'ratio':>6}"
        )
        for size in args.sizes:
            broker = rates[(kind, size, "broker")]
            for name in agents:
                row = rate_row(kind, size, name, broker, rates[(kind, size, name)])
                summary.append(row)
                print(
                    f"{size:>6} {name:>5} {row['broker_records_per_s']:>13,.0f}"
                    f" {row['agent_records_per_s']:>12,.0f} {row['ratio']:>6.2f}"
                    f" {' '.join(f'{r:.2f}' for r in row['ratios']):>22}"
                    f" {row['broker_cpu_s_per_m']:>15.2f} {row['agent_cpu_s_per_m']:>6.2f}"
                    f" {row['cpu_ratio']:>6.2f}"
                )
    if latencies:
        print(
            f"\nlatency, one producer paced at {args.paced_bytes_per_s / 1e6:.0f} MB/s"
            " (agent / broker; medians of the rounds' percentiles)"
        )
        print(
            f"{'size':>6} {'':>5} {'p50 broker':>11} {'agent':>7} {'ratio':>6} {'p99 broker':>11}"
            f" {'agent':>7} {'ratio':>6}"
        )
        for size in args.sizes:
            if (size, "broker") not in latencies:
                continue
            for agent_name in agents:
                broker_p, agent_p = latencies[(size, "broker")], latencies[(size, agent_name)]
                row = {"kind": "latency", "size": size, "agent": agent_name}
                for index, name in enumerate(("p50", "p99")):
                    row[f"broker_{name}_ms"] = statistics.median(x[index] for x in broker_p) * 1e3
                    row[f"agent_{name}_ms"] = statistics.median(x[index] for x in agent_p) * 1e3
                summary.append(row)
                p50, p99 = row["agent_p50_ms"], row["agent_p99_ms"]
                print(
                    f"{size:>6} {agent_name:>5} {row['broker_p50_ms']:>11.2f}"
                    f" {p50:>7.2f} {p50 / row['broker_p50_ms']:>6.2f}"
                    f" {row['broker_p99_ms']:>11.2f} {p99:>7.2f} {p99 / row['broker_p99_ms']:>6.2f}"
                )
    print(json.dumps(summary))


def rate_row(
    kind: str, size: int, name: str, broker: list[Rate], agent: list[Rate]
) -> dict[str, Any]:
    """One agent's figures against the broker's of the same rounds."""
    ratios = [a.records_per_s / b.records_per_s for a, b in zip(agent, broker, strict=True)]
    cpu_ratios = [a.cpu_s_per_m / b.cpu_s_per_m for a, b in zip(agent, broker, strict=True)]
    return {
        "kind": kind,
        "size": size,
        "agent": name,
        "broker_records_per_s": statistics.median(r.records_per_s for r in broker),
        "agent_records_per_s": statistics.median(r.records_per_s for r in agent),
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 2) for r in ratios],
        "broker_cpu_s_per_m": statistics.median(r.cpu_s_per_m for r in broker),
        "agent_cpu_s_per_m": statistics.median(r.cpu_s_per_m for r in agent),
        "cpu_ratio": statistics.median(cpu_ratios),
    }


if __name__ == "__main__":
    main()
