"""Admission latency under a burst of pod creates: the real API server and the real operator.

Not a test: prints figures (review D5, issue 29). One local control plane (kube-apiserver,
etcd, controller-manager, scheduler, kwok: ``tests/support/kube_cluster.py``); for each side
a fresh namespace with the chart installed by helm and its operator started as the chart runs
it (``tests/integration/operator/kube_harness.py``, as the integration tests do), at the
operator's default pool interval (10 s). Then ``--pods`` opted-in pods are POSTed at once
(one client thread each) through the whole admission chain, webhook included, and each
create is timed from the client: latency p50, p99 and max of all creates, the refusals
grouped by reason, and the stray claims 15 s after the burst (volumes claimed for a pod that
does not exist: claimed after the API server gave up on the review).

Sides: this checkout's operator and, with ``--baseline-src DIR``, another checkout's (the
operator process gets ``PYTHONPATH=DIR``; the chart is this checkout's), e.g. main's::

    rm -rf /tmp/d5-base && mkdir -p /tmp/d5-base && git archive main src | tar -x -C /tmp/d5-base

Scenarios (``--scenarios``):

- ``plain``: one DurableProducer, the burst against it.
- ``hung-scrapes``: the review's: agents whose metrics port never answers (a default-deny
  NetworkPolicy drops the operator's scrapes). ``--hung-producers`` DurableProducers each
  get ``--hung-agents`` running pods first, their ``spec.agent.ports.metrics`` a port on
  which this process accepts connections and never answers (kwok's pod IPs are loopback
  addresses); every pool run of each then scrapes that many silent agents. The burst goes
  to the first of them.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/admission_bench.py \\
        [--pods 200] [--baseline-src /tmp/d5-base/src] [--scenarios plain,hung-scrapes]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from durable_producer.operator.decide import pod_mutation  # noqa: E402
from durable_producer.operator.decide.volume_pool import CLAIMED_AT_ANNOTATION  # noqa: E402
from durable_producer.operator.settings import DEFAULT_POOL_INTERVAL_SECONDS  # noqa: E402
from integration.operator.test_operator_on_api_server import durable_producer  # noqa: E402
from support.kube_cluster import Cluster, VolumeProvisioner, running_cluster  # noqa: E402
from support.kube_harness import ChartOperators, KubeApi  # noqa: E402
from support.waiting import wait_for  # noqa: E402
from support.webhook_harness import opted_in_pod  # noqa: E402

SCENARIOS = ("plain", "hung-scrapes")
THIS = "this checkout"
BASELINE = "baseline"
BURST_PRODUCER = "orders"
# The operator's own settings, not the tests' fast pool (kube_harness.TEST_OPERATOR_ENV).
OPERATOR_ENV = {"DURABLE_PRODUCER_POOL_INTERVAL_SECONDS": str(DEFAULT_POOL_INTERVAL_SECONDS)}
READY_TIMEOUT_SECONDS = 180
# After the burst, before stray claims are counted (well under the pool's claim grace).
STRAY_SETTLE_SECONDS = 15.0
# The API server answers a create within its own request timeout (60 s) at the latest.
CLIENT_TIMEOUT_SECONDS = 70.0


@dataclass
class Burst:
    """One side's burst: each create's latency and answer."""

    side: str
    scenario: str
    latencies: list[float] = field(default_factory=list)
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)
    created: int = 0
    wall_seconds: float = 0.0
    stray_claims: int = 0
    # The operator's own count of answers, and of those it gave within 9 s, from
    # its admission histogram (this checkout times from the review's arrival, the baseline
    # from when its handler started).
    answered: int = 0
    answered_in_budget: int = 0


@contextmanager
def silent_port() -> Iterator[int]:
    """A port on every local address that takes connections and never answers."""
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(4096)
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def _reason(answer: Any) -> str:
    message = str(answer.get("message") if isinstance(answer, dict) else answer)
    message = re.sub(r"t?-?bench-[0-9a-z-]+", "NS", message)
    return re.sub(r"\d+(\.\d+)?", "N", message)[:160]


def create_all(api: KubeApi, pods: list[dict[str, Any]], burst: Burst) -> None:
    def create(pod: dict[str, Any]) -> tuple[float, int, Any]:
        placed = {**pod, "metadata": {**pod["metadata"], "namespace": api.namespace}}
        started = time.monotonic()
        try:
            status, answer = api.client.request("POST", api.pods_path, placed,
                                                timeout=CLIENT_TIMEOUT_SECONDS)
        except OSError as error:  # no answer at all (a timeout): counted as a refusal
            status, answer = 0, f"no answer within {CLIENT_TIMEOUT_SECONDS:g}s ({error})"
        return time.monotonic() - started, status, answer

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(pods)) as pool:
        for seconds, status, answer in pool.map(create, pods):
            burst.latencies.append(seconds)
            if status == 201:
                burst.created += 1
            else:
                burst.refusals[f"HTTP {status or '-'}: {_reason(answer)}"] += 1
    burst.wall_seconds = time.monotonic() - began


def stray_claims(api: KubeApi) -> int:
    """Volumes claimed for a pod that does not exist: the webhook claimed after the API server
    had given up on it (the pool takes them back after the claim grace)."""
    used = {pod_mutation.claimed_volume(pod) for pod in api.opted_in_pods().values()}
    claimed = [name for name, pvc in api.items(api.pvcs_path).items()
               if CLAIMED_AT_ANNOTATION in (pvc["metadata"].get("annotations") or {})]
    return len([name for name in claimed if name not in used])


def operator_answers(metrics_url: str) -> tuple[int, int]:
    """(reviews answered, of them within 9 s) by the operator's admission histogram."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = in_budget = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "durable_operator_admission_duration_seconds_bucket":
                continue
            if sample.labels.get("le") == "+Inf":
                total += sample.value
            elif sample.labels.get("le") == "9.0":
                in_budget += sample.value
    return int(total), int(in_budget)


