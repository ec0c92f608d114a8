"""Two replicas of the chart's operator (kopf peering) on the real API server: the webhook
never stops.

As the chart runs them: both replicas serve the admission webhook, kopf's peering (the
chart's ClusterKopfPeering object) lets one of them run the handlers. The leader is killed with
SIGKILL (no goodbye: its peering record only expires) while a loop keeps sending real pod
AdmissionReviews to both. The survivor must answer every one of them throughout, and take
over the handlers within the peering lifetime.

Which replica runs handlers is read from each replica's own /metrics
(``durable_operator_handler_runs_total``): the volume-pool timer runs every half second on the
leader only. The measured take-over time is printed (run with -s to see it).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for
from support.webhook_harness import (
    admission_review,
    durable_producer,
    opted_in_pod,
)

pytestmark = pytest.mark.integration

LIFETIME_SECONDS = 6  # kube_harness installs the chart with operator.peeringLifetimeSeconds 6
# The peering lifetime bounds the take-over; the rest is for a loaded test machine.
TAKEOVER_LIMIT_SECONDS = LIFETIME_SECONDS + 10
PEERINGS_PATH = "/apis/kopf.dev/v1/clusterkopfpeerings"


@dataclass
class Replica:
    name: str
    operator: ChartOperator
    metrics_url: str
    readyz_url: str

    def handler_runs(self, handler: str) -> float:
        """durable_operator_handler_runs_total for one handler, all results (0 unreachable)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return 0.0
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "durable_operator_handler_runs_total"
            and sample.labels.get("handler") == handler
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.readyz_url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


@pytest.fixture()
def start_replica(
    start_chart_operator: Callable[..., ChartOperator],
) -> Callable[[str], Replica]:
    def start(name: str) -> Replica:
        operator = start_chart_operator(replica=name)
        return Replica(name, operator, operator.metrics_url, operator.readyz_url)

    return start


@dataclass
class ReviewLoop:
    """Sends real CREATE reviews of opted-in pods to each replica in turn, in a thread."""

    replicas: list[Replica]
    answers: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            for replica in self.replicas:
                pod = opted_in_pod(f"orders-{uuid.uuid4().hex[:10]}")
                pod["metadata"]["namespace"] = replica.operator.namespace
                outcome = self._send(replica.operator, pod)
                self.answers.setdefault(replica.name, []).append((time.monotonic(), outcome))
            time.sleep(0.05)

    @staticmethod
    def _send(operator: ChartOperator, pod: dict[str, object]) -> str:
        try:
            status, answer = operator.post(json.dumps(admission_review(pod)).encode())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            return f"unreachable: {error}"
        if status != 200:
            return f"HTTP {status}: {answer}"
        response = answer["response"]
        if response.get("allowed") is not True:
            return f"refused: {response.get('status')}"
        return "allowed" if "patch" in response else "allowed without a patch"

    def outcomes(self, name: str, after: float = 0.0) -> list[str]:
        return [outcome for moment, outcome in self.answers.get(name, []) if moment >= after]


@pytest.fixture()
def review_loop() -> Iterator[Callable[[list[Replica]], ReviewLoop]]:
    started: list[tuple[ReviewLoop, threading.Thread]] = []

    def start(replicas: list[Replica]) -> ReviewLoop:
        loop = ReviewLoop(replicas)
        thread = threading.Thread(target=loop.run, name="review-loop", daemon=True)
        thread.start()
        started.append((loop, thread))
        return loop

    yield start
    for loop, thread in started:
        loop.stop.set()
        thread.join(timeout=30)


def leader_of(replicas: list[Replica], seconds: float = 3.0) -> Replica:
    """The one replica whose pool timer runs (it runs every 0.5 s on the leader only)."""
    before = {replica.name: replica.handler_runs("volume-pool") for replica in replicas}
    time.sleep(seconds)
    running = [r for r in replicas if r.handler_runs("volume-pool") > before[r.name]]
    assert len(running) == 1, f"expected one replica running handlers, got {running}"
    return running[0]


