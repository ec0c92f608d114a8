"""The real operator process (`kopf run`) against the Kubernetes emulator."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from durable_producer.contract import GROUP
from durable_producer.operator import api_access, reconcile, startup
from durable_producer.operator.model import API_VERSION, KIND, DurableProducerSpec
from durable_producer.operator.sizing import SizingInputs, size_buffer
from integration.operator.operator_harness import (
    KubernetesApi,
    OperatorProcess,
)
from support.waiting import wait_for

pytestmark = pytest.mark.integration

MIB_PER_SECOND = 2**20


def durable_producer(name: str, **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
        "throughput": {"peakBytesPerSecond": MIB_PER_SECOND},
        "outageSeconds": 3600,
    }
    spec.update(spec_overrides)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def condition(obj: dict[str, Any] | None, condition_type: str) -> dict[str, Any] | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == condition_type), None)


def assert_requests_within_declared_access(kubernetes_api: KubernetesApi) -> None:
    """Everything the operator asked of the API is listed in KUBERNETES_API_ACCESS (for RBAC)."""
    declared = {
        (group, resource, verb)
        for group, resource, verbs in api_access.KUBERNETES_API_ACCESS
        for verb in verbs
    }
    used = {
        (
            request.group,
            request.plural + (f"/{request.subresource}" if request.subresource else ""),
            request.verb,
        )
        for request in kubernetes_api.requests()
        if request.user_agent.startswith("kopf") and request.plural is not None
    }
    assert used, "the operator made no resource requests at all"
    assert used <= declared, f"undeclared API access: {sorted(used - declared)}"


def operator_writes_to(kubernetes_api: KubernetesApi, name: str) -> int:
    return sum(
        1
        for request in kubernetes_api.requests()
        if request.user_agent.startswith("kopf")
        and request.name == name
        and request.method == "PATCH"
    )


def wait_for_writes_to_settle(kubernetes_api: KubernetesApi, name: str) -> int:
    """The operator's write count on the object once it has not changed for a second."""
    previous = -1
    for _ in range(15):
        current = operator_writes_to(kubernetes_api, name)
        if current == previous:
            return current
        previous = current
        time.sleep(1)
    raise AssertionError(f"the operator keeps writing to {name}: {current} writes so far")


def test_create_converges_to_ready_with_computed_size(
    kubernetes_api: KubernetesApi, operator_process: OperatorProcess
) -> None:
    kubernetes_api.create(durable_producer("orders"))

    ready = wait_for(
        lambda: condition(kubernetes_api.get("orders"), reconcile.READY), what="Ready condition"
    )
    obj = kubernetes_api.get("orders")
    assert obj is not None
    expected = size_buffer(SizingInputs.from_spec(DurableProducerSpec.model_validate(obj["spec"])))
    assert ready["status"] == "True"
    assert ready["reason"] == reconcile.REASON_RECONCILED
    assert obj["status"]["observedGeneration"] == 1
    assert obj["status"]["bufferSize"] == expected.size_quantity == "5Gi"
    assert obj["status"]["runwaySeconds"] == expected.runway_seconds >= 3600
    assert condition(obj, reconcile.DEGRADED)["status"] == "False"  # type: ignore[index]
    assert startup.FINALIZER in obj["metadata"]["finalizers"]
    assert "kopf" not in obj["status"], "kopf's progress must live in annotations"
    assert_requests_within_declared_access(kubernetes_api)


def test_update_of_throughput_recomputes_size_and_generation(
    kubernetes_api: KubernetesApi, operator_process: OperatorProcess
) -> None:
    kubernetes_api.create(durable_producer("clicks"))
    # kopf may run the create handlers twice here (the emulator's events lag kopf's own
    # patches), a few milliseconds apart: take Ready once the whole create cycle is done
    # (the Spark templates handler runs last), not between the two reconciles.
    wait_for(
        lambda: ((kubernetes_api.get("clicks") or {}).get("status") or {}).get(
            "sparkTemplatesConfigMap"
        ),
        what="the create handlers to finish",
    )
    first_ready = condition(kubernetes_api.get("clicks"), reconcile.READY)
    assert first_ready is not None

    kubernetes_api.patch_spec("clicks", {"throughput": {"peakBytesPerSecond": 10 * MIB_PER_SECOND}})

    obj = wait_for(
        lambda: (
            found
            if (found := kubernetes_api.get("clicks"))
            and found.get("status", {}).get("observedGeneration") == 2
            else None
        ),
        what="observedGeneration 2",
    )
    assert obj["status"]["bufferSize"] == "46Gi"
    assert obj["status"]["runwaySeconds"] >= 3600
    ready = condition(obj, reconcile.READY)
    assert ready is not None and ready["status"] == "True"
    assert ready["observedGeneration"] == 2
    # Still Ready: the transition time stays that of the first reconcile.
    assert ready["lastTransitionTime"] == first_ready["lastTransitionTime"]
    assert_requests_within_declared_access(kubernetes_api)


