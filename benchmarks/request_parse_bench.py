"""What parsing a request other than Produce costs the agent: ``parse_request`` on requests
with every field set and two elements in every array, best of 7 x 20,000, microseconds.

    .venv/bin/python benchmarks/request_parse_bench.py
    PYTHONPATH=/tmp/base/src .venv/bin/python benchmarks/request_parse_bench.py  # another src

Produce requests take their own path (``parse_produce``) and are not measured here.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from durable_producer.buffer_agent.kafka.protocol import parse_request, request_schema
from support.kafka_wire import encode_request_body, full_sample

REQUESTS = [(3, 12, "Metadata v12"), (3, 1, "Metadata v1"), (18, 3, "ApiVersions v3"),
            (22, 4, "InitProducerId v4"), (1, 10, "Fetch v10")]  # fmt: skip


def main() -> None:
    import durable_producer

    print(f"src: {Path(durable_producer.__file__).parent}")
    for api, version, name in REQUESTS:
        schema = request_schema(api, version)
        frame = encode_request_body(api, version, 1, full_sample(schema))
        best = min(timeit.repeat(lambda f=frame: parse_request(f), number=20_000, repeat=7))
        print(f"{name:18s} {len(frame):4d} B  {best / 20_000 * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
