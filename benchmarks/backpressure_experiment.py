"""Which answers to a full buffer keep an idempotent producer alive for minutes?

    .venv/bin/python benchmarks/backpressure_experiment.py --variant not_enough_replicas \\
        [--client confluent|kafka-python] [--refuse-seconds 150] [--message-timeout-ms 30000]

One run: a Kafka broker (one KRaft node) behind a fault proxy, cut off; an agent with a 3 MiB
WAL; one idempotent producer (client defaults otherwise) writing ``--rate`` records/s (1,000) of
``--value-bytes`` (200) to ``--partitions`` partitions (1). The
WAL fills within seconds and the agent refuses every produce request for
``--refuse-seconds`` with the variant's answer; then the broker comes back, the producer
writes for 4 more seconds and flushes. Prints one JSON line: whether the producer went fatal
(and when), its delivery results by error, whether it still delivered afterwards, and
whether every record it was told was delivered is in Kafka.

Variants (the agent's answer while its WAL is full; a small patch applied in the agent
process, so the product's code is what runs otherwise):

- ``not_enough_replicas``: NOT_ENOUGH_REPLICAS at once
- ``kafka_storage_error``, ``request_timed_out``, ``not_leader``: those codes at once
- ``throttled``: NOT_ENOUGH_REPLICAS with ``throttle_time_ms`` 1000 in the response
- ``delayed``: ``--full-disk-policy block --block-timeout 10``: held up to 10 s (within the
  client's request.timeout.ms), then NOT_ENOUGH_REPLICAS
- ``product``: whatever the agent does by default (no patch)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import ProxiedBroker, consume_all, create_topic

TOPIC = "backpressure"

PATCH = """
import os, sys
from kio.schema.errors import ErrorCode
import durable_producer.buffer_agent.ingest.produce as produce
code = os.environ.get("EXPERIMENT_FULL_ERROR")
if code:
    produce.WAL_FULL_ERROR = ErrorCode[code]
throttle = int(os.environ.get("EXPERIMENT_THROTTLE_MS", "0"))
if throttle:
    original = produce.encode_produce_response
    def throttled(correlation_id, version, topics):
        data = original(correlation_id, version, topics)
        if any(p.error_code == int(produce.WAL_FULL_ERROR) for _, ps in topics for p in ps):
            tail = 5 if version >= 9 else 4
            end = len(data) - tail
            data = data[:end] + throttle.to_bytes(4, "big") + data[end + 4 :]
        return data
    produce.encode_produce_response = throttled
