"""The real operator (the chart's `kopf run`, its ServiceAccount's token) against the real API
server: CRD schema and CEL, generation, status, finalizer, events, RBAC, restart."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_producer.contract import GROUP
from durable_producer.operator import crd, startup
from durable_producer.operator.decide import reconcile
from durable_producer.operator.decide.sizing import SizingInputs, size_buffer
from durable_producer.operator.model.conditions import MAX_CONDITION_MESSAGE
from durable_producer.operator.model.model import API_VERSION, KIND, DurableProducerSpec
from support.crd_validation import ApiServerValidation
from support.kube_harness import ChartOperator, KubeApi
from support.waiting import wait_for, wait_until_still

pytestmark = pytest.mark.integration

MIB_PER_SECOND = 2**20
HANDLED_ANNOTATION = f"{GROUP}/last-handled-configuration"


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


def operator_user(kube_api: KubeApi) -> str:
    return f"system:serviceaccount:{kube_api.namespace}:"


def assert_operator_never_refused(kube_api: KubeApi) -> None:
    """RBAC is enforced: the chart's rules covered every request the operator made."""
    mine = [r for r in kube_api.requests() if r.user.startswith(operator_user(kube_api))]
    assert mine, "the audit log shows no request of the operator's ServiceAccount"
    refused = sorted({(r.verb, r.group, r.resource, r.subresource or "") for r in mine
                      if r.code == 403})
    assert refused == [], f"RBAC refused the operator: {refused}"


def operator_writes(kube_api: KubeApi, name: str) -> int:
    return sum(1 for r in kube_api.requests()
               if r.user.startswith(operator_user(kube_api)) and r.resource == "durableproducers"
               and r.name == name and r.verb in ("patch", "update"))


# The API server's own schema and CEL rules, and what tests/support/crd_validation.py predicts.
REFUSED_SPECS = [
    pytest.param({"agent": {"ports": {"kafka": 9092, "metrics": 9092}}},
                 "kafka and metrics ports must differ", id="equal-ports"),
    # NEW-1: the API server refused the CRD with this rule (its estimated cost).
    pytest.param({"storage": {"size": "5Mi"}}, "spec.storage.size 5Mi is too small",
                 id="tiny-volume"),
    pytest.param({"kafka": {"bootstrapServers": []}}, "spec.kafka.bootstrapServers",
                 id="no-brokers"),
    # fieldValidation=Strict (kubectl's default): 400 BadRequest, not 422.
    pytest.param({"colour": "blue"}, 'unknown field "spec.colour"', id="unknown-field"),
]


@pytest.mark.parametrize(("spec", "message"), REFUSED_SPECS)
def test_invalid_specs_are_refused_by_the_api_server_with_the_message_users_see(
    kube_api: KubeApi, spec: dict[str, Any], message: str
) -> None:
    manifest = durable_producer("refused", **spec)

    status, answer = kube_api.call(
        "POST", kube_api.collection_path + "?fieldValidation=Strict", manifest)

    assert (status, answer["reason"]) in ((422, "Invalid"), (400, "BadRequest")), answer
    assert message in answer["message"], answer["message"]
    predicted = ApiServerValidation(crd.resource_schema(),
                                    crd.strict_schema(crd.resource_schema())).errors(manifest)
    assert predicted, f"crd_validation.py predicts no refusal; the API server said:" \
                      f" {answer['message']}"
    assert kube_api.get("refused") is None


def test_a_name_longer_than_a_label_value_is_refused(kube_api: KubeApi) -> None:
    """D10: a 64-character name was accepted, and every pod naming it in its label refused."""
    longest, too_long = "p" * 63, "p" * 64

    status, answer = kube_api.try_create(durable_producer(too_long))

    assert status == 422, answer
    assert "metadata.name must be at most 63 characters" in answer["message"]
    assert ApiServerValidation(crd.resource_schema(), crd.strict_schema(
        crd.resource_schema())).errors(durable_producer(too_long))
    kube_api.create(durable_producer(longest))


