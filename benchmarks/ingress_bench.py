"""Ingest through the buffer agent vs producing straight to the local broker (tansu).

Not a test: prints figures side by side, as ratios, from one run on one machine.

    .venv/bin/python benchmarks/ingress_bench.py [--records 200000] [--processes 4]

Both endpoints get the same confluent-kafka settings (acks=all, idempotence, linger,
batch size, compression) from several producer processes, since one Python producer loop
caps near 200k records/s (DESIGN.md 4). The agent runs as its own process with a WAL on a
temporary directory, fsync policy ``interval``. Latency is delivery-report time minus
produce() time, sampled on every 16th record, in a second run paced well below both
endpoints' capacity (in a saturating run latency only measures the client's own queue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TOPIC = "bench"
PARTITIONS = 8
LATENCY_SAMPLE_EVERY = 16
REPO = Path(__file__).resolve().parents[1]


def producer_config(bootstrap: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    }


def produce_worker(
    bootstrap: str,
    records: int,
    size: int,
    start_at: float,
    rate: float | None,
    results: multiprocessing.Queue,
) -> None:
    """Produce ``records`` as fast as possible, or paced at ``rate`` records/s."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap))
    producer.list_topics(TOPIC, timeout=10)
    value = os.urandom(size)
    latencies: list[float] = []
    errors = 0

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
                if index % LATENCY_SAMPLE_EVERY == 0:
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
    elapsed = time.perf_counter() - began
    results.put({"elapsed": elapsed, "latencies": latencies, "errors": errors + left})


@dataclass
class Result:
    """Throughput from a saturating run; latency from a run paced below both capacities."""

    records_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def run_load(
    bootstrap: str, records: int, size: int, processes: int, rate: float | None = None
) -> Result:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 3.0
    share = records // processes
    workers = [
        context.Process(
            target=produce_worker,
            args=(bootstrap, share, size, start_at, rate, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(30)
    wall = max(report["elapsed"] for report in reports)
    latencies = sorted(latency for report in reports for latency in report["latencies"])
    total = share * processes
    return Result(
        records_per_s=total / wall,
        mb_per_s=total * size / wall / 1e6,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[int(len(latencies) * 0.99)] * 1000,
        errors=sum(report["errors"] for report in reports),
    )


# ---------------------------------------------------------------------- the agent process
def serve_agent(data_dir: Path, port_file: Path) -> None:
    from durable_producer.buffer_agent.ingress import IngressConfig, IngressServer
    from durable_producer.buffer_agent.metadata_cache import MetadataCache
    from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WriteAheadLog

    def partitions(topics: Sequence[str]) -> Mapping[str, int]:
        return {topic: PARTITIONS for topic in topics}

    async def main() -> None:
        wal = WriteAheadLog.open(
            data_dir / "wal",
            WalConfig(fsync=FsyncPolicy.INTERVAL, max_bytes=8 << 30, segment_bytes=256 << 20),
        )
        server = IngressServer(
            wal,
            MetadataCache(data_dir / "state", partitions),
            data_dir / "state",
            IngressConfig(port=0),
        )
        await server.start()
        port_file.write_text(str(server.port))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop()
        wal.close()

    asyncio.run(main())


def start_agent(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = data_dir / "port"
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-agent", str(data_dir), str(port_file)]
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise RuntimeError("agent did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2048])
    parser.add_argument(
        "--paced-bytes-per-s",
        type=float,
        default=8e6,
        help="offered load of the latency run (below both endpoints' capacity)",
    )
    parser.add_argument("--paced-seconds", type=float, default=4.0)
    parser.add_argument("--serve-agent", nargs=2, metavar=("DATA_DIR", "PORT_FILE"))
    args = parser.parse_args()
    if args.serve_agent:
        serve_agent(Path(args.serve_agent[0]), Path(args.serve_agent[1]))
        return

    sys.path.insert(0, str(REPO / "tests"))
    from support.broker import TansuBroker, create_topic

    table = []
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        agent, agent_bootstrap = start_agent(Path(scratch))
        try:
            for size in args.sizes:
                records = args.records if size <= 512 else args.records // 4
                paced_rate = args.paced_bytes_per_s / size / args.processes
                paced_records = int(paced_rate * args.processes * args.paced_seconds)
                row = []
                for bootstrap in (broker.bootstrap, agent_bootstrap):
                    paced = run_load(bootstrap, paced_records, size, args.processes, paced_rate)
                    saturated = run_load(bootstrap, records, size, args.processes)
                    saturated.p50_ms, saturated.p99_ms = paced.p50_ms, paced.p99_ms
                    saturated.errors += paced.errors
                    row.append(saturated)
                table.append((size, records, row[0], row[1]))
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)

    print(
        f"\n{args.processes} producer processes, same confluent-kafka settings; "
        f"agent fsync=interval; latency at {args.paced_bytes_per_s / 1e6:.0f} MB/s offered\n"
    )
    header = (
        f"{'size':>6} {'records':>8} {'endpoint':>8} {'rec/s':>10} {'MB/s':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
    )
    print(header)
    for size, records, direct, through in table:
        for name, result in (("broker", direct), ("agent", through)):
            print(
                f"{size:>6} {records:>8} {name:>8} {result.records_per_s:>10.0f} "
                f"{result.mb_per_s:>8.1f} {result.p50_ms:>8.2f} {result.p99_ms:>8.2f} "
                f"{result.errors:>6}"
            )
        print(
            f"{size:>6} {'':>8} {'ratio':>8} "
            f"{through.records_per_s / direct.records_per_s:>10.2f} "
            f"{through.mb_per_s / direct.mb_per_s:>8.2f} "
            f"{through.p50_ms / direct.p50_ms:>8.2f} {through.p99_ms / direct.p99_ms:>8.2f}"
        )
    print(
        json.dumps(
            [
                {"size": size, "records": records, "broker": vars(direct), "agent": vars(through)}
                for size, records, direct, through in table
            ]
        )
    )


if __name__ == "__main__":
    main()
