"""D5: admission time is bounded by the webhook deadline, and a pool run by its scrapes' budget.

The operator's own code, in this process, against the real API server (kube-apiserver, etcd,
the scheduler, kwok and a volume provisioner): what is shown here is in-process state (the
per-DurableProducer lock, the review's arrival time, the timer's scrapes), which an operator
process does not expose. benchmarks/admission_bench.py measures the same through the real
operator process and the API server's webhook call.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import jsonpatch
import kopf
import pytest

from durable_producer.operator.act import admission, pool_actions
from durable_producer.operator.act import cluster as cluster_module
from durable_producer.operator.act.api_access import POOL_USER_AGENT
from durable_producer.operator.act.locks import producer_lock
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.settings import OperatorConfig, WebhookSettings
from integration.operator.test_operator_on_api_server import durable_producer
from support.kube_cluster import Cluster
from support.kube_harness import KubeApi
from support.operator_clients import operator_clients_on
from support.waiting import wait_for
from support.webhook_harness import opted_in_pod

pytestmark = pytest.mark.integration

LOGGER = logging.getLogger("test-admission-deadline")
WEBHOOK_TIMEOUT_SECONDS = 4.0  # the API budget is 2 s less: 2 s
CONFIG = OperatorConfig(webhook=WebhookSettings(timeout_seconds=WEBHOOK_TIMEOUT_SECONDS))
BUDGET = CONFIG.webhook.api_budget_seconds
SLACK_SECONDS = 1.0  # for a loaded two-core machine


@pytest.fixture()
def in_process_operator(control_plane: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's API clients in this process, on the test cluster's admin kubeconfig."""
    operator_clients_on(control_plane, monkeypatch)
    # As admission.prepare at the operator's startup: the client's lazy imports take
    # seconds, not to be spent in a review's budget.
    cluster_module.prepare_clients(POOL_USER_AGENT)


def admit(kube_api: KubeApi, name: str, *, received: float | None = None,
          config: OperatorConfig = CONFIG) -> admission.AdmissionAnswer:
    pod = opted_in_pod(name)
    pod["metadata"]["namespace"] = kube_api.namespace
    arrival = {} if received is None else {"received": received}
    return admission.handle_admission(pod, operation="CREATE", dryrun=False, config=config,
                                      logger=LOGGER, **arrival)


def test_a_review_waits_for_a_busy_producer_only_the_time_left_then_is_refused(
    kube_api: KubeApi, in_process_operator: None
) -> None:
    """Before, the lock was taken without a timeout: the review hung for as long as another
    thread (the pool timer across slow API calls) held it, far past the API server's timeout."""
    kube_api.create(durable_producer("orders"))
    lock = producer_lock(kube_api.namespace, "orders")
    held_for = 4 * BUDGET
    taken = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            time.sleep(held_for)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(5)
    started = time.monotonic()
    try:
        with pytest.raises(kopf.AdmissionError) as refused:
            admit(kube_api, "app-1")
        elapsed = time.monotonic() - started
    finally:
        holder.join()

    assert elapsed < BUDGET + SLACK_SECONDS, f"refused after {elapsed:.1f}s"
    assert refused.value.code == 503, str(refused.value)
    message = str(refused.value)
    assert "\n" not in message
    assert f"DurableProducer {kube_api.namespace}/orders was busy" in message
    assert "no volume was claimed" in message and "retries" in message
    assert kube_api.items(kube_api.pvcs_path) == {}
    # Once free, the next review claims as usual.
    assert pod_mutation.claimed_volume(
        jsonpatch.apply_patch(opted_in_pod("app-2"), admit(kube_api, "app-2").ops)) is not None


def claim_writes(kube_api: KubeApi) -> int:
    """PVC creates and patches in the namespace so far (the API server's audit log)."""
    return len([r for r in kube_api.requests() if r.resource == "persistentvolumeclaims"
                and r.verb in ("create", "patch", "update")])


def test_the_deadline_counts_from_the_reviews_arrival_and_nothing_is_claimed_after_it(
    kube_api: KubeApi, in_process_operator: None
) -> None:
    """A review that waited for a thread for the whole budget (kopf's pool busy with timers)
    makes no API call: no claim, no PVC the API server's caller has long given up on."""
    kube_api.create(durable_producer("orders"))
    before = claim_writes(kube_api)

    with pytest.raises(kopf.AdmissionError) as refused:
        admit(kube_api, "late", received=time.monotonic() - BUDGET - 0.1)

    assert refused.value.code == 504
    assert "did not answer within" in str(refused.value)
    assert kube_api.items(kube_api.pvcs_path) == {}
    assert claim_writes(kube_api) == before
    # Half the budget spent in the queue: the rest is enough, and the pod gets its volume.
    answer = admit(kube_api, "in-time", received=time.monotonic() - BUDGET / 2)
    assert pod_mutation.claimed_volume(jsonpatch.apply_patch(opted_in_pod("in-time"),
                                                             answer.ops)) is not None


@pytest.fixture()
def silent_metrics_port() -> Iterator[int]:
    """A port on every local address (the kwok pods' IPs are loopback addresses) that takes
    connections and never answers: agents behind a default-deny NetworkPolicy, as a scrape
    sees them (each one times out)."""
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(1024)  # never accepted: the kernel completes the handshakes, no answer
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def running_agents(kube_api: KubeApi, count: int) -> list[str]:
    """``count`` pods admitted by the webhook's code (claims included), created and Running."""
    names = []
    for index in range(count):
        name = f"app-{index}"
        pod = opted_in_pod(name)
        pod["metadata"]["namespace"] = kube_api.namespace
        answer = admission.handle_admission(pod, operation="CREATE", dryrun=False,
                                            config=CONFIG, logger=LOGGER)
        status, created = kube_api.create_pod(jsonpatch.apply_patch(pod, answer.ops))
        assert status == 201, created
        names.append(name)

    def all_running() -> bool:
        pods = kube_api.opted_in_pods()
        return all((pods.get(n, {}).get("status") or {}).get("phase") == "Running"
                   and pods[n]["status"].get("podIP") for n in names)

    wait_for(all_running, timeout=120, what=f"{count} agents Running")
    return names


def test_a_pool_run_whose_agents_never_answer_takes_the_scrape_budget_not_one_second_each(
    kube_api: KubeApi, in_process_operator: None, silent_metrics_port: int
) -> None:
    """Before, the timer asked the agents one after the other, 1 s each: 20 silent agents
    held it (and a thread of the pool the webhook shared) for 20 s per run."""
    agents = 20
    kube_api.create(durable_producer("orders", agent={"ports": {
        "metrics": silent_metrics_port}}))
    running_agents(kube_api, agents)

    started = time.monotonic()
    update = pool_actions.handle_pool_timer(kube_api.get("orders") or {}, CONFIG, LOGGER)
    elapsed = time.monotonic() - started

    assert elapsed < agents / 2, f"the pool run took {elapsed:.1f}s"
    assert update.changes.get("attachedPods") == agents