def test_a_capped_condition_message_is_what_the_api_server_takes(kube_api: KubeApi) -> None:
    """D7: a message over the CRD's limit made the API server refuse the whole status write.
    The operator caps messages at MAX_CONDITION_MESSAGE: the API server takes that many
    characters (multi-byte ones too: it counts characters) and refuses one more."""
    kube_api.create(durable_producer("orders"))
    status_path = f"{kube_api.collection_path}/orders/status"
    long = "é" * 40_000

    def write(message: str) -> tuple[int, Any]:
        condition = reconcile.set_condition([], "Degraded", "True", "VolumePoolProblem",
                                            message, 1, datetime.now(UTC))
        return kube_api.call("PATCH", status_path, {"status": {"conditions": condition}})

    written, answer = write(long)
    assert written == 200, answer
    (stored,) = answer["status"]["conditions"]
    assert len(stored["message"]) == MAX_CONDITION_MESSAGE
    refused, answer = kube_api.call("PATCH", status_path, {"status": {"conditions": [
        {**stored, "message": stored["message"] + "x"}]}})
    assert refused == 422, answer


def test_create_converges_to_ready_with_computed_size_and_real_generation(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    start_chart_operator()
    created = kube_api.create(durable_producer("orders"))
    assert created["metadata"]["generation"] == 1  # set by the API server

    # observedGeneration is written last (after the conditions, by server-side apply): once
    # it names the generation, the whole status is that generation's.
    obj = wait_for(lambda: (found := kube_api.get("orders"))
                   and found.get("status", {}).get("observedGeneration") == 1 and found,
                   timeout=60, what="observedGeneration 1")
    ready = condition(obj, reconcile.READY)
    assert ready is not None
    expected = size_buffer(SizingInputs.from_spec(DurableProducerSpec.model_validate(obj["spec"])))
    assert ready["status"] == "True"
    assert ready["reason"] == reconcile.REASON_RECONCILED
    assert obj["status"]["observedGeneration"] == 1
    assert obj["status"]["bufferSize"] == expected.size_quantity == "5Gi"
    assert obj["status"]["runwaySeconds"] == expected.runway_seconds >= 3600
    # Degraded is the pool timer's (one writer per condition type): its first run writes it.
    degraded = wait_for(lambda: condition(kube_api.get("orders"), reconcile.DEGRADED),
                        timeout=60, what="Degraded from the pool timer")
    assert (degraded["status"], degraded["observedGeneration"]) == ("False", 1)
    # kopf adds its finalizer in a patch of its own, not with the status.
    wait_for(lambda: startup.FINALIZER in ((kube_api.get("orders") or {}).get("metadata", {})
                                           .get("finalizers") or []),
             timeout=60, what="the finalizer")
    assert "kopf" not in obj["status"], "kopf's progress must live in annotations"
    assert_operator_never_refused(kube_api)


def test_a_spec_change_bumps_the_generation_and_is_reconciled(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    start_chart_operator()
    kube_api.create(durable_producer("clicks"))
    first_ready = wait_for(
        lambda: (obj := kube_api.get("clicks")) and obj.get("status", {}).get(
            "sparkTemplatesConfigMap") and condition(obj, reconcile.READY),
        timeout=60, what="the create handlers to finish")
    status_patches = operator_writes(kube_api, "clicks")

    patched = kube_api.patch_spec("clicks",
                                  {"throughput": {"peakBytesPerSecond": 10 * MIB_PER_SECOND}})
    assert patched["metadata"]["generation"] == 2
    # A status or metadata write does not change the generation (the status subresource).
    assert status_patches >= 1

    obj = wait_for(lambda: (found := kube_api.get("clicks"))
                   and found.get("status", {}).get("observedGeneration") == 2 and found,
                   timeout=60, what="observedGeneration 2")
    assert obj["metadata"]["generation"] == 2
    assert obj["status"]["bufferSize"] == "46Gi"
    ready = condition(obj, reconcile.READY)
    assert ready is not None and ready["status"] == "True"
    assert ready["observedGeneration"] == 2
    assert ready["lastTransitionTime"] == first_ready["lastTransitionTime"]
    assert_operator_never_refused(kube_api)


def test_a_spec_the_crd_lets_through_gets_an_explanatory_condition_without_retry_storm(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    # 220Mi passes the CRD's CEL lower bound, not the agent's own space budget (model.py).
    start_chart_operator()
    kube_api.create(durable_producer("payments", storage={"size": "220Mi"}))

    ready = wait_for(lambda: condition(kube_api.get("payments"), reconcile.READY),
                     timeout=60, what="Ready condition")
    assert (ready["status"], ready["reason"]) == ("False", reconcile.REASON_INVALID_SPEC)
    assert "spec.storage.size 220Mi cannot hold the agent's WAL" in ready["message"]
    event = wait_for(lambda: next((e for e in kube_api.events()
                                   if e.get("reason") == reconcile.REASON_INVALID_SPEC), None),
                     what="a Warning event")
    assert event["type"] == "Warning"
    assert event["message"] == ready["message"]
    assert event["involvedObject"]["name"] == "payments"

    wait_for(lambda: ((kube_api.get("payments") or {}).get("status") or {}).get("volumes"),
             timeout=60, what="the volume-pool timer's first status")
    settled = wait_until_still(lambda: operator_writes(kube_api, "payments"), 3.0, timeout=40,
                               interval=0.5, what="the operator's writes to payments")
    time.sleep(3)
    assert operator_writes(kube_api, "payments") == settled

    kube_api.patch_spec("payments", {"storage": {"size": "2Gi"}})
    fixed = wait_for(lambda: (found := condition(kube_api.get("payments"), reconcile.READY))
                     and found["status"] == "True" and found,
                     timeout=60, what="Ready=True after the fix")
    assert fixed["reason"] == reconcile.REASON_RECONCILED
    assert fixed["observedGeneration"] == 2
    assert_operator_never_refused(kube_api)


def test_delete_runs_the_finalizer_and_the_object_goes_away(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    operator = start_chart_operator()
    kube_api.create(durable_producer("audit"))
    wait_for(lambda: startup.FINALIZER in ((kube_api.get("audit") or {}).get("metadata", {})
                                          .get("finalizers") or []),
             timeout=60, what="our finalizer")

    kube_api.delete("audit")

    wait_for(lambda: kube_api.get("audit") is None, timeout=60, what="the object to go")
    wait_for(lambda: f"DurableProducer {kube_api.namespace}/audit released"
             in operator.process.log(), what="the delete handler's log line")
    assert_operator_never_refused(kube_api)


def test_a_restarted_operator_resumes_existing_objects_without_rewriting_them(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator]
) -> None:
    kube_api.create(durable_producer("while-down"))  # no operator running yet
    first = start_chart_operator()
    ready = wait_for(lambda: condition(kube_api.get("while-down"), reconcile.READY),
                     timeout=60, what="Ready")
    assert ready["status"] == "True"
    wait_for(lambda: HANDLED_ANNOTATION in (kube_api.get("while-down") or {})["metadata"].get(
        "annotations", {}), timeout=60, what="kopf to record the handled spec")
    wait_for(lambda: ((kube_api.get("while-down") or {}).get("status") or {}).get("volumes"),
             timeout=60, what="the pool timer's first status")
    first.process.stop()
    before = kube_api.get("while-down")
    assert before is not None

    second = start_chart_operator()
    wait_for(lambda: "Handler 'reconcile_durable_producer' succeeded" in second.process.log(),
             timeout=60, what="the resume handler to run")
    time.sleep(2)
    after = kube_api.get("while-down")
    assert after is not None
    assert condition(after, reconcile.READY) == ready
    assert after["status"]["observedGeneration"] == before["status"]["observedGeneration"]
    assert_operator_never_refused(kube_api)


def test_the_liveness_endpoint_answers(
    start_chart_operator: Callable[..., ChartOperator]
) -> None:
    operator = start_chart_operator()
    with urllib.request.urlopen(operator.process.liveness_url, timeout=5) as response:
        assert response.status == 200
