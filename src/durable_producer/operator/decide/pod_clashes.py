"""Pure: what in an opted-in pod would clash with what the webhook adds (names, env, ports).

The mutation replaces or appends by name (pod_mutation.py), so a pod that already uses one of
our names would silently lose its own object: a user emptyDir named ``durable-buffer`` would
become the WAL volume, a user PVC of that name would be adopted and never drained, an app
container named ``durable-agent`` would give two containers of that name. The webhook refuses
such a pod instead, with one message per clash naming it and saying what to rename.

What the webhook itself added on an earlier pass (a re-invocation) is not a clash: the pod
then carries our annotations, and the objects are exactly ours.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from durable_producer.contract import (
    AGENT_CONTAINER_NAME,
    BOOTSTRAP_ENV,
    BOOTSTRAP_TWIN_ENV,
    BUFFER_VOLUME_ANNOTATION,
    BUFFER_VOLUME_NAME,
    INJECTED_ANNOTATION,
)
from durable_producer.operator.decide import agent_container, pod_mutation
from durable_producer.operator.decide.kube_objects import annotations_of
from durable_producer.operator.model.model import DurableProducerSpec


def _containers(pod: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return [c for c in (pod.get("spec") or {}).get(kind) or [] if isinstance(c, Mapping)]


def _ours(pod: Mapping[str, Any]) -> bool:
    """Whether the webhook already mutated this pod (a re-invocation)."""
    return INJECTED_ANNOTATION in annotations_of(pod)


def _container_clashes(pod: Mapping[str, Any]) -> Iterator[str]:
    for container in _containers(pod, "containers"):
        if container.get("name") == AGENT_CONTAINER_NAME:
            yield (
                f"container {AGENT_CONTAINER_NAME!r} has the name of the buffer agent the"
                " webhook adds: rename the container"
            )
    if not _ours(pod):
        for container in _containers(pod, "initContainers"):
            if container.get("name") == AGENT_CONTAINER_NAME:
                yield (
                    f"init container {AGENT_CONTAINER_NAME!r} has the name of the buffer agent"
                    " the webhook adds: rename the init container"
                )


def _volume_clashes(pod: Mapping[str, Any], spec: DurableProducerSpec) -> Iterator[str]:
    volumes = {
        v.get("name"): v
        for v in (pod.get("spec") or {}).get("volumes") or []
        if isinstance(v, dict)
    }
    buffer = volumes.get(BUFFER_VOLUME_NAME)
    if buffer is not None:
        claim = (buffer.get("persistentVolumeClaim") or {}).get("claimName")
        recorded = annotations_of(pod).get(BUFFER_VOLUME_ANNOTATION)
        if not (_ours(pod) and claim and claim == recorded):
            yield (
                f"volume {BUFFER_VOLUME_NAME!r} has the name of the buffer volume the webhook"
                " adds (a PersistentVolumeClaim from the DurableProducer's pool): rename the"
                " volume"
            )
    for wanted in agent_container.secret_volumes(spec):
        existing = volumes.get(wanted["name"])
        if existing is not None and existing != wanted:
            yield (
                f"volume {wanted['name']!r} has the name of the Kafka credentials volume the"
                " webhook adds: rename the volume"
            )


def _env_clashes(pod: Mapping[str, Any], spec: DurableProducerSpec) -> Iterator[str]:
    address = pod_mutation.bootstrap_address(spec)
    for container in _containers(pod, "containers"):
        for item in container.get("env") or []:
            if not isinstance(item, Mapping) or item.get("name") not in (
                BOOTSTRAP_ENV,
                BOOTSTRAP_TWIN_ENV,
            ):
                continue
            if dict(item) != {"name": item["name"], "value": address}:
                yield (
                    f"container {container.get('name')!r} sets {item['name']}, which the"
                    f" webhook sets to the agent's address {address}: remove it from the pod"
                    " (the agent forwards to the DurableProducer's spec.kafka.bootstrapServers)"
                )


def _port_clashes(pod: Mapping[str, Any], spec: DurableProducerSpec) -> Iterator[str]:
    ports = spec.agent.ports
    agent_ports = {ports.kafka: "spec.agent.ports.kafka", ports.metrics: "spec.agent.ports.metrics"}
    for kind in ("initContainers", "containers"):
        for container in _containers(pod, kind):
            name = container.get("name")
            if kind == "initContainers" and name == AGENT_CONTAINER_NAME and _ours(pod):
                continue
            for port in container.get("ports") or []:
                if not isinstance(port, Mapping):
                    continue
                number = port.get("containerPort")
                if number in agent_ports:
                    yield (
                        f"container {name!r} declares port {number}, which the buffer agent"
                        f" listens on in the same pod ({agent_ports[number]}): change"
                        f" {agent_ports[number]} in the DurableProducer or the container's port"
                    )
                if port.get("name") == agent_container.METRICS_PORT_NAME:
                    yield (
                        f"container {name!r} names a port {agent_container.METRICS_PORT_NAME!r},"
                        " the name of the agent's metrics port (port names are unique in a"
                        " pod): rename the port"
                    )


def clashes(pod: Mapping[str, Any], spec: DurableProducerSpec) -> list[str]:
    """Every clash between the pod and what the webhook would add; empty: none."""
    return [
        *_container_clashes(pod),
        *_volume_clashes(pod, spec),
        *_env_clashes(pod, spec),
        *_port_clashes(pod, spec),
    ]


def warnings(pod: Mapping[str, Any], spec: DurableProducerSpec) -> list[str]:
    """What may clash outside the pod: a hostNetwork pod's agent listens on the node's ports,
    so a second such pod on the node (or anything else holding them) stops its agent."""
    if not (pod.get("spec") or {}).get("hostNetwork"):
        return []
    ports = spec.agent.ports
    return [
        f"hostNetwork: the buffer agent listens on the node's ports {ports.kafka} and"
        f" {ports.metrics}; a second such pod on the node cannot start its agent: keep these"
        " pods one a node (a DaemonSet or anti-affinity)"
    ]
