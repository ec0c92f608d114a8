"""Drain Jobs run where the volume's pod could (review D9): recorded at claim, copied at drain."""

from __future__ import annotations

import json
from typing import Any

from durable_producer.operator.decide import drain_placement, manifests
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.model.installation import AgentImage, PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec

SPOT = {"key": "pool", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
ZONE = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                           "values": ["eu-west-1a"]}]}]}}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "orders-0"}, "spec": {"containers": [{"name": "app"}], **spec}}


def volume(placement: str | None) -> dict[str, Any]:
    annotations = {vp.PLACEMENT_ANNOTATION: placement} if placement is not None else {}
    return {"metadata": {"name": "v", "annotations": annotations}}


def test_a_pod_on_a_dedicated_pool_gives_its_drains_its_tolerations_selector_and_zone() -> None:
    recorded = drain_placement.recorded(pod(
        tolerations=[SPOT], nodeSelector={"pool": "spot"},
        affinity={"nodeAffinity": ZONE, "podAntiAffinity": {"x": 1}}))

    assert recorded is not None
    assert drain_placement.pod_fields(volume(recorded)) == {
        "tolerations": [SPOT], "nodeSelector": {"pool": "spot"},
        "affinity": {"nodeAffinity": ZONE},  # the app's pod (anti-)affinity is not copied
    }


def test_a_pod_without_constraints_records_nothing() -> None:
    assert drain_placement.recorded(pod()) is None
    assert drain_placement.recorded(pod(tolerations=[], nodeSelector={}, affinity={})) is None
    assert drain_placement.pod_fields(volume(None)) == {}


def test_a_damaged_annotation_is_ignored() -> None:
    for raw in ("{not json", "[1, 2]", json.dumps({"tolerations": "all", "hostNetwork": True})):
        assert drain_placement.pod_fields(volume(raw)) == {}


def test_the_drain_job_pod_gets_the_placement() -> None:
    spec = DurableProducerSpec.model_validate(
        {"kafka": {"bootstrapServers": ["kafka:9092"]},
         "throughput": {"peakBytesPerSecond": 2**20}})
    producer = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u"}}
    placement = drain_placement.pod_fields(
        volume(drain_placement.recorded(pod(tolerations=[SPOT], nodeSelector={"pool": "spot"}))))

    job = manifests.drain_job_manifest(producer, spec, "v", PoolPolicy(), AgentImage(),
                                       placement=placement)

    template = job["spec"]["template"]["spec"]
    assert template["tolerations"] == [SPOT] and template["nodeSelector"] == {"pool": "spot"}
    plain = manifests.drain_job_manifest(producer, spec, "v", PoolPolicy(), AgentImage())
    assert "tolerations" not in plain["spec"]["template"]["spec"]
