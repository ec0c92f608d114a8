"""Outdated agents (injection_hash.py, agent_versions.py): what the webhook wrote vs now."""

from __future__ import annotations

import copy
from typing import Any

from durable_producer import contract
from durable_producer.operator.decide import agent_container, agent_versions, pod_mutation
from durable_producer.operator.decide.injection_hash import sidecar_hash
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec

OLD = AgentImage(image="registry.example/agent:1.0")
NEW = AgentImage(image="registry.example/agent:1.1")
RAW_SPEC: dict[str, Any] = {
    "kafka": {"bootstrapServers": ["kafka:9092"]},
    "throughput": {"peakBytesPerSecond": 2**20},
}


def spec(**changes: Any) -> DurableProducerSpec:
    return DurableProducerSpec.model_validate({**RAW_SPEC, **changes})


def admitted(name: str, image: AgentImage = OLD, annotations: dict[str, str] | None = None,
             phase: str = "Running", the_spec: DurableProducerSpec | None = None) -> dict[str, Any]:
    pod = {"metadata": {"name": name, "labels": {contract.PRODUCER_LABEL: "orders"},
                        "annotations": dict(annotations or {})},
           "spec": {"containers": [{"name": "app", "image": "app:1"}]}}
    log_level = (annotations or {}).get(contract.LOG_LEVEL_ANNOTATION)
    result = pod_mutation.mutated_pod(pod, "orders", the_spec or spec(), f"{name}-vol", image,
                                      log_level)
    result["status"] = {"phase": phase}
    return result


def test_the_hash_is_stable_and_sees_every_field() -> None:
    container = agent_container.agent_sidecar(spec(), OLD)
    changed = copy.deepcopy(container)
    changed["resources"]["limits"]["memory"] = "1Gi"

    assert sidecar_hash(container) == sidecar_hash(copy.deepcopy(container))
    assert len(sidecar_hash(container)) == 16
    assert sidecar_hash(changed) != sidecar_hash(container)


def test_the_webhook_writes_the_hash_of_what_it_injected() -> None:
    pod = admitted("p")

    assert pod["metadata"]["annotations"][contract.AGENT_HASH_ANNOTATION] == sidecar_hash(
        pod["spec"]["initContainers"][0])
    assert agent_versions.expected_hash(pod, spec(), OLD) == (
        pod["metadata"]["annotations"][contract.AGENT_HASH_ANNOTATION])


def test_a_new_agent_image_makes_every_running_agent_outdated() -> None:
    pods = [admitted("a"), admitted("b"), admitted("done", phase="Succeeded")]

    assert agent_versions.outdated_pods(pods, spec(), OLD) == []
    assert agent_versions.outdated_pods(pods, spec(), NEW) == ["a", "b"]


def test_a_spec_change_the_agent_sees_makes_it_outdated_others_do_not() -> None:
    pods = [admitted("a")]

    assert agent_versions.outdated_pods(pods, spec(fsync={"policy": "always"}), OLD) == ["a"]
    assert agent_versions.outdated_pods(pods, spec(outageSeconds=7200), OLD) == ["a"]  # size
    assert agent_versions.outdated_pods(pods, spec(spark={"driverTemplate": True}), OLD) == []


def test_a_pods_own_overrides_are_not_outdated() -> None:
    annotations = {contract.CPU_REQUEST_ANNOTATION: "1", contract.LOG_LEVEL_ANNOTATION: "DEBUG"}
    tuned = admitted("tuned", annotations=annotations,
                     the_spec=spec(agent={"resources": {"requests": {"cpu": "1",
                                                                     "memory": "128Mi"}}}))

    assert agent_versions.outdated_pods([tuned], spec(), OLD) == []


def test_pods_without_a_hash_or_an_agent() -> None:
    legacy = admitted("legacy")
    del legacy["metadata"]["annotations"][contract.AGENT_HASH_ANNOTATION]
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "app"}]},
            "status": {"phase": "Running"}}

    assert agent_versions.outdated_pods([legacy, bare], spec(), OLD) == ["legacy"]


def test_the_status_patch_only_when_the_count_changes() -> None:
    producer = {"spec": RAW_SPEC, "status": {"outdatedAgents": 0}}
    pods = [admitted("a")]

    assert agent_versions.outdated_status(producer, pods, OLD) == {}
    assert agent_versions.outdated_status(producer, pods, NEW) == {"outdatedAgents": 1}
    assert agent_versions.outdated_status({"spec": {"kafka": {}}}, pods, NEW) == {}