def wait_ready(api: KubeApi, names: list[str]) -> None:
    wait_for(lambda: all(((api.get(n) or {}).get("status") or {}).get("volumes") is not None
                         for n in names),
             timeout=READY_TIMEOUT_SECONDS, what="the pool timer's first status")


def start_silent_agents(api: KubeApi, producers: list[str], agents: int) -> None:
    """``agents`` running pods per producer (through the webhook), before the burst."""
    names = []
    for producer in producers:
        for index in range(agents):
            name = f"{producer}-agent-{index}"
            status, answer = api.create_pod(opted_in_pod(name, producer))
            if status != 201:
                raise RuntimeError(f"could not start agent {name}: {_reason(answer)}")
            names.append(name)

    def running() -> bool:
        pods = api.opted_in_pods()
        return all((pods.get(n, {}).get("status") or {}).get("phase") == "Running"
                   for n in names)

    wait_for(running, timeout=READY_TIMEOUT_SECONDS, what=f"{len(names)} silent agents Running")


def run_side(cluster: Cluster, work_dir: Path, side: str, pythonpath: str, scenario: str,
             args: argparse.Namespace, metrics_port: int) -> Burst:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    cluster.plane.create_namespace(namespace)
    api = KubeApi(cluster, namespace)
    burst = Burst(side, scenario)
    side_dir = work_dir / namespace
    side_dir.mkdir()
    with VolumeProvisioner(cluster.admin, namespace):
        operators = ChartOperators(cluster, namespace, side_dir)
        try:
            hung = scenario == "hung-scrapes"
            producers = [BURST_PRODUCER] + ([f"hung-{i}" for i in range(1, args.hung_producers)]
                                            if hung else [])
            for name in producers:
                manifest = durable_producer(name, outageSeconds=600)
                if hung:
                    manifest["spec"]["agent"] = {"ports": {"metrics": metrics_port}}
                api.create(manifest)
            operators.start(PYTHONPATH=pythonpath, **OPERATOR_ENV)
            wait_ready(api, producers)
            if hung:
                start_silent_agents(api, producers, args.hung_agents)
                time.sleep(DEFAULT_POOL_INTERVAL_SECONDS)  # the timers meet the silent agents
            pods = []
            for index in range(args.pods):
                pod = opted_in_pod(f"burst-{index}", BURST_PRODUCER)
                pods.append(pod)
            create_all(api, pods, burst)
            time.sleep(STRAY_SETTLE_SECONDS)  # reviews still queued in the operator end
            burst.stray_claims = stray_claims(api)
            burst.answered, burst.answered_in_budget = operator_answers(
                operators.started[0].metrics_url)
        finally:
            operators.stop_all()
    return burst


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def report(bursts: list[Burst], args: argparse.Namespace) -> None:
    print()
    print(f"pods per burst              {args.pods} (all at once)")
    if args.baseline_src is not None:
        print(f"baseline operator           {args.baseline_src}")
    print(f"hung-scrapes                {args.hung_producers} DurableProducers x"
          f" {args.hung_agents} silent agents")
    print()
    print(f"{'scenario':<14}{'side':<16}{'created':>8}{'refused':>8}{'p50 s':>8}{'p99 s':>8}"
          f"{'max s':>8}{'mean s':>8}{'wall s':>8}{'stray':>7}{'op<9s':>8}")
    for burst in bursts:
        values = burst.latencies
        print(f"{burst.scenario:<14}{burst.side:<16}{burst.created:>8}"
              f"{sum(burst.refusals.values()):>8}{percentile(values, 0.5):>8.2f}"
              f"{percentile(values, 0.99):>8.2f}{max(values):>8.2f}"
              f"{statistics.mean(values):>8.2f}{burst.wall_seconds:>8.1f}"
              f"{burst.stray_claims:>7}{burst.answered_in_budget:>4}/{burst.answered:<4}")
    for burst in bursts:
        for reason, count in burst.refusals.most_common(5):
            print(f"  {burst.scenario} / {burst.side}: {count} x {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="another checkout's src (its operator is measured first)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--hung-producers", type=int, default=4)
    parser.add_argument("--hung-agents", type=int, default=15)
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"--scenarios: unknown {unknown}; known: {', '.join(SCENARIOS)}")
    sides = [(THIS, str(ROOT / "src"))]
    if args.baseline_src is not None:
        args.baseline_src = args.baseline_src.resolve()
        if not (args.baseline_src / "durable_producer").is_dir():
            raise SystemExit(f"--baseline-src {args.baseline_src}: no durable_producer in it")
        sides.insert(0, (BASELINE, str(args.baseline_src)))
    bursts = []
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as scratch, \
            running_cluster(Path(scratch) / "kube") as cluster, silent_port() as port:
        for scenario in scenarios:
            for side, pythonpath in sides:
                print(f"{scenario}: {side} ...", flush=True)
                bursts.append(run_side(cluster, Path(scratch), side, pythonpath, scenario,
                                       args, port))
    report(bursts, args)


if __name__ == "__main__":
    main()
