"""Pure pod mutation: (pod, DurableProducer spec, buffer PVC name) -> JSONPatch operations.

The admission handler (admission.py) only fetches the inputs and answers with these
operations. Pods are handled as raw dicts so that no field we do not know (a container's
``restartPolicy``, a newer API field) is ever dropped, and every step is "replace or append
by name" (the agent: "put right after the last other native sidecar", ``with_agent_placed``),
so a second pass over an already mutated pod yields no operations at all. The agent container
itself (args, resources, probes, secret volumes) is built by agent_container.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from durable_producer.contract import (
    AGENT_CONTAINER_NAME,
    AGENT_HASH_ANNOTATION,
    AGENT_HOST,
    BOOTSTRAP_ENV,
    BOOTSTRAP_TWIN_ENV,
    BUFFER_VOLUME_ANNOTATION,
    BUFFER_VOLUME_NAME,
    CLAIM_TOKEN_ANNOTATION,
    INJECTED_ANNOTATION,
    PRODUCER_LABEL,
)
from durable_producer.operator.decide import mesh, pod_key
from durable_producer.operator.decide.agent_container import (
    AGENT_USER_ID,
    MINIMUM_GRACE_SECONDS,
    agent_sidecar,
    image_pull_secrets,
    secret_volumes,
)
from durable_producer.operator.decide.injection_hash import sidecar_hash
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec

JsonPatchOp = dict[str, Any]


def bootstrap_address(spec: DurableProducerSpec) -> str:
    return f"{AGENT_HOST}:{spec.agent.ports.kafka}"


def claimed_volume(pod: Mapping[str, Any]) -> str | None:
    """The buffer PVC a pod already references (after an earlier pass of the webhook)."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == BUFFER_VOLUME_NAME:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            return str(claim) if claim else None
    return None


def producer_name(pod: Mapping[str, Any]) -> str | None:
    """The DurableProducer a pod opts in to, from its label."""
    name = ((pod.get("metadata") or {}).get("labels") or {}).get(PRODUCER_LABEL)
    return str(name) if name else None


def _upsert_by_name(items: list[Any] | None, item: dict[str, Any]) -> list[Any]:
    """The list with the same-named entry replaced in place, or the item appended."""
    result = list(items or [])
    for index, existing in enumerate(result):
        if isinstance(existing, dict) and existing.get("name") == item["name"]:
            result[index] = item
            return result
    return [*result, item]


def _is_other_native_sidecar(container: Any) -> bool:
    return (
        isinstance(container, dict)
        and container.get("restartPolicy") == "Always"
        and container.get("name") != AGENT_CONTAINER_NAME
    )


def with_agent_placed(init_containers: list[Any] | None, agent: dict[str, Any]) -> list[Any]:
    """The init containers with the agent right after the last other native sidecar
    (``restartPolicy: Always``: a mesh proxy, a log shipper), or first when there is none.

    Native sidecars start in order and stop in reverse order: after every proxy, the agent
    starts with the pod's network ready and stops before the proxy does, so its final drain
    still reaches Kafka (D4). Ordinary init containers after the last sidecar stay after the
    agent; those before it (a mesh's iptables setup) stay before it. The others keep their
    order, and an agent already in the list is moved there, so a second pass finds it in place.
    """
    others = [
        container
        for container in init_containers or []
        if not (isinstance(container, dict) and container.get("name") == AGENT_CONTAINER_NAME)
    ]
    position = 1 + max(
        (index for index, container in enumerate(others) if _is_other_native_sidecar(container)),
        default=-1,
    )
    return [*others[:position], agent, *others[position:]]


def _with_bootstrap_env(container: dict[str, Any], address: str) -> dict[str, Any]:
    updated = dict(container)
    env = list(container.get("env") or [])
    for name in (BOOTSTRAP_ENV, BOOTSTRAP_TWIN_ENV):
        env = _upsert_by_name(env, {"name": name, "value": address})
    updated["env"] = env
    return updated


