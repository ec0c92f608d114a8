"""Where a volume's drain Job may run: where the pod that claimed the volume could (pure).

A pool volume is written by a pod on a tainted, dedicated or spot node pool, or in one zone; a
drain Job without that pod's tolerations and node constraints stays Pending (a taint refuses
it, a zonal or node-local volume cannot be attached elsewhere) until its deadline, and the
backlog is never drained (review D9). At claim time the webhook records the pod's
``tolerations``, ``nodeSelector`` and node affinity on the PVC (``PLACEMENT_ANNOTATION``);
the drain Job's pod gets them. Pod (anti-)affinity is not copied: it is about the app's own
pods, which the drain pod is not.
"""

from __future__ import annotations

import json
from typing import Any

from durable_producer.operator.decide.kube_objects import Object, annotations_of
from durable_producer.operator.decide.volume_pool import PLACEMENT_ANNOTATION


def recorded(pod: Object) -> str | None:
    """The annotation value for the pod's placement; None when the pod has no constraints."""
    spec = pod.get("spec") or {}
    fields = _valid(
        {
            "tolerations": spec.get("tolerations"),
            "nodeSelector": spec.get("nodeSelector"),
            "affinity": {"nodeAffinity": (spec.get("affinity") or {}).get("nodeAffinity")},
        }
    )
    return json.dumps(fields, sort_keys=True, separators=(",", ":")) if fields else None


def pod_fields(pvc: Object) -> dict[str, Any]:
    """The drain pod's spec fields from the volume's annotation ({} when none or unusable)."""
    raw = annotations_of(pvc).get(PLACEMENT_ANNOTATION)
    if not raw:
        return {}
    try:
        fields = json.loads(str(raw))
    except ValueError:
        return {}
    return _valid(fields) if isinstance(fields, dict) else {}


def _valid(fields: dict[str, Any]) -> dict[str, Any]:
    """Only the placement fields, each of the right shape and not empty."""
    valid: dict[str, Any] = {}
    tolerations = fields.get("tolerations")
    if isinstance(tolerations, list) and tolerations:
        valid["tolerations"] = [t for t in tolerations if isinstance(t, dict)]
    selector = fields.get("nodeSelector")
    if isinstance(selector, dict) and selector:
        valid["nodeSelector"] = {str(k): str(v) for k, v in selector.items()}
    affinity = fields.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if isinstance(node_affinity, dict) and node_affinity:
        valid["affinity"] = {"nodeAffinity": node_affinity}
    return {name: value for name, value in valid.items() if value}
