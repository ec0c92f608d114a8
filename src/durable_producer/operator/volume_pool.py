"""Pure decisions about the pool of buffer volumes (PVCs) each DurableProducer owns.

The state of a volume lives in annotations on its PVC, so the operator can restart at any
time and pick up where it left off (see docs/volume-lifecycle.md for the state diagram):

- ``claim-token``/``claimed-at``: the webhook handed the volume to a pod being admitted.
  Claims are merge patches that carry the ``resourceVersion`` the claimer read, so the API
  server refuses (409) the second of two concurrent claims of the same volume.
- ``released-at``: since when no pod uses the volume.
- ``backlog``: ``empty`` or ``unknown``. A volume is only known to be empty when it was just
  created or a drain Job succeeded on it. The agent has no API access and a pod's volume
  cannot be read from the operator, so every volume a pod may have written to is treated as
  holding backlog: it is set to ``unknown`` at claim time, and a free volume with unknown
  backlog gets a drain Job after a grace period (unless a new pod claims it first and replays
  it). A drain of an empty volume costs one short Job; skipping a needed one would lose data.
- ``drain-job``: the drain Job currently working on the volume.

claims.py and pool_actions.py read PVCs, pods and Jobs, call these functions and carry out
the returned plan; manifests.py renders the PVCs and drain Jobs, pool_status.py turns what
was found into the DurableProducer's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from durable_producer.contract import GROUP
from durable_producer.operator import pod_mutation
from durable_producer.operator.kube_objects import Object, format_time, name_of, parse_time
from durable_producer.operator.settings import PoolPolicy

POOL_LABEL = f"{GROUP}/buffer-for"
DRAIN_VOLUME_LABEL = f"{GROUP}/drain-volume"
CLAIM_TOKEN_ANNOTATION = f"{GROUP}/claim-token"
CLAIMED_AT_ANNOTATION = f"{GROUP}/claimed-at"
RELEASED_AT_ANNOTATION = f"{GROUP}/released-at"
BACKLOG_ANNOTATION = f"{GROUP}/backlog"
DRAIN_JOB_ANNOTATION = f"{GROUP}/drain-job"
DRAIN_FAILURES_ANNOTATION = f"{GROUP}/drain-failures"

BACKLOG_EMPTY = "empty"
BACKLOG_UNKNOWN = "unknown"

VOLUME_NAME_PREFIX_LENGTH = 40
FINISHED_POD_PHASES = frozenset({"Succeeded", "Failed"})

class VolumeState(StrEnum):
    IN_USE = "InUse"
    CLAIMED = "Claimed"
    FREE = "Free"
    DRAINING = "Draining"


def _annotations(obj: Object) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _seconds_since(text: str | None, now: datetime) -> float | None:
    moment = parse_time(text)
    return None if moment is None else (now - moment).total_seconds()


def volume_users(pods: Iterable[Object]) -> dict[str, list[str]]:
    """PVC name -> names of the not-yet-finished pods that mount it."""
    users: dict[str, list[str]] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in FINISHED_POD_PHASES:
            continue
        claim = pod_mutation.claimed_volume(pod)
        if claim:
            users.setdefault(claim, []).append(name_of(pod))
    return users


def volume_state(
    pvc: Object, users: Sequence[str], now: datetime, policy: PoolPolicy
) -> VolumeState:
    annotations = _annotations(pvc)
    if users:
        return VolumeState.IN_USE
    if annotations.get(DRAIN_JOB_ANNOTATION):
        return VolumeState.DRAINING
    claim_age = _seconds_since(annotations.get(CLAIMED_AT_ANNOTATION), now)
    if (
        annotations.get(CLAIM_TOKEN_ANNOTATION)
        and claim_age is not None
        and (claim_age < policy.claim_grace_seconds)
    ):
        return VolumeState.CLAIMED
    return VolumeState.FREE


def choose_volume(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    *,
    exclude: Iterable[str] = (),
) -> Object | None:
    """The free PVC to hand to a new pod, or None (then a new one is created).

    Volumes that may hold backlog go first: the new pod's agent replays them, which is what
    a drain Job would otherwise do. Ties are broken by name, so choices are reproducible.
    """
    users = volume_users(pods)
    skipped = set(exclude)
    free = [
        pvc
        for pvc in pvcs
        if name_of(pvc) not in skipped
        and (pvc.get("metadata") or {}).get("deletionTimestamp") is None
        and volume_state(pvc, users.get(name_of(pvc), []), now, policy) is VolumeState.FREE
    ]
    free.sort(
        key=lambda pvc: (_annotations(pvc).get(BACKLOG_ANNOTATION) == BACKLOG_EMPTY, name_of(pvc))
    )
    return free[0] if free else None


def claim_patch(pvc: Object, token: str, now: datetime) -> dict[str, Any]:
    """Merge patch claiming a PVC; guarded by the resourceVersion that was read.

    The pod may write to the volume from now on, so its backlog becomes unknown.
    """
    return {
        "metadata": {
            "resourceVersion": (pvc.get("metadata") or {}).get("resourceVersion"),
            "annotations": {
                CLAIM_TOKEN_ANNOTATION: token,
                CLAIMED_AT_ANNOTATION: format_time(now),
                RELEASED_AT_ANNOTATION: None,
                BACKLOG_ANNOTATION: BACKLOG_UNKNOWN,
            },
        }
    }


def claim_is_ours(pvc: Object, token: str) -> bool:
    """Read-after-write check that our claim, not a concurrent one, is on the PVC."""
    return _annotations(pvc).get(CLAIM_TOKEN_ANNOTATION) == token


def volume_name(producer: str, suffix: str) -> str:
    return f"{producer[:VOLUME_NAME_PREFIX_LENGTH].rstrip('-.')}-buffer-{suffix}"


def drain_job_name(pvc_name: str) -> str:
    return f"{pvc_name}-drain"


def job_outcome(job: Object) -> str:
    """'succeeded', 'failed' or 'running', from a Job's status."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return "succeeded" if condition["type"] == "Complete" else "failed"
    if (status.get("succeeded") or 0) >= 1:
        return "succeeded"
    backoff_limit = (job.get("spec") or {}).get("backoffLimit", 6)
    if (status.get("failed") or 0) > backoff_limit:
        return "failed"
    return "running"