def test_killing_the_leader_refuses_no_pod_and_the_other_replica_takes_over(
    kube_api: KubeApi,
    start_replica: Callable[[str], Replica],
    review_loop: Callable[[list[Replica]], ReviewLoop],
) -> None:
    kube_api.create(durable_producer("orders"))
    first = start_replica("replica-a")
    second = start_replica("replica-b")  # started later: lower priority, a standby
    replicas = [first, second]

    leader = leader_of(replicas)
    standby = second if leader is first else first
    loop = review_loop(replicas)
    wait_for(lambda: len(loop.outcomes(standby.name)) >= 5, timeout=30,
             what="reviews answered by the standby")
    assert leader is first, "the replica that started first leads"
    assert standby.handler_runs("volume-pool") == 0
    assert standby.handler_runs("reconcile") == 0

    killed_at = time.monotonic()
    leader.operator.process.process.kill()  # SIGKILL: no peering goodbye
    wait_for(lambda: standby.handler_runs("volume-pool") > 0,
             timeout=TAKEOVER_LIMIT_SECONDS, interval=0.1,
             what="the standby running the volume-pool timer")
    takeover = time.monotonic() - killed_at
    kube_api.create(durable_producer("payments"))  # a handler only the leader runs
    wait_for(lambda: (kube_api.get("payments") or {}).get("status", {}).get("bufferSize"),
             timeout=60, what="the new leader reconciling a new DurableProducer")
    wait_for(lambda: len(loop.outcomes(standby.name, after=killed_at)) >= 10, timeout=60,
             what="ten reviews answered by the survivor after the kill")
    time.sleep(1.0)
    loop.stop.set()

    survivor = loop.outcomes(standby.name)
    after_kill = loop.outcomes(standby.name, after=killed_at)
    dead = loop.outcomes(leader.name, after=killed_at + 0.5)
    print(f"\nleader take-over after SIGKILL: {takeover:.1f} s (peering lifetime"
          f" {LIFETIME_SECONDS} s); reviews answered by the survivor: {len(survivor)}"
          f" ({len(after_kill)} after the kill); sent to the killed replica after the kill:"
          f" {len(dead)}, all unreachable")
    assert [o for o in survivor if not o.startswith("allowed")] == []
    assert all(o == "allowed" for o in survivor)  # each one got its agent and volume
    assert dead and all(o.startswith("unreachable") for o in dead)
    assert takeover < TAKEOVER_LIMIT_SECONDS
    assert standby.ready()


def test_a_cleanly_stopped_leader_hands_over_at_once(
    kube_api: KubeApi,
    start_replica: Callable[[str], Replica],
) -> None:
    """SIGTERM (a rollout, a drain): the leader removes its peering record as it stops."""
    kube_api.create(durable_producer("orders"))
    first, second = start_replica("replica-a"), start_replica("replica-b")
    assert leader_of([first, second]) is first

    stopped_at = time.monotonic()
    first.operator.process.stop()
    stopped = time.monotonic() - stopped_at
    # kopf's shutdown removed the record before the process exited (the peering object's
    # status holds one entry per live replica, by its POD_ID); without that goodbye it
    # would stay until it expired, a keep-alive (1 s) plus the lifetime (6 s) later.
    statuses = [item.get("status") or {} for item in kube_api.items(PEERINGS_PATH).values()]
    ours = [status for status in statuses if "replica-b" in status]
    assert ours and all("replica-a" not in status for status in ours), statuses
    wait_for(lambda: second.handler_runs("volume-pool") > 0, timeout=LIFETIME_SECONDS,
             interval=0.1, what="the standby taking over after a clean stop")
    handover = time.monotonic() - stopped_at
    print(f"\nhand-over after SIGTERM: {handover:.1f} s (the leader's shutdown {stopped:.1f} s)")
