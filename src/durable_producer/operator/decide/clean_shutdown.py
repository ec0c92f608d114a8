"""A pod's agent that stopped with its volume empty: the volume is known empty (pure).

The agent writes a shutdown record to its termination message when SIGTERM stops it
(``shutdown_record.py``); the kubelet puts it in the pod's last status, just before it deletes
the pod. The operator sees that status on its pod watch and marks the pod's volume
``backlog: empty``, so the volume goes without a drain Job: the only way it can go once no
Job can run (a namespace being deleted refuses new pods: review D2 (b)).

Only when the record can speak for the volume as it is now:
- the pod is stopping for good (being deleted, or finished): the kubelet restarts a sidecar
  that merely exited, which could write again;
- the agent ended with exit code 0 and a record saying nothing is left (no WAL backlog, no
  pending dead letter, no quarantined segment);
- the volume's claim is still this pod's: the claim token the webhook put on both the pod
  and the PVC is the PVC's current claim, or the one the pool released last with no claim
  since. A later pod that claimed the volume (and may have written to it) changes the token,
  so a late or replayed event never marks its data empty. The patch carries the
  resourceVersion read, so a claim between the read and the write makes it fail (409).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable_producer import shutdown_record
from durable_producer.contract import AGENT_CONTAINER_NAME, CLAIM_TOKEN_ANNOTATION
from durable_producer.operator.decide import pod_mutation
from durable_producer.operator.decide.kube_objects import (
    FINISHED_POD_PHASES,
    Object,
    annotations_of,
)
from durable_producer.operator.decide.volume_pool import (
    BACKLOG_ANNOTATION,
    BACKLOG_EMPTY,
    RELEASED_TOKEN_ANNOTATION,
)


@dataclass(frozen=True)
class EmptiedVolume:
    """The volume a pod's agent left empty, and the claim the pod held it under."""

    volume: str
    claim_token: str


def emptied_volume(pod: Object) -> EmptiedVolume | None:
    """The volume this pod's agent reported empty as it stopped for good; else None."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    stopping = metadata.get("deletionTimestamp") or status.get("phase") in FINISHED_POD_PHASES
    token = annotations_of(pod).get(CLAIM_TOKEN_ANNOTATION)
    volume = pod_mutation.claimed_volume(pod)
    if not stopping or not token or volume is None or not pod_mutation.is_injected(pod):
        return None
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for container in statuses:
        if container.get("name") != AGENT_CONTAINER_NAME:
            continue
        ended = (container.get("state") or {}).get("terminated") or {}
        record = shutdown_record.parse(ended.get("message"))
        if ended.get("exitCode") == 0 and record is not None and record.volume_empty:
            return EmptiedVolume(volume, str(token))
    return None


def still_that_claim(pvc: Object, claim_token: str) -> bool:
    """Whether the volume is still under the claim ``claim_token`` (or was released from it
    with no claim since): only then can that pod's record speak for it."""
    annotations = annotations_of(pvc)
    current = annotations.get(CLAIM_TOKEN_ANNOTATION)
    if current:
        return current == claim_token
    return annotations.get(RELEASED_TOKEN_ANNOTATION) == claim_token


def needs_marking(pvc: Object, claim_token: str) -> bool:
    return (
        still_that_claim(pvc, claim_token)
        and annotations_of(pvc).get(BACKLOG_ANNOTATION) != BACKLOG_EMPTY
    )


def empty_patch(pvc: Object) -> dict[str, Any]:
    """Merge patch marking the volume empty, guarded by the resourceVersion read."""
    return {
        "metadata": {
            "resourceVersion": (pvc.get("metadata") or {}).get("resourceVersion"),
            "annotations": {BACKLOG_ANNOTATION: BACKLOG_EMPTY},
        }
    }