def injected_summary(
    producer: str,
    spec: DurableProducerSpec,
    claim_name: str,
    agent_image: AgentImage,
    admitted_as: str | None,
) -> str:
    """The value of the injected annotation: what was added, for humans and audits, and for
    which pod (``pod_key.admitted_as``: a reinvocation finds its own pod there, a copy not)."""
    return json.dumps(
        {
            "producer": producer,
            "agentImage": agent_image.image_for(spec.agent),
            "volume": claim_name,
            "bootstrap": bootstrap_address(spec),
            "pod": admitted_as,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def mutated_pod(
    pod: Mapping[str, Any],
    producer: str,
    spec: DurableProducerSpec,
    claim_name: str,
    agent_image: AgentImage,
    log_level: str | None = None,
    claim_token: str | None = None,
) -> dict[str, Any]:
    """The pod as it should be admitted: a deep copy with the agent, env and volume in place,
    the hash of the injected sidecar (injection_hash.py) in an annotation, and the agent's
    metrics port in the meshes' inbound exclusions (mesh.py)."""
    result: dict[str, Any] = copy.deepcopy(dict(pod))
    metadata = result.setdefault("metadata", {})
    pod_spec = result.setdefault("spec", {})
    sidecar = agent_sidecar(spec, agent_image, log_level)
    pod_spec["initContainers"] = with_agent_placed(pod_spec.get("initContainers"), sidecar)
    address = bootstrap_address(spec)
    pod_spec["containers"] = [
        _with_bootstrap_env(container, address) for container in pod_spec.get("containers") or []
    ]
    volumes = _upsert_by_name(
        pod_spec.get("volumes"),
        {"name": BUFFER_VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim_name}},
    )
    for secret_volume in secret_volumes(spec):
        volumes = _upsert_by_name(volumes, secret_volume)
    pod_spec["volumes"] = volumes
    pull_secrets = image_pull_secrets(pod_spec.get("imagePullSecrets"), agent_image)
    if pull_secrets is not None:
        pod_spec["imagePullSecrets"] = pull_secrets

    grace = pod_spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < MINIMUM_GRACE_SECONDS:
        pod_spec["terminationGracePeriodSeconds"] = MINIMUM_GRACE_SECONDS
    security = dict(pod_spec.get("securityContext") or {})
    if "fsGroup" not in security:
        # The buffer volume must be writable by the agent's non-root user.
        security["fsGroup"] = AGENT_USER_ID
        # Change ownership only when the volume root does not match (not every mount).
        security.setdefault("fsGroupChangePolicy", "OnRootMismatch")
        pod_spec["securityContext"] = security

    annotations = dict(metadata.get("annotations") or {})
    annotations[INJECTED_ANNOTATION] = injected_summary(
        producer, spec, claim_name, agent_image, pod_key.admitted_as(pod)
    )
    annotations[BUFFER_VOLUME_ANNOTATION] = claim_name
    if claim_token is not None:
        # The claim the volume was handed out under: the agent's shutdown record speaks for
        # the volume only while that claim holds (clean_shutdown.py).
        annotations[CLAIM_TOKEN_ANNOTATION] = claim_token
    annotations[AGENT_HASH_ANNOTATION] = sidecar_hash(sidecar)
    # Kubelet's probes and the operator's scrape reach the agent past a mesh proxy (D4).
    metadata["annotations"] = mesh.with_inbound_port_excluded(
        annotations, spec.agent.ports.metrics
    )
    return result


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def diff_ops(original: Mapping[str, Any], desired: Mapping[str, Any]) -> list[JsonPatchOp]:
    """JSONPatch ops turning original into desired, one `add` per changed metadata/spec field.

    `add` on an object member replaces an existing value, so each op is valid whether or not
    the field was present; unchanged fields produce no op.
    """
    ops: list[JsonPatchOp] = []
    for section in ("metadata", "spec"):
        before = original.get(section)
        after = desired.get(section)
        if before == after:
            continue
        if not isinstance(before, Mapping) or not isinstance(after, Mapping):
            ops.append({"op": "add", "path": f"/{section}", "value": after})
            continue
        for key, value in after.items():
            if before.get(key) != value:
                ops.append({"op": "add", "path": f"/{section}/{_escape(key)}", "value": value})
    return ops


def mutation_patch(
    pod: Mapping[str, Any],
    producer: str,
    spec: DurableProducerSpec,
    claim_name: str,
    agent_image: AgentImage,
    log_level: str | None = None,
    claim_token: str | None = None,
) -> list[JsonPatchOp]:
    """The JSONPatch the webhook answers with; empty when the pod is already as desired."""
    return diff_ops(
        pod,
        mutated_pod(pod, producer, spec, claim_name, agent_image, log_level, claim_token),
    )


def already_mutated(pod: Mapping[str, Any]) -> bool:
    """Whether an earlier pass of the webhook mutated this very pod (a reinvocation): our
    annotation names this pod (``pod_key.admitted_as``), and the agent and the buffer volume
    are there. A pod created from a copy of an admitted pod's manifest carries the other pod's
    annotation and claim: it is mutated again, with a volume of its own."""
    if not is_injected(pod):
        return False
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        recorded = json.loads(str(annotations.get(INJECTED_ANNOTATION)))["pod"]
    except (ValueError, TypeError, KeyError):
        return False
    return recorded is not None and recorded == pod_key.admitted_as(pod)


def reinvocation_patch(pod: Mapping[str, Any]) -> list[JsonPatchOp]:
    """The JSONPatch for a pod our first pass already mutated (``already_mutated``).

    The agent container, volumes and annotations are left exactly as they are now: other
    webhooks and the API server's in-tree plugins (run again before a reinvocation) may have
    changed them on purpose (a registry mirror, LimitRange defaults, a policy's
    securityContext). Only app containers added after our pass (no bootstrap env at all) get
    the agent's address, read from our annotation; and a native sidecar added after our pass
    behind the agent (a mesh proxy a later webhook appended) gets the agent moved after it,
    unchanged (``with_agent_placed``: the agent must stop before the proxy). Empty when
    nothing was added.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        address = json.loads(str(annotations.get(INJECTED_ANNOTATION)))["bootstrap"]
    except (ValueError, TypeError, KeyError):
        return []
    if not isinstance(address, str) or not address:
        return []
    ops: list[JsonPatchOp] = []
    init_containers = list((pod.get("spec") or {}).get("initContainers") or [])
    agent = next(
        (
            container
            for container in init_containers
            if isinstance(container, dict) and container.get("name") == AGENT_CONTAINER_NAME
        ),
        None,
    )
    if agent is not None:
        placed = with_agent_placed(init_containers, agent)
        if placed != init_containers:
            ops.append({"op": "add", "path": "/spec/initContainers", "value": placed})
    containers = list((pod.get("spec") or {}).get("containers") or [])
    updated = [
        container
        if not isinstance(container, dict) or _has_bootstrap_env(container)
        else _with_bootstrap_env(container, address)
        for container in containers
    ]
    if updated != containers:
        ops.append({"op": "add", "path": "/spec/containers", "value": updated})
    return ops


def _has_bootstrap_env(container: Mapping[str, Any]) -> bool:
    names = {item.get("name") for item in container.get("env") or [] if isinstance(item, dict)}
    return bool(names & {BOOTSTRAP_ENV, BOOTSTRAP_TWIN_ENV})


def is_injected(pod: Mapping[str, Any]) -> bool:
    """Whether a pod runs the agent sidecar (the audit checks admitted pods with this)."""
    init_containers = (pod.get("spec") or {}).get("initContainers") or []
    return (
        any(
            container.get("name") == AGENT_CONTAINER_NAME
            and container.get("restartPolicy") == "Always"
            for container in init_containers
        )
        and claimed_volume(pod) is not None
    )
