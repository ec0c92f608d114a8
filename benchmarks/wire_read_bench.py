"""What reading a request other than Produce, or a broker's answer, costs: this checkout
against another's ``src``, side by side in one run.

Requests (``parse_request``) and answers (``decode_body``, which the forwarder's Kafka client
reads every answer but Produce's through) are built with every field set and two elements in
every array. Produce answers, with 1, 10 and 100 partitions, are read as the side's sender
reads them, into its ``PartitionAnswer``s (``produce_answer_reader``). Each side is
measured in a child process of its own, the sides alternating round by round (these
machines are shared and noisy); each round is the best of 5 x 5,000 calls; the table gives
each side's median over the rounds, in microseconds, and after / before.

    .venv/bin/python benchmarks/wire_read_bench.py --baseline-src /tmp/base/src [--rounds 5]

Produce requests take their own path (``parse_produce``) and are not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = [(3, 12, "Metadata v12"), (3, 1, "Metadata v1"), (18, 3, "ApiVersions v3"),
            (22, 4, "InitProducerId v4"), (1, 10, "Fetch v10")]  # fmt: skip
ANSWERS = [(18, 0, "ApiVersions v0"), (3, 12, "Metadata v12"), (22, 4, "InitProducerId v4"),
           (61, 0, "DescribeProducers v0")]  # fmt: skip
PRODUCE_ANSWERS = [(9, 1), (9, 10), (9, 100), (11, 1), (11, 10), (11, 100)]


def measure() -> dict[str, float]:
    """One side's timings (runs in the child, with that side's ``src`` first on the path)."""
    import dataclasses
    import datetime
    import io
    import timeit

    from kio.schema.errors import ErrorCode
    from kio.serial import entity_writer
    from kio.serial._introspect import classify_field

    from durable_producer.buffer_agent.kafka.protocol import (
        build,
        decode_body,
        parse_request,
        request_schema,
        response_schema,
    )
    from support.kafka_wire import encode_request_body, full_sample

    def best(call: object) -> float:
        return min(timeit.repeat(call, number=5_000, repeat=5)) / 5_000 * 1e6  # type: ignore[arg-type]

    def encoded(schema: type, entity: object) -> bytes:
        buffer = io.BytesIO()
        entity_writer(schema)(buffer, entity)
        return buffer.getvalue()

    def nested(schema: type, name: str) -> type:
        field = next(f for f in dataclasses.fields(schema) if f.name == name)
        kind: type = classify_field(field).type_
        return kind

    read_produce_answer = produce_answer_reader()
    timings = {}
    for api, version, name in REQUESTS:
        frame = encode_request_body(api, version, 1, full_sample(request_schema(api, version)))
        timings[f"request {name} ({len(frame)} B)"] = best(lambda f=frame: parse_request(f))
    for api, version, name in ANSWERS:
        schema = response_schema(api, version)
        data = encoded(schema, full_sample(schema))
        timings[f"answer {name} ({len(data)} B)"] = best(
            lambda a=api, v=version, d=data: decode_body(a, v, d)
        )
    for version, partitions in PRODUCE_ANSWERS:
        schema = response_schema(0, version)
        topic = nested(schema, "responses")
        partition = nested(topic, "partition_responses")
        fields = {"error_code": ErrorCode.none, "base_offset": 5, "log_append_time": None,
                  "log_start_offset": 0, "record_errors": (), "error_message": None}  # fmt: skip
        answers = tuple(build(partition, index=index, **fields) for index in range(partitions))
        answer = build(
            schema,
            responses=(build(topic, name="events", partition_responses=answers),),
            throttle_time=datetime.timedelta(0),
        )
        data = encoded(schema, answer)
        timings[f"answer Produce v{version}, {partitions} partitions"] = best(
            lambda v=version, d=data, p=partitions: read_produce_answer(v, d, p)
        )
    return timings


def produce_answer_reader() -> Callable[[int, bytes, int], object]:
    """How the side's forwarder reads a Produce answer to a request of so many partitions
    into what it uses: by hand (``read_answer``, since 2026-12-06's fourth session) or through
    kio (``decode_body``, then ``_answers``)."""
    from durable_producer.buffer_agent.kafka import produce_wire
    from durable_producer.buffer_agent.kafka.protocol import decode_body

    if hasattr(produce_wire, "read_answer"):
        read: Callable[[int, bytes, int], object] = produce_wire.read_answer
        return read
    by_kio = produce_wire._answers  # type: ignore[attr-defined]
    return lambda version, data, _: by_kio(decode_body(0, version, data))


def side(src: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT / 'tests'}")
    child = subprocess.run(
        [sys.executable, __file__, "--measure"], env=env, capture_output=True, text=True
    )
    if child.returncode:
        raise SystemExit(f"measuring {src} failed:\n{child.stderr[-3000:]}")
    timings: dict[str, float] = json.loads(child.stdout)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, required=False)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    sides = {"after": ROOT / "src"}
    if args.baseline_src is not None:
        if not (args.baseline_src / "durable_producer").is_dir():
            raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
        sides["before"] = args.baseline_src
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for number in range(args.rounds):
        for name, src in sides.items():
            rounds[name].append(side(src))
        print(f"round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rounds.items()
    }
    after = medians["after"]
    before = medians.get("before")
    print(f"{'us a call, median of ' + str(args.rounds) + ' rounds':44s} after   before  ratio")
    for key, value in after.items():
        if before is None:
            print(f"{key:44s} {value:6.2f}")
        else:
            print(f"{key:44s} {value:6.2f}  {before[key]:6.2f}  {value / before[key]:5.2f}x")


if __name__ == "__main__":
    main()
