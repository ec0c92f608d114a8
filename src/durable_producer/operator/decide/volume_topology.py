"""Whether a bound pool volume can be attached where a pod may run (pure; review D3).

A PersistentVolume's ``spec.nodeAffinity`` (a zonal disk provisioned in one zone, a node-local
PV) constrains every pod that mounts it: the scheduler places the pod only on a node that
matches both the PV's terms and the pod's own placement (``nodeSelector``, ``nodeName`` and the
required node affinity terms). A free volume handed to a pod whose placement excludes every
node the PV allows leaves the pod Pending for ever ("volume node affinity conflict").

``may_fit`` answers from the two objects alone, without the node list: it says no only when
every combination of a PV term and a pod term asks, for one label (or field), for values that
cannot all hold at once (``In`` sets that do not meet, a value both required and excluded,
``Exists`` with ``DoesNotExist``). Anything it cannot judge (``Gt``/``Lt``, empty terms, an
unreadable PV) is taken as fitting: the pod is then placed as it was before this check.

``pinned_nodes`` names the nodes a node-local PV (local-path, TopoLVM, OpenEBS LocalPV) can be
attached on: when none of them exists any more (spot reclaim, scale-down), no pod can mount it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_producer.operator.decide.kube_objects import Object

FIELD_PREFIX = "field:"
"""Keys of ``matchFields`` (``metadata.name``) are told apart from label keys by this prefix."""
NODE_NAME_FIELD = f"{FIELD_PREFIX}metadata.name"
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""Node-local PVs name their node by this label (its value is the node's name on the usual
clusters) or by the field ``metadata.name``."""

CONFLICT_MESSAGES = (
    "didn't match PersistentVolume's node affinity",
    "volume node affinity conflict",
)
"""How the scheduler says a pod's PV cannot be attached on a node (PodScheduled=False): the
wording since Kubernetes 1.27 or so, and the older one."""

Requirement = tuple[str, str, frozenset[str]]
"""(label key or FIELD_PREFIX + field, operator, values) of a node selector requirement."""


def scheduler_conflict(message: str) -> bool:
    """Whether a scheduler message says a volume's node affinity ruled nodes out."""
    return any(phrase in message for phrase in CONFLICT_MESSAGES)


def bound_volume(pvc: Object) -> str | None:
    """The PersistentVolume a PVC is bound to (``spec.volumeName``), or None (not yet bound)."""
    name = (pvc.get("spec") or {}).get("volumeName")
    return str(name) if name else None


def _requirements(term: Mapping[str, Any]) -> list[Requirement]:
    found: list[Requirement] = []
    for source, prefix in (("matchExpressions", ""), ("matchFields", FIELD_PREFIX)):
        for expression in term.get(source) or []:
            if not isinstance(expression, Mapping) or not expression.get("key"):
                continue
            values = frozenset(str(value) for value in expression.get("values") or [])
            found.append((prefix + str(expression["key"]), str(expression.get("operator")), values))
    return found


def _terms(selector: Any) -> list[list[Requirement]]:
    """The terms of a NodeSelector (ORed), each its requirements (ANDed); empty terms, which
    the scheduler matches with no node, are left out (nothing is judged from them)."""
    if not isinstance(selector, Mapping):
        return []
    terms = [_requirements(term) for term in selector.get("nodeSelectorTerms") or []
             if isinstance(term, Mapping)]  # fmt: skip
    return [term for term in terms if term]


def pv_terms(pv: Object) -> list[list[Requirement]]:
    """The PV's required node affinity terms; [] when it has none (any node)."""
    node_affinity = (pv.get("spec") or {}).get("nodeAffinity") or {}
    return _terms(node_affinity.get("required") if isinstance(node_affinity, Mapping) else None)


def pod_terms(pod: Object) -> list[list[Requirement]]:
    """The pod's own placement as terms (ORed): its nodeSelector and nodeName ANDed into each
    of its required node affinity terms (or alone, without such terms)."""
    spec = pod.get("spec") or {}
    base: list[Requirement] = [
        (str(key), "In", frozenset({str(value)}))
        for key, value in (spec.get("nodeSelector") or {}).items()
    ]
    if spec.get("nodeName"):
        base.append((NODE_NAME_FIELD, "In", frozenset({str(spec["nodeName"])})))
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    terms = _terms(required)
    return [base + term for term in terms] if terms else [base]


@dataclass
class _Key:
    allowed: frozenset[str] | None = None  # None: any value
    excluded: set[str] = field(default_factory=set)
    exists: bool = False
    absent: bool = False

    def add(self, operator: str, values: frozenset[str]) -> None:
        if operator == "In":
            self.allowed = values if self.allowed is None else self.allowed & values
        elif operator == "NotIn":
            self.excluded |= values
        elif operator == "Exists":
            self.exists = True
        elif operator == "DoesNotExist":
            self.absent = True
        # Gt, Lt and unknown operators: not judged.

    def satisfiable(self) -> bool:
        if self.absent and (self.exists or self.allowed is not None):
            return False
        return self.allowed is None or bool(self.allowed - self.excluded)


def satisfiable(requirements: Iterable[Requirement]) -> bool:
    """Whether some node could meet all ``requirements`` at once, judged key by key."""
    keys: dict[str, _Key] = {}
    for key, operator, values in requirements:
        keys.setdefault(key, _Key()).add(operator, values)
    return all(key.satisfiable() for key in keys.values())


def _may_meet(pv: Sequence[list[Requirement]], pod: Sequence[list[Requirement]]) -> bool:
    if not pv:
        return True
    return any(satisfiable(pv_term + pod_term) for pv_term in pv for pod_term in pod)


def may_fit(pv: Object, pod: Object) -> bool:
    """False only when no node can meet both the PV's node affinity and the pod's placement."""
    return _may_meet(pv_terms(pv), pod_terms(pod))


def pinned_nodes(pv: Object) -> frozenset[str] | None:
    """The node names a node-local PV can be attached on: when each of its terms asks for
    ``kubernetes.io/hostname`` or ``metadata.name`` In a list; None for any other PV."""
    names: set[str] = set()
    terms = pv_terms(pv)
    for term in terms:
        named = [
            values
            for key, operator, values in term
            if key in (HOSTNAME_LABEL, NODE_NAME_FIELD) and operator == "In"
        ]
        if not named:
            return None
        names |= frozenset.intersection(*named)
    return frozenset(names) if terms else None
