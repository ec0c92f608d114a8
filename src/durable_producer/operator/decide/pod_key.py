"""Who a pod being admitted is, the same on every attempt to create it (pure).

The claim a pool volume carries for a pod (handout.py) and the record our webhook's first pass
leaves on the pod (pod_mutation.py: a later pass that finds its own record is a reinvocation,
a copied pod's record names another pod) both use this key.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_producer.operator.decide.kube_objects import Object


@dataclass(frozen=True)
class ClaimKey:
    """Who a claim is for: the same value for every attempt to create the same pod."""

    value: str
    one_pod: bool  # a fixed name: no other live pod can share it


def claim_key(pod: Object) -> ClaimKey | None:
    """The pod's controller and name (or generateName); None when the pod has neither."""
    metadata = pod.get("metadata") or {}
    owners = metadata.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    owner_part = f"{owner.get('kind', '')}/{owner.get('uid', '')}" if owner else "-"
    if metadata.get("name"):
        return ClaimKey(f"{owner_part}/{metadata['name']}", one_pod=True)
    if metadata.get("generateName"):
        return ClaimKey(f"{owner_part}/{metadata['generateName']}*", one_pod=False)
    return None


def admitted_as(pod: Object) -> str | None:
    """The namespace and claim key of a pod being admitted: what our first pass records on it."""
    key = claim_key(pod)
    namespace = (pod.get("metadata") or {}).get("namespace")
    return f"{namespace}/{key.value}" if key is not None and namespace else None
