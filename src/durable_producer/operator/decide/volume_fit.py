"""Whether a pool volume fits the spec as it is now, and whether a smaller one can grow (pure).

A spec change (a higher throughput, a longer outage, another storage class) leaves volumes
made for the old spec in the pool. Only volumes that fit are handed to new pods: their agent
is told a WAL size limit computed from the spec, which a smaller volume could not hold. A free
volume that is too small is expanded when its StorageClass allows it (``allowVolumeExpansion``)
and otherwise drained (if it may hold backlog) and deleted; see volume_pool.plan_pool.

The storage class a volume was asked for is recorded on the PVC when it is created: a PVC
created without a class gets the cluster default's name from the API server, which says
nothing about what the spec asked.

A volume's size is what it has (``status.capacity``), not what was asked: an expansion
counts once done (review D10). The resizer grows the disk (the PVC's ``Resizing``
condition), then, for most drivers, the kubelet grows the filesystem when a pod mounts it
(``FileSystemResizePending``): from then on the next pod sees the new size, so it counts.
A resize in progress, or refused by the storage (EBS allows one change per volume in six
hours), leaves the old size; the volume then waits for it, and is drained and retired if
the storage says it cannot be done (``allocatedResourceStatuses``: ``...Infeasible``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_producer.contract import GROUP
from durable_producer.operator.decide.kube_objects import Object
from durable_producer.operator.decide.sizing import SizingInputs, size_buffer
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import format_bytes, parse_bytes

STORAGE_CLASS_ANNOTATION = f"{GROUP}/storage-class"
"""The storageClassName the operator asked for; "" for the cluster default."""
EXPANSION_REFUSED_ANNOTATION = f"{GROUP}/expansion-refused"
"""The size an expansion to was refused by the API server (then the volume is retired)."""


@dataclass(frozen=True)
class VolumeFit:
    """What a volume must be to be handed to a new pod, and which classes can expand."""

    size_bytes: int
    storage_class: str | None = None
    expandable_classes: frozenset[str] = frozenset()

    @classmethod
    def from_spec(
        cls, spec: DurableProducerSpec, expandable_classes: Iterable[str] = ()
    ) -> VolumeFit:
        return cls(
            size_bytes=size_buffer(SizingInputs.from_spec(spec)).size_bytes,
            storage_class=spec.storage.storage_class_name,
            expandable_classes=frozenset(expandable_classes),
        )

    @property
    def size_quantity(self) -> str:
        return format_bytes(self.size_bytes)


def _pvc_spec(pvc: Object) -> Mapping[str, Any]:
    return pvc.get("spec") or {}


def requested_bytes(pvc: Object) -> int | None:
    """``spec.resources.requests.storage`` in bytes; None when absent or unreadable."""
    quantity = ((_pvc_spec(pvc).get("resources") or {}).get("requests") or {}).get("storage")
    try:
        return parse_bytes(str(quantity)) if quantity is not None else None
    except ValueError:
        return None


def usable_bytes(pvc: Object) -> int | None:
    """The size a pod mounting the volume gets: ``status.capacity.storage``; the request while
    unbound (it is provisioned at that size) or once only the filesystem is left to grow."""
    requested = requested_bytes(pvc)
    quantity = ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
    try:
        capacity = parse_bytes(str(quantity)) if quantity is not None else None
    except ValueError:
        capacity = None
    if capacity is None:
        return requested
    if requested is not None and capacity < requested and _filesystem_resize_pending(pvc):
        return requested
    return capacity


def _filesystem_resize_pending(pvc: Object) -> bool:
    conditions = (pvc.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "FileSystemResizePending" and c.get("status") == "True"
        for c in conditions
    )


def resize_infeasible(pvc: Object) -> bool:
    """The storage said the volume's expansion cannot be done (RecoverVolumeExpansionFailure:
    ``ControllerResizeInfeasible``, ``NodeResizeInfeasible``)."""
    statuses = (pvc.get("status") or {}).get("allocatedResourceStatuses") or {}
    return str(statuses.get("storage") or "").endswith("Infeasible")


def resize_pending(pvc: Object, fit: VolumeFit) -> bool:
    """Of the spec's class, already asked to grow to the spec's size (or more), not there yet
    and not refused: it waits for the resize instead of being drained and retired."""
    requested, usable = requested_bytes(pvc), usable_bytes(pvc)
    return (
        requested is not None
        and requested >= fit.size_bytes
        and usable is not None
        and usable < fit.size_bytes
        and class_fits(pvc, fit)
        and not resize_infeasible(pvc)
    )


def requested_class(pvc: Object) -> str | None:
    """The class the operator asked for (None: the cluster default); older PVCs: their class."""
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    if STORAGE_CLASS_ANNOTATION in annotations:
        return str(annotations[STORAGE_CLASS_ANNOTATION]) or None
    name = _pvc_spec(pvc).get("storageClassName")
    return str(name) if name else None


def class_fits(pvc: Object, fit: VolumeFit) -> bool:
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    if STORAGE_CLASS_ANNOTATION not in annotations and fit.storage_class is None:
        return True  # made before classes were recorded, for the default: nothing says otherwise
    return requested_class(pvc) == fit.storage_class


def fits(pvc: Object, fit: VolumeFit) -> bool:
    """Big enough (the size it has: ``usable_bytes``) and of the spec's class: may be handed
    to a new pod. A PVC without a size (never made by the operator) is taken as it is.
    """
    size = usable_bytes(pvc)
    return class_fits(pvc, fit) and (size is None or size >= fit.size_bytes)


def classes_to_check(pvcs: Iterable[Object], fit: VolumeFit) -> set[str]:
    """The StorageClasses whose allowVolumeExpansion the pool must read for this fit."""
    names = set()
    for pvc in pvcs:
        size = requested_bytes(pvc)
        actual = _pvc_spec(pvc).get("storageClassName")
        if size is not None and size < fit.size_bytes and class_fits(pvc, fit) and actual:
            names.add(str(actual))
    return names


def can_expand(pvc: Object, fit: VolumeFit) -> bool:
    """Asked for less than the spec's size, of the right class, and its class allows
    expansion (not refused before). Once asked, it is not asked again (resize_pending)."""
    size = requested_bytes(pvc)
    actual = _pvc_spec(pvc).get("storageClassName")
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    return (
        size is not None
        and size < fit.size_bytes
        and class_fits(pvc, fit)
        and str(actual or "") in fit.expandable_classes
        and annotations.get(EXPANSION_REFUSED_ANNOTATION) != fit.size_quantity
    )


def expansion_patch(fit: VolumeFit) -> dict[str, Any]:
    """Merge patch growing a PVC to the spec's size (the API server refuses shrinking)."""
    return {"spec": {"resources": {"requests": {"storage": fit.size_quantity}}}}


def expansion_refused_patch(fit: VolumeFit) -> dict[str, Any]:
    """Marks that growing to this size was refused, so the volume is retired instead."""
    return {"metadata": {"annotations": {EXPANSION_REFUSED_ANNOTATION: fit.size_quantity}}}


def allows_expansion(storage_class: Object | None) -> bool:
    return bool(storage_class and storage_class.get("allowVolumeExpansion") is True)
