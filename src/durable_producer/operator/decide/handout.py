"""Which pool volume a pod being admitted gets, and the claim that marks it (pure).

The webhook (claims.py) asks, in this order: a volume claimed for an earlier attempt to create
the same pod (``reusable_claim``: the pod was refused after the webhook, by a quota, Pod
Security or a later webhook, and its controller retries), else a free volume that fits the
spec (``choose_volume``), else it creates a new one. A claim (``claim_patch``) is a merge patch
guarded by the resourceVersion read, so of two concurrent claims of one volume the API server
refuses (409) the second.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from durable_producer.contract import CLAIM_TOKEN_ANNOTATION
from durable_producer.operator.decide import volume_fit
from durable_producer.operator.decide.kube_objects import (
    Object,
    annotations_of,
    format_time,
    name_of,
)
from durable_producer.operator.decide.pod_key import ClaimKey
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.decide.volume_pool import (
    BACKLOG_ANNOTATION,
    BACKLOG_EMPTY,
    BACKLOG_UNKNOWN,
    CLAIM_KEY_ANNOTATION,
    CLAIMED_AT_ANNOTATION,
    DRAIN_FAILURES_ANNOTATION,
    PLACEMENT_ANNOTATION,
    RELEASED_AT_ANNOTATION,
    VolumeState,
    is_deleted,
    seconds_since,
    volume_state,
    volume_users,
)
from durable_producer.operator.model.installation import PoolPolicy

CLAIM_SETTLE_SECONDS = 10.0
"""A claim made for a generated pod name is reused only this long after it was made: before,
it may belong to a sibling pod (same controller, same generateName) whose admission is still
under way after the webhook answered; a refused pod's retry comes after the refusal."""


def _candidates(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    state: VolumeState,
    fit: VolumeFit | None,
    exclude: Iterable[str],
) -> list[Object]:
    users = volume_users(pods)
    skipped = set(exclude)
    return [
        pvc
        for pvc in pvcs
        if name_of(pvc) not in skipped
        and not is_deleted(pvc)
        and (fit is None or volume_fit.fits(pvc, fit))
        and volume_state(pvc, users.get(name_of(pvc), []), now, policy) is state
    ]


def free_volumes(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    *,
    exclude: Iterable[str] = (),
    fit: VolumeFit | None = None,
) -> list[Object]:
    """The free PVCs that fit the spec, best first, to hand to a new pod.

    Volumes that may hold backlog go first: the new pod's agent replays them, which is what
    a drain Job would otherwise do. Ties are broken by name, so choices are reproducible.
    The webhook takes the first whose PersistentVolume may be attached where the pod may run
    (volume_topology.py).
    """
    free = _candidates(pvcs, pods, now, policy, VolumeState.FREE, fit, exclude)
    free.sort(
        key=lambda pvc: (annotations_of(pvc).get(BACKLOG_ANNOTATION) == BACKLOG_EMPTY, name_of(pvc))
    )
    return free


def choose_volume(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    *,
    exclude: Iterable[str] = (),
    fit: VolumeFit | None = None,
) -> Object | None:
    """The first of ``free_volumes``, or None (then one is created)."""
    free = free_volumes(pvcs, pods, now, policy, exclude=exclude, fit=fit)
    return free[0] if free else None


def reusable_claim(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    key: ClaimKey,
    now: datetime,
    policy: PoolPolicy,
    *,
    exclude: Iterable[str] = (),
    fit: VolumeFit | None = None,
) -> Object | None:
    """A volume claimed for an earlier attempt to create the same pod, that no pod mounts.

    The earlier pod was refused after the webhook (a quota, Pod Security, a later webhook):
    its retry takes the same volume instead of a new one. For a generated name the claim must
    be CLAIM_SETTLE_SECONDS old, so a sibling being admitted at the same moment keeps its own.
    """
    claimed = _candidates(pvcs, pods, now, policy, VolumeState.CLAIMED, fit, exclude)
    reusable = [
        pvc
        for pvc in claimed
        if annotations_of(pvc).get(CLAIM_KEY_ANNOTATION) == key.value
        and (
            key.one_pod
            or (seconds_since(annotations_of(pvc).get(CLAIMED_AT_ANNOTATION), now) or 0.0)
            >= CLAIM_SETTLE_SECONDS
        )
    ]
    reusable.sort(key=name_of)
    return reusable[0] if reusable else None


def claim_patch(
    pvc: Object,
    token: str,
    now: datetime,
    key: ClaimKey | None = None,
    placement: str | None = None,
) -> dict[str, Any]:
    """Merge patch claiming a PVC; guarded by the resourceVersion that was read.

    The pod may write to the volume from now on, so its backlog becomes unknown; its agent
    forwards what earlier drains could not, so their failures no longer delay the next drain.
    """
    annotations: dict[str, Any] = {
        CLAIM_TOKEN_ANNOTATION: token,
        CLAIMED_AT_ANNOTATION: format_time(now),
        RELEASED_AT_ANNOTATION: None,
        BACKLOG_ANNOTATION: BACKLOG_UNKNOWN,
        DRAIN_FAILURES_ANNOTATION: None,
        PLACEMENT_ANNOTATION: placement,  # drain_placement.recorded; None clears an old one
    }
    if key is not None:
        annotations[CLAIM_KEY_ANNOTATION] = key.value
    return {
        "metadata": {
            "resourceVersion": (pvc.get("metadata") or {}).get("resourceVersion"),
            "annotations": annotations,
        }
    }


def claim_is_ours(pvc: Object, token: str) -> bool:
    """Read-after-write check that our claim, not a concurrent one, is on the PVC."""
    return annotations_of(pvc).get(CLAIM_TOKEN_ANNOTATION) == token
