"""What a Kafka outage costs the buffer agent: CPU while it waits, CPU per record it takes in.

Not a test: prints figures side by side from one run. The promise is to keep accepting writes
while Kafka is down at as little CPU as possible; the agent's forwarder then has frames it
cannot send, and how it waits decides what the outage costs (until 2026-11-28 it asked for
the cluster's metadata on every pass of its loop: a whole core for the whole outage).

Two kinds of outage. **down**: each round starts a fresh ``durable-agent run`` process (empty
volume, fsync ``never``, ``--default-partitions 4`` so it takes a topic it has never seen)
whose Kafka bootstrap is a closed local port (connections refused, the quickest failure: the
worst case for a loop that retries at once). A confluent-kafka producer (acks=all,
idempotent, linger.ms=5) sends ``--records`` records of 200 B to it (the agent acknowledges
them from its WAL), ``--bursts`` times; the agent process's CPU per record taken in is
measured over each burst. Then the agent's CPU share while it only waits, over ``--idle``
seconds. **hung**: the agent forwards to librdkafka's mock cluster (3 brokers), which is then
made to answer every request 8 s late (``broker_set_rtt``): batches stay in flight; bursts of
``--hung-records`` (within the forwarder's 32 MiB read-ahead, so it still reads new frames),
then the CPU share while it waits for the answers. With ``--baseline-src DIR`` a
second agent runs another checkout's ``src`` the same way, alternating which goes first.

    .venv/bin/python benchmarks/outage_cost_bench.py [--rounds 3] [--records 50000]
        [--kinds down,hung] [--baseline-src /tmp/base/src]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from durable_producer.local.agent_process import AgentProcess  # noqa: E402
from durable_producer.local.mock_cluster import MockCluster  # noqa: E402

CLOSED_PORT = "127.0.0.1:1"
VALUE = b"v" * 200
HUNG_RTT_MS = 8_000


class AgentOf(AgentProcess):
    """``durable-agent run`` from a checkout's ``src`` (``PYTHONPATH`` first)."""

    def __init__(self, source: Path, data_dir: Path, kafka_bootstrap: str) -> None:
        self.source = source
        extra = ["--default-partitions", "4", "--fsync", "never", "--log-level", "error"]
        super().__init__(data_dir, kafka_bootstrap, extra_args=extra)

    def environment(self) -> dict[str, str]:
        return dict(super().environment(), PYTHONPATH=str(self.source))


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_agent(
    source: Path, kind: str, records: int, bursts: int, idle_s: float
) -> tuple[float, float]:
    """(median agent CPU-us per record taken in, agent CPU share while waiting)."""
    if kind == "down":
        return agent_run(source, CLOSED_PORT, None, records, bursts, idle_s)
    mock = MockCluster(3).start()
    try:
        mock.topic_create("outage", 4)
        return agent_run(source, mock.bootstrap, mock, records, bursts, idle_s)
    finally:
        mock.stop()


def agent_run(
    source: Path,
    bootstrap: str,
    mock: MockCluster | None,
    records: int,
    bursts: int,
    idle_s: float,
) -> tuple[float, float]:
    with (
        tempfile.TemporaryDirectory() as data,
        AgentOf(source, Path(data) / "volume", bootstrap) as agent,  # started, killed at the end
    ):
        assert agent.process is not None
        pid = agent.process.pid
        producer = Producer(
            {
                "bootstrap.servers": agent.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "log_level": 0,
            }
        )
        producer.produce("outage", VALUE, partition=0)  # warm-up: metadata, producer id
        if producer.flush(30):
            raise SystemExit("the agent did not acknowledge the warm-up record")
        if mock is not None:
            time.sleep(2.0)  # the warm-up record forwarded: the agent knows the leaders
            for broker in mock.broker_ids:
                mock.broker_set_rtt(broker, HUNG_RTT_MS)
        per_record = []
        for _ in range(bursts):
            before = process_cpu_s(pid)
            for index in range(records):
                producer.produce("outage", VALUE, partition=index % 4)
                if index % 1000 == 0:
                    producer.poll(0)
            if producer.flush(60):
                raise SystemExit("the agent did not acknowledge every record")
            per_record.append((process_cpu_s(pid) - before) * 1e6 / records)
        time.sleep(1.0)  # the last burst read
        before = process_cpu_s(pid)
        time.sleep(idle_s)
        share = (process_cpu_s(pid) - before) / idle_s
        return statistics.median(per_record), share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=50_000, help="records a burst")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--hung-records", type=int, default=20_000, help="records a burst, hung")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of waiting measured")
    parser.add_argument("--kinds", default="down,hung", help="down, hung or both")
    parser.add_argument("--baseline-src", type=Path)
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if not kinds or set(kinds) - {"down", "hung"}:
        raise SystemExit(f"--kinds {args.kinds}: down, hung or both")
    if args.baseline_src is not None and not (args.baseline_src / "durable_producer").is_dir():
        raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
    sides = {"this checkout": ROOT / "src"}
    if args.baseline_src is not None:
        sides["baseline"] = args.baseline_src
    for kind in kinds:
        measure(kind, sides, args)


def measure(kind: str, sides: dict[str, Path], args: argparse.Namespace) -> None:
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        order = list(sides.items())
        if round_index % 2:
            order.reverse()
        for name, source in order:
            records = args.records if kind == "down" else args.hung_records
            cpu, share = one_agent(source, kind, records, args.bursts, args.idle)
            figures[name].append((cpu, share))
            print(
                f"{kind} round {round_index + 1} {name}: {cpu:.2f} CPU-us a record taken in,"
                f" {share:.1%} of a core while waiting",
                flush=True,
            )
    what = (
        f"Kafka unreachable ({CLOSED_PORT})"
        if kind == "down"
        else f"Kafka hung (mock cluster answering {HUNG_RTT_MS / 1000:g} s late)"
    )
    print(f"\n{what}; medians of {args.rounds} rounds:")
    medians = {
        name: (statistics.median(c for c, _ in runs), statistics.median(s for _, s in runs))
        for name, runs in figures.items()
    }
    for name, (cpu, share) in medians.items():
        print(f"  {name:14} {cpu:6.2f} CPU-us a record taken in  {share:6.1%} of a core waiting")
    if "baseline" in medians:
        (cpu, share), (base_cpu, base_share) = medians["this checkout"], medians["baseline"]
        print(
            f"  this/baseline  {cpu / max(base_cpu, 1e-9):.2f}x CPU a record,"
            f" {share / max(base_share, 1e-9):.3f}x CPU waiting\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
