"""What TLS and SASL cost the forwarder: forward rate and CPU to one secured Apache Kafka node.

Not a test: prints figures. One broker (``tests/support/secured_broker``, with the JVM of
Kafka's start script: C2, G1, 1 GB; ``--broker-jvm test-bed`` for the tests' small one) serves
four listeners; each round forwards the same preloaded WAL (``--records`` records of 200 B,
500 a stored batch, 4 partitions; ``forward_bench.run_forwarder``, timed from the forwarder's
start to the end of ``drain()``) over each, and produces the same records with a plain
confluent-kafka ``produce()`` loop (``forward_bench.run_direct``: librdkafka's TLS, the
opponent) over the same listener, one side after the other in a new order every round, each
to its own topic:

- ``PLAINTEXT``: no TLS, no login (the anonymous super user);
- ``SASL_PLAINTEXT`` with SCRAM-SHA-512 (the login is per connection: once);
- ``SASL_SSL`` with SCRAM-SHA-512: TLS on every byte (Python's ``ssl`` under asyncio);
- ``SSL`` with a client certificate (mutual TLS).

Prints records/s and CPU-us a record of the forwarder's process per round, the medians, and
each side's ratio to PLAINTEXT from the same rounds (the machine is shared: compare within a
run). The broker's own TLS work is on the same two cores.

    .venv/bin/python benchmarks/secured_forward_bench.py --records 300000 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import gc
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_brokers import BROKER_JVMS  # noqa: E402
from forward_bench import (  # noqa: E402
    WARMUP_TOPIC,
    load_average,
    make_batches,
    run_direct,
    run_forwarder,
)

from durable_producer.local.topics import create_topic  # noqa: E402
from support.secured_broker import USERS, SecuredBroker  # noqa: E402

SIDES = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL")
MECHANISM = "SCRAM-SHA-512"
PARTITIONS = 4


def settings_for(broker: SecuredBroker, side: str) -> tuple[str, dict[str, str]]:
    """(bootstrap, security settings) of a side."""
    if side == "PLAINTEXT":
        return broker.bootstrap, {}
    security = {"security.protocol": side}
    if side.startswith("SASL"):
        security |= {
            "sasl.mechanism": MECHANISM,
            "sasl.username": "writer",
            "sasl.password": USERS["writer"],
        }
    if side.endswith("SSL"):
        security["ssl.ca.location"] = str(broker.ca_file)
    if side == "SSL":
        certificate, key = broker.client_files("writer")
        security |= {"ssl.certificate.location": str(certificate), "ssl.key.location": str(key)}
    return broker.bootstrap_for(side), security


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker-jvm", choices=tuple(BROKER_JVMS), default="kafka")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    print(f"{started:%Y-%m-%d %H:%M} UTC, load average {load_average()}", flush=True)
    batches = make_batches(args.records)
    gc.collect()
    gc.freeze()
    runs: dict[str, list[tuple[float, float]]] = {}
    print("starting a secured Kafka node ...", flush=True)
    broker_jvm = BROKER_JVMS[args.broker_jvm]
    with SecuredBroker(broker_jvm) as broker, tempfile.TemporaryDirectory() as scratch:
        create_topic(broker.bootstrap, WARMUP_TOPIC, 1)
        broker.allow("writer", WARMUP_TOPIC, ["WRITE", "DESCRIBE", "READ"])
        for round_index in range(args.rounds):
            order = SIDES[round_index % len(SIDES) :] + SIDES[: round_index % len(SIDES)]
            for side in order:
                bootstrap, security = settings_for(broker, side)
                for who in ("forwarder", "direct"):
                    topic = f"secured-{who}-{side.lower()}-{round_index}"
                    create_topic(broker.bootstrap, topic, PARTITIONS)
                    broker.allow("writer", topic, ["WRITE", "DESCRIBE", "READ"])
                    if who == "forwarder":
                        elapsed, cpu, _ = run_forwarder(
                            bootstrap,
                            topic,
                            batches,
                            Path(scratch) / topic,
                            preloaded=True,
                            security=security,
                        )
                    else:
                        elapsed, cpu = run_direct(bootstrap, topic, batches, security=security)
                    name = f"{who} {side}"
                    runs.setdefault(name, []).append((elapsed, cpu))
                    print(
                        f"  round {round_index + 1} {name:25s} {args.records / elapsed:10.0f}"
                        f" records/s  cpu {cpu * 1e6 / args.records:5.2f} us a record",
                        flush=True,
                    )
    def median_rate(name: str) -> float:
        return statistics.median(args.records / elapsed for elapsed, _ in runs[name])

    def median_cpu(name: str) -> float:
        return statistics.median(cpu for _, cpu in runs[name]) * 1e6 / args.records

    print(f"\nmedians of {args.rounds} rounds, {args.records} records of 200 B:")
    print(f"  {'side':25s} {'records/s':>10s} {'CPU-us/rec':>10s} {'rate vs plain':>13s}"
          f" {'vs direct':>9s}")  # fmt: skip
    for name in sorted(runs, key=lambda name: (name.split()[0], SIDES.index(name.split()[1]))):
        who, side = name.split()
        rate = median_rate(name)
        print(
            f"  {name:25s} {rate:10.0f} {median_cpu(name):10.2f}"
            f" {rate / median_rate(f'{who} PLAINTEXT'):12.2f}x"
            f" {rate / median_rate(f'direct {side}'):8.2f}x"
        )


if __name__ == "__main__":
    main()