from durable_producer.buffer_agent.cli import main
sys.exit(main(sys.argv[1:]))
"""

VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "product": ({}, []),
    "not_enough_replicas": ({"EXPERIMENT_FULL_ERROR": "not_enough_replicas"}, []),
    "kafka_storage_error": ({"EXPERIMENT_FULL_ERROR": "kafka_storage_error"}, []),
    "request_timed_out": ({"EXPERIMENT_FULL_ERROR": "request_timed_out"}, []),
    "not_leader": ({"EXPERIMENT_FULL_ERROR": "not_leader_or_follower"}, []),
    "throttled": (
        {"EXPERIMENT_FULL_ERROR": "not_enough_replicas", "EXPERIMENT_THROTTLE_MS": "1000"},
        [],
    ),
    "delayed": (
        {"EXPERIMENT_FULL_ERROR": "not_enough_replicas"},
        ["--full-disk-policy", "block", "--block-timeout", "10"],
    ),
}


class PatchedAgent(AgentProcess):
    def __init__(self, variant: str, agent_src: str | None, *args: Any, **kwargs: Any) -> None:
        self.variant_env, extra = VARIANTS[variant]
        if agent_src:  # another checkout's agent, e.g. the code before a change
            self.variant_env = {**self.variant_env, "PYTHONPATH": agent_src}
        kwargs["extra_args"] = [*kwargs.get("extra_args", []), *extra]
        super().__init__(*args, **kwargs)

    def command(self) -> list[str]:
        command = super().command()
        if not self.variant_env:
            return command
        module = command.index("-m")
        return [command[0], "-c", PATCH, *command[module + 2 :]]

    def environment(self) -> dict[str, str]:
        return {**super().environment(), **self.variant_env}


class Outcome:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.errors: Counter[str] = Counter()
        self.fatal: str | None = None
        self.fatal_at: float | None = None
        self.stats: dict[str, Any] = {}


@dataclass(frozen=True)
class Load:
    rate: int
    partitions: int
    value_min: int
    value_max: int

    def value(self, key: int) -> bytes:
        size = self.value_min + key * 7919 % (self.value_max - self.value_min + 1)
        return b"x" * size


def run_confluent(
    bootstrap: str, load: Load, refuse_s: float, timeout_ms: int, restore: Any, outcome: Outcome
) -> dict[str, Any]:
    from confluent_kafka import KafkaError, KafkaException, Producer

    started = time.monotonic()

    def on_error(error: KafkaError) -> None:
        if error.fatal() and outcome.fatal is None:
            outcome.fatal = f"{error.name()}: {error.str()}"
            outcome.fatal_at = time.monotonic() - started

    def delivered(error: KafkaError | None, message: Any) -> None:
        with outcome.lock:
            if error is None:
                outcome.acked.add(int(message.key()))
            else:
                outcome.errors[error.name()] += 1

    def on_stats(text: str) -> None:
        outcome.stats = json.loads(text)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": timeout_ms,
            "error_cb": on_error,
            "stats_cb": on_stats,
            "statistics.interval.ms": 1000,
            "log_level": 3,
        }
    )
    key = 0

    def produce_for(seconds: float) -> None:
        nonlocal key
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            for _ in range(load.rate // 10):
                try:
                    producer.produce(
                        TOPIC, load.value(key), str(key).encode(), on_delivery=delivered
                    )
                except (BufferError, KafkaException) as error:
                    outcome.errors[f"produce() {type(error).__name__}"] += 1
                key += 1
            while (left := 0.1 - (time.monotonic() - tick)) > 0:
                producer.poll(left)  # returns early after a callback: poll to the tick's end

    produce_for(refuse_s)
    producer.poll(1.5)  # one more statistics report
    brokers = outcome.stats.get("brokers", {}).values()
    requests = {
        "requests_sent": sum(broker.get("tx", 0) for broker in brokers),
        "produce_requests": sum(broker.get("req", {}).get("Produce", 0) for broker in brokers),
        "metadata_requests": sum(broker.get("req", {}).get("Metadata", 0) for broker in brokers),
        "request_retries": sum(broker.get("txretries", 0) for broker in brokers),
        "epoch_bumps": outcome.stats.get("eos", {}).get("epoch_cnt"),
    }
    restore()
    before = len(outcome.acked)
    produce_for(4)  # 4 more seconds once the broker is back
    remaining = producer.flush(60)
    return {
        "produced": key,
        "acked_after_restore": len(outcome.acked) - before,
        "unflushed": remaining,
        **requests,
    }


def run_kafka_python(
    bootstrap: str, load: Load, refuse_s: float, timeout_ms: int, restore: Any, outcome: Outcome
) -> dict[str, Any]:
    from kafka import KafkaProducer
    from kafka.net.compat import KafkaNetClient

    sent: Counter[int] = Counter()  # requests by API key, until the broker is back
    counting = [True]

    class CountingClient(KafkaNetClient):  # type: ignore[misc]
        def send(self, node_id: Any, request: Any, **kwargs: Any) -> Any:
            if counting[0]:
                sent[int(getattr(request, "API_KEY", -1))] += 1
            return super().send(node_id, request, **kwargs)

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=5,
        delivery_timeout_ms=timeout_ms,
        request_timeout_ms=min(30_000, timeout_ms - 5),
        api_version=(2, 8),
        kafka_client=CountingClient,
    )
    metadata_updates = [0]
    update_metadata = producer._metadata.update_metadata

    def counted_update(*args: Any, **kwargs: Any) -> Any:
        if counting[0]:
            metadata_updates[0] += 1
        return update_metadata(*args, **kwargs)

    producer._metadata.update_metadata = counted_update
    transactions = producer._transaction_manager
    started = time.monotonic()

    def check_fatal() -> None:
        if outcome.fatal is None and transactions is not None and transactions.has_fatal_error():
            outcome.fatal = repr(transactions.last_error)
            outcome.fatal_at = time.monotonic() - started

    key = 0

    def ok(index: int) -> Any:
        def callback(_: Any) -> None:
            with outcome.lock:
                outcome.acked.add(index)

        return callback

    def failed(error: BaseException) -> None:
        with outcome.lock:
            outcome.errors[type(error).__name__] += 1

    def produce_for(seconds: float) -> None:
        nonlocal key
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            for _ in range(load.rate // 10):
                try:
                    future = producer.send(TOPIC, key=str(key).encode(), value=load.value(key))
                    future.add_callback(ok(key)).add_errback(failed)
                except Exception as error:  # the client refusing in send() itself
                    outcome.errors[f"send() {type(error).__name__}"] += 1
                    if outcome.fatal is None and "Fatal" in type(error).__name__:
                        outcome.fatal = repr(error)
                key += 1
            check_fatal()
            time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

    produce_for(refuse_s)
    counting[0] = False
    requests = {
        "produce_requests": sent[0],
        "metadata_responses": metadata_updates[0],  # its refreshes bypass send()
    }
    restore()
    before = len(outcome.acked)
    produce_for(4)
    unflushed = False
    try:
        producer.flush(60)
    except Exception as error:  # still holding records a minute after Kafka came back
        outcome.errors[f"flush() {type(error).__name__}"] += 1
        unflushed = True
    check_fatal()
    # kafka-python 3.0.12: a batch that expires after a retry resets the producer id to -1
    # but not the state that would fetch a new one, and the sender waits for it forever.
    producer_id = None if transactions is None else transactions.producer_id_and_epoch.producer_id
    with contextlib.suppress(Exception):
        producer.close(1)
    return {
        "produced": key,
        "acked_after_restore": len(outcome.acked) - before,
        "unflushed": unflushed,
        "producer_id_at_end": producer_id,
        **requests,
    }


def agent_cpu_seconds(agent: AgentProcess) -> float:
    """User + system CPU seconds of the agent process so far (Linux /proc)."""
    assert agent.process is not None
    fields = Path(f"/proc/{agent.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_forwarded(agent: AgentProcess, timeout: float) -> int:
    """Wait until Kafka has acknowledged every record the agent took; return how many not."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = agent.metrics()
        left = int(
            metrics.get("durable_agent_ingest_records_total", 0)
            - metrics.get("durable_agent_forwarded_records_total", 0)
        )
        if left <= 0 or time.monotonic() > deadline:
            return max(left, 0)
        time.sleep(0.5)