@dataclass(frozen=True)
class VolumePatch:
    name: str
    patch: dict[str, Any]


@dataclass
class PoolPlan:
    """What the pool timer should do, and what it found."""

    patches: list[VolumePatch] = field(default_factory=list)
    jobs_to_create: list[str] = field(default_factory=list)  # PVC names
    jobs_to_delete: list[str] = field(default_factory=list)  # Job names
    volumes_to_delete: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return not (
            self.patches or self.jobs_to_create or self.jobs_to_delete or self.volumes_to_delete
        )


def _annotation_patch(pvc: Object, annotations: dict[str, Any]) -> VolumePatch:
    return VolumePatch(
        name_of(pvc),
        {
            "metadata": {
                "resourceVersion": (pvc.get("metadata") or {}).get("resourceVersion"),
                "annotations": annotations,
            }
        },
    )


def plan_pool(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    jobs: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    *,
    deleting: bool = False,
) -> PoolPlan:
    """Decide, for every pool volume, whether to release, drain, finish a drain or delete it.

    With ``deleting`` (the DurableProducer is being deleted) there is no grace period and no
    TTL: every free volume is drained if it may hold backlog, then deleted.
    """
    pods = list(pods)
    users = volume_users(pods)
    jobs_by_name = {name_of(job): job for job in jobs}
    plan = PoolPlan(counts={state.value: 0 for state in VolumeState})
    drain_grace = 0.0 if deleting else policy.drain_grace_seconds
    idle_ttl = 0.0 if deleting else policy.idle_ttl_seconds
    stamp = format_time(now)

    for pvc in pvcs:
        name = name_of(pvc)
        annotations = _annotations(pvc)
        state = volume_state(pvc, users.get(name, []), now, policy)
        plan.counts[state.value] += 1
        pending_for = _seconds_since((pvc.get("metadata") or {}).get("creationTimestamp"), now)
        if (
            (pvc.get("status") or {}).get("phase") == "Pending"
            and pending_for is not None
            and pending_for > policy.pending_volume_seconds
        ):
            plan.problems.append(
                f"PersistentVolumeClaim {name} is still Pending after"
                f" {int(pending_for)}s: check its StorageClass and events"
            )
        if state is VolumeState.IN_USE:
            if annotations.get(RELEASED_AT_ANNOTATION):
                plan.patches.append(_annotation_patch(pvc, {RELEASED_AT_ANNOTATION: None}))
            continue
        if state is VolumeState.CLAIMED:
            continue
        if state is VolumeState.DRAINING:
            _plan_draining(plan, pvc, jobs_by_name, stamp)
            continue
        released_for = _seconds_since(annotations.get(RELEASED_AT_ANNOTATION), now)
        updates: dict[str, Any] = {}
        if annotations.get(CLAIM_TOKEN_ANNOTATION) or released_for is None:
            # The pod that claimed it is gone (or never came): free from now on.
            updates = {
                CLAIM_TOKEN_ANNOTATION: None,
                CLAIMED_AT_ANNOTATION: None,
                RELEASED_AT_ANNOTATION: stamp,
            }
            released_for = 0.0
        if annotations.get(BACKLOG_ANNOTATION) != BACKLOG_EMPTY:
            if released_for >= drain_grace:
                plan.jobs_to_create.append(name)
                updates[DRAIN_JOB_ANNOTATION] = drain_job_name(name)
        elif released_for >= idle_ttl:
            plan.volumes_to_delete.append(name)
        if updates:
            plan.patches.append(_annotation_patch(pvc, updates))
    return plan


def _plan_draining(
    plan: PoolPlan, pvc: Object, jobs_by_name: Mapping[str, Object], stamp: str
) -> None:
    name = name_of(pvc)
    annotations = _annotations(pvc)
    job_name = str(annotations.get(DRAIN_JOB_ANNOTATION))
    job = jobs_by_name.get(job_name)
    if job is None:
        # Not created yet (the create follows the annotation) or removed by someone: retry.
        plan.jobs_to_create.append(name)
        return
    outcome = job_outcome(job)
    if outcome == "running":
        return
    plan.jobs_to_delete.append(job_name)
    if outcome == "succeeded":
        plan.patches.append(
            _annotation_patch(
                pvc,
                {
                    DRAIN_JOB_ANNOTATION: None,
                    BACKLOG_ANNOTATION: BACKLOG_EMPTY,
                    RELEASED_AT_ANNOTATION: stamp,
                    DRAIN_FAILURES_ANNOTATION: None,
                },
            )
        )
        return
    failures = int(annotations.get(DRAIN_FAILURES_ANNOTATION) or 0) + 1
    plan.problems.append(
        f"drain Job {job_name} for volume {name} failed ({failures} time(s)); it is retried"
        f" after the drain grace period: check the Job's logs and the Kafka connection"
    )
    plan.patches.append(
        _annotation_patch(
            pvc,
            {
                DRAIN_JOB_ANNOTATION: None,
                RELEASED_AT_ANNOTATION: stamp,
                DRAIN_FAILURES_ANNOTATION: str(failures),
            },
        )
    )