def test_invalid_spec_gives_explanatory_condition_without_retry_storm(
    kubernetes_api: KubernetesApi, operator_process: OperatorProcess
) -> None:
    # Passes the structural schema; only the CRD's CEL rule (which the emulator does not run,
    # nor does an API server whose CRD predates the rule) and the model catch it.
    bad = durable_producer("payments", agent={"ports": {"kafka": 9092, "metrics": 9092}})
    kubernetes_api.create(bad)

    ready = wait_for(
        lambda: condition(kubernetes_api.get("payments"), reconcile.READY), what="Ready condition"
    )
    assert ready["status"] == "False"
    assert ready["reason"] == reconcile.REASON_INVALID_SPEC
    assert "spec.agent.ports" in ready["message"]
    assert "kafka and metrics ports must differ" in ready["message"]
    event = wait_for(
        lambda: next(
            (
                r.data
                for r in kubernetes_api.requests()
                if r.plural == "events" and r.method == "POST"
            ),
            None,
        ),
        what="a Warning event",
    )
    assert event["type"] == "Warning"
    assert event["reason"] == reconcile.REASON_INVALID_SPEC
    assert event["message"] == ready["message"]
    assert event["involvedObject"]["name"] == "payments"

    # The handler finished (no retry scheduled in kopf's progress annotations) and then the
    # operator leaves the object alone: no retry loop, no patch storm. The volume-pool timer's
    # first run writes status.volumes once, whenever the loaded machine lets it finish.
    wait_for(
        lambda: ((kubernetes_api.get("payments") or {}).get("status") or {}).get("volumes"),
        what="the volume-pool timer's first status",
    )
    settled = wait_for_writes_to_settle(kubernetes_api, "payments")
    annotations = (kubernetes_api.get("payments") or {})["metadata"].get("annotations", {})
    assert not [key for key in annotations if "reconcile_durable_producer" in key], annotations
    time.sleep(3)
    assert operator_writes_to(kubernetes_api, "payments") == settled

    kubernetes_api.patch_spec("payments", {"agent": {"ports": {"metrics": 9644}}})
    fixed = wait_for(
        lambda: (
            found
            if (found := condition(kubernetes_api.get("payments"), reconcile.READY))
            and found["status"] == "True"
            else None
        ),
        what="Ready=True after the fix",
    )
    assert fixed["reason"] == reconcile.REASON_RECONCILED
    assert fixed["observedGeneration"] == 2
    assert_requests_within_declared_access(kubernetes_api)


def test_delete_runs_finalizer_and_object_goes_away(
    kubernetes_api: KubernetesApi, operator_process: OperatorProcess
) -> None:
    kubernetes_api.create(durable_producer("audit"))
    wait_for(
        lambda: (
            startup.FINALIZER
            in ((kubernetes_api.get("audit") or {}).get("metadata", {}).get("finalizers") or [])
        ),
        what="our finalizer",
    )

    kubernetes_api.delete("audit")

    wait_for(lambda: kubernetes_api.get("audit") is None, what="the object to be deleted")
    wait_for(
        lambda: "DurableProducer default/audit released" in operator_process.log(),
        what="the delete handler's log line",
    )
    assert_requests_within_declared_access(kubernetes_api)


def test_liveness_endpoint_answers(operator_process: OperatorProcess) -> None:
    with urllib.request.urlopen(operator_process.liveness_url, timeout=5) as response:
        assert response.status == 200


def test_restarted_operator_resumes_existing_objects_without_rewriting_them(
    kubernetes_api: KubernetesApi, start_operator: Callable[[], OperatorProcess]
) -> None:
    kubernetes_api.create(durable_producer("while-down"))  # no operator running yet

    first = start_operator()
    ready = wait_for(
        lambda: condition(kubernetes_api.get("while-down"), reconcile.READY), what="Ready"
    )
    assert ready["status"] == "True"
    # kopf records the handled spec once every creation handler is done; stopped before
    # that, the next operator would finish the creation instead of resuming.
    wait_for(
        lambda: HANDLED_ANNOTATION in (kubernetes_api.get("while-down") or {})["metadata"].get(
            "annotations", {}
        ),
        timeout=60,
        what="kopf to record the handled spec",
    )
    first.stop()
    status_writes_before = status_writes(kubernetes_api, "while-down")
    assert status_writes_before >= 1

    second = start_operator()
    try:
        wait_for(
            lambda: "Handler 'reconcile_durable_producer' succeeded" in second.log(),
            timeout=60,
            what="the resume handler to run",
        )
    except AssertionError as error:
        raise AssertionError(
            f"{error}; the second operator logged:\n{second.log()[-4000:]}"
        ) from None
    time.sleep(1)
    assert status_writes(kubernetes_api, "while-down") == status_writes_before
    obj = kubernetes_api.get("while-down")
    assert condition(obj, reconcile.READY) == ready
    assert_requests_within_declared_access(kubernetes_api)


HANDLED_ANNOTATION = f"{GROUP}/last-handled-configuration"


def status_writes(kubernetes_api: KubernetesApi, name: str) -> int:
    return sum(
        1
        for request in kubernetes_api.requests()
        if request.name == name and request.method == "PATCH" and request.subresource == "status"
    )