def key_ranges(keys: list[int]) -> list[str]:
    """Sorted keys as "first-last" runs."""
    ranges: list[str] = []
    start = previous = None
    for key in keys:
        if previous is not None and key == previous + 1:
            previous = key
            continue
        if start is not None:
            ranges.append(f"{start}-{previous}")
        start = previous = key
    if start is not None:
        ranges.append(f"{start}-{previous}")
    return ranges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="product")
    parser.add_argument("--client", choices=("confluent", "kafka-python"), default="confluent")
    parser.add_argument("--refuse-seconds", type=float, default=150.0)
    parser.add_argument("--message-timeout-ms", type=int, default=30_000)
    parser.add_argument("--rate", type=int, default=1000, help="records per second")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--value-bytes", default="200-200", help="MIN-MAX record value size")
    parser.add_argument(
        "--volume-mib",
        type=int,
        help="put the agent on a tmpfs of this size with its default WAL settings (needs"
        " root) instead of a 3 MiB WAL on the temporary directory's disk",
    )
    parser.add_argument("--fsync", default="interval")
    parser.add_argument("--agent-src", help="PYTHONPATH for the agent (another checkout's src)")
    args = parser.parse_args()
    low, high = (int(text) for text in args.value_bytes.split("-"))
    load = Load(args.rate, args.partitions, low, high)
    outcome = Outcome()
    with tempfile.TemporaryDirectory() as work, ProxiedBroker() as broker:
        create_topic(broker.bootstrap, TOPIC, load.partitions)
        broker.proxy.cut()
        volume = Path(work) / "volume"
        settings = ["--fsync", args.fsync, "--default-partitions", str(load.partitions)]
        if args.volume_mib:
            volume.mkdir()
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={args.volume_mib}m", "tmpfs", str(volume)],
                check=True,
            )
        else:
            settings += [
                "--max-buffer-bytes",
                str(3 << 20),
                "--segment-bytes",
                str(1 << 20),
                "--checkpoint-interval",
                "1",
            ]
        agent = PatchedAgent(
            args.variant,
            args.agent_src,
            volume,
            broker.bootstrap,
            extra_args=settings,
            log_path=Path(work) / "agent.log",
        )
        with contextlib.ExitStack() as unmount, agent:
            if args.volume_mib:
                unmount.callback(subprocess.run, ["umount", "-l", str(volume)], check=False)
            run = run_confluent if args.client == "confluent" else run_kafka_python
            cpu_before = agent_cpu_seconds(agent)
            refusing_cpu: list[float] = []

            def restore() -> None:
                refusing_cpu.append(round(agent_cpu_seconds(agent) - cpu_before, 1))
                broker.proxy.restore()

            figures = run(
                agent.bootstrap,
                load,
                args.refuse_seconds,
                args.message_timeout_ms,
                restore,
                outcome,
            )
            figures["agent_cpu_s_until_restore"] = refusing_cpu[0]
            # What the agent acknowledged is in Kafka only once forwarded: stopping earlier
            # leaves it on the (temporary) volume and would count it as lost.
            figures["agent_unforwarded_at_stop"] = wait_forwarded(agent, timeout=180)
            agent.stop()
            agent_log = agent.log_path.read_text()
        keys = {
            int(record.key)
            for record in consume_all(broker.direct_address, TOPIC, timeout=60, idle=3)
        }
    missing = sorted(outcome.acked - keys)
    print(
        json.dumps(
            {
                "variant": args.variant,
                "client": args.client,
                "refuse_seconds": args.refuse_seconds,
                "message_timeout_ms": args.message_timeout_ms,
                "load": f"{load.rate}/s, {load.partitions} partitions, {args.value_bytes} B",
                "fatal": outcome.fatal,
                "fatal_after_s": None if outcome.fatal_at is None else round(outcome.fatal_at, 1),
                "delivered": len(outcome.acked),
                "errors": dict(outcome.errors),
                **figures,
                "acked_missing_in_kafka": len(missing),
                "missing_key_ranges": key_ranges(missing)[:5],
                "agent_exits": agent_log.count("Traceback"),
                "setup": f"agent on a {args.volume_mib} MiB tmpfs, defaults"
                if args.volume_mib
                else "3 MiB WAL",
                "agent_src": args.agent_src or "this checkout",
            }
        ),
        flush=True,
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
