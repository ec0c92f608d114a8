"""Pure: which pods run an outdated agent, for ``status.outdatedAgents`` (pool timer).

A pod is outdated when the ``durable.dev/agent-hash`` annotation the webhook wrote at its
creation differs from the hash of the sidecar the webhook would inject into it now: the same
pod annotations (overrides.py), today's DurableProducer spec and today's operator settings
(the agent image of the Helm release). Pods injected before the hash existed count as
outdated. The operator never restarts a pod itself: ``kubectl rollout restart`` does, and
each recreated pod goes through the webhook again (docs/runbook.md, "Upgrading").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable_producer.contract import AGENT_HASH_ANNOTATION
from durable_producer.operator.decide import agent_container, overrides, pod_mutation, reconcile
from durable_producer.operator.decide.injection_hash import sidecar_hash
from durable_producer.operator.decide.kube_objects import Object, name_of
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec

OUTDATED_STATUS_KEY = "outdatedAgents"
_FINISHED_PHASES = ("Succeeded", "Failed")


def expected_hash(
    pod: Mapping[str, Any], spec: DurableProducerSpec, agent_image: AgentImage
) -> str | None:
    """The hash the webhook would write into this pod now; None when its annotations are no
    longer valid (it could not be recreated as it is)."""
    pod_overrides = overrides.pod_overrides(pod)
    if isinstance(pod_overrides, list):
        return None
    effective = overrides.effective_spec(spec, pod_overrides)
    if isinstance(effective, str):
        return None
    return sidecar_hash(
        agent_container.agent_sidecar(effective, agent_image, pod_overrides.log_level)
    )


def outdated_pods(
    pods: Iterable[Object], spec: DurableProducerSpec, agent_image: AgentImage
) -> list[str]:
    """Names of the pods with an agent (not finished) whose agent is not what would be injected
    now, sorted."""
    names = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in _FINISHED_PHASES:
            continue
        if not pod_mutation.is_injected(pod):
            continue
        recorded = ((pod.get("metadata") or {}).get("annotations") or {}).get(
            AGENT_HASH_ANNOTATION
        )
        if recorded is None or recorded != expected_hash(pod, spec, agent_image):
            names.append(name_of(pod))
    return sorted(names)


def outdated_status(
    producer: Object, pods: Iterable[Object], agent_image: AgentImage
) -> dict[str, Any]:
    """The status merge patch for ``outdatedAgents`` (empty when unchanged or the spec is
    invalid: then nothing would be injected at all)."""
    spec = reconcile.parse_spec(producer.get("spec"))
    if isinstance(spec, str):
        return {}
    count = len(outdated_pods(pods, spec, agent_image))
    if (producer.get("status") or {}).get(OUTDATED_STATUS_KEY) == count:
        return {}
    return {OUTDATED_STATUS_KEY: count}
