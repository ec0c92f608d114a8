"""Name clashes between an opted-in pod and what the webhook adds are found and named."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from durable_producer import contract
from durable_producer.operator.decide import pod_clashes, pod_mutation
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec

SPEC = DurableProducerSpec.model_validate({
    "kafka": {"bootstrapServers": ["kafka:9092"],
              "sasl": {"mechanism": "PLAIN", "secretName": "kafka-user"}},
    "throughput": {"peakBytesPerSecond": 2**20},
})  # fmt: skip
CLAIM = "orders-buffer-abc"


def app_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "app", "namespace": "shop",
                     "labels": {contract.PRODUCER_LABEL: "orders"}},
        "spec": {"containers": [{"name": "app", "image": "shop/app:1",
                                 "ports": [{"name": "http", "containerPort": 8080}],
                                 "env": [{"name": "LOG_LEVEL", "value": "info"}]}]},
    }  # fmt: skip


def mutated(pod: dict[str, Any]) -> dict[str, Any]:
    ops = pod_mutation.mutation_patch(pod, "orders", SPEC, CLAIM, AgentImage())
    return jsonpatch.apply_patch(pod, ops, in_place=False)


def test_a_plain_pod_and_the_mutated_pod_have_no_clash() -> None:
    """A re-invocation (our own objects already there) is not a clash."""
    pod = app_pod()
    once = mutated(pod)
    changed = copy.deepcopy(once)
    changed["spec"]["containers"].append({"name": "mesh-proxy", "image": "proxy:1"})

    assert pod_clashes.clashes(pod, SPEC) == []
    assert pod_clashes.clashes(once, SPEC) == []
    assert pod_clashes.clashes(changed, SPEC) == []


def with_volume(volume: dict[str, Any]) -> dict[str, Any]:
    pod = app_pod()
    pod["spec"]["volumes"] = [volume]
    return pod


def with_env(name: str, **value: Any) -> dict[str, Any]:
    pod = app_pod()
    pod["spec"]["containers"][0]["env"].append({"name": name, **value})
    return pod


def with_container(kind: str, container: dict[str, Any]) -> dict[str, Any]:
    pod = app_pod()
    pod["spec"].setdefault(kind, []).append(container)
    return pod


def with_port(**port: Any) -> dict[str, Any]:
    pod = app_pod()
    pod["spec"]["containers"][0]["ports"].append(port)
    return pod


CLASHES = [
    ("user emptyDir", with_volume({"name": "durable-buffer", "emptyDir": {}}),
     "volume 'durable-buffer' has the name of the buffer volume"),
    ("user PVC", with_volume({"name": "durable-buffer",
                              "persistentVolumeClaim": {"claimName": "my-data"}}),
     "volume 'durable-buffer' has the name of the buffer volume"),
    ("credentials volume", with_volume({"name": "durable-kafka-sasl",
                                        "secret": {"secretName": "mine"}}),
     "volume 'durable-kafka-sasl' has the name of the Kafka credentials volume"),
    ("app container", with_container("containers", {"name": "durable-agent", "image": "x"}),
     "container 'durable-agent' has the name of the buffer agent"),
    ("init container", with_container("initContainers", {"name": "durable-agent",
                                                         "image": "x"}),
     "init container 'durable-agent' has the name of the buffer agent"),
    ("bootstrap env", with_env("KAFKA_BOOTSTRAP_SERVERS", value="kafka:9092"),
     "container 'app' sets KAFKA_BOOTSTRAP_SERVERS"),
    ("twin env from a secret", with_env("DURABLE_PRODUCER_BOOTSTRAP", valueFrom={
        "secretKeyRef": {"name": "s", "key": "k"}}),
     "container 'app' sets DURABLE_PRODUCER_BOOTSTRAP"),
    ("kafka port", with_port(containerPort=9092),
     "container 'app' declares port 9092, which the buffer agent listens on"),
    ("metrics port", with_port(containerPort=9644),
     "declares port 9644, which the buffer agent listens on in the same pod"
     " (spec.agent.ports.metrics)"),
    ("metrics port name", with_port(name="dp-metrics", containerPort=7000),
     "names a port 'dp-metrics'"),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "message"), [(pod, message) for _, pod, message in CLASHES],
                         ids=[name for name, _, _ in CLASHES])
def test_each_clash_is_named(pod: dict[str, Any], message: str) -> None:
    found = pod_clashes.clashes(pod, SPEC)

    assert len(found) == 1, found
    assert message in found[0]


def test_our_volume_name_with_another_claim_than_recorded_is_a_clash() -> None:
    """A pod copied from a mutated one but pointing its buffer volume elsewhere."""
    pod = mutated(app_pod())
    pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "someone-elses"

    (found,) = pod_clashes.clashes(pod, SPEC)

    assert "volume 'durable-buffer'" in found


def test_every_clash_is_reported_at_once() -> None:
    pod = with_volume({"name": "durable-buffer", "emptyDir": {}})
    pod["spec"]["containers"].append({"name": "durable-agent", "image": "x"})

    assert len(pod_clashes.clashes(pod, SPEC)) == 2


def test_a_host_network_pod_is_warned_about_the_nodes_ports() -> None:
    """Admitted without a word: two such pods on one node, and the second agent crash-looped
    on "cannot listen there (Address already in use)"."""
    pod = app_pod()
    assert pod_clashes.warnings(pod, SPEC) == []
    pod["spec"]["hostNetwork"] = True
    (warning,) = pod_clashes.warnings(pod, SPEC)
    assert "node's ports 9092 and 9644" in warning
    assert pod_clashes.clashes(pod, SPEC) == []  # admitted: one such pod a node works
