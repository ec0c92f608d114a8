"""Pure decisions about the pool of buffer volumes (PVCs) each DurableProducer owns.

The state of a volume lives on its PVC, so the operator can restart at any time and pick up
where it left off (docs/volume-lifecycle.md has the state diagram):

- ``claim-token``/``claimed-at``/``claim-key``: the webhook handed the volume to a pod being
  admitted (handout.py); the key names the pod, so a retry of a refused pod reuses the claim.
- ``released-at``: since when no pod uses the volume.
- ``backlog``: ``empty`` or ``unknown``. A volume is only known to be empty when it was just
  created, a drain Job succeeded on it, or it was never bound (a PVC still ``Pending`` has no
  storage behind it). The agent has no API access and the operator cannot read a volume, so
  every volume a pod may have written to is treated as holding backlog: ``unknown`` from the
  claim on, and a free volume with unknown backlog gets a drain Job after a grace period
  (unless a new pod claims it first and replays it). A drain of an empty volume costs one
  short Job; skipping a needed one would lose data.
- ``drain-job``: the drain Job currently working on the volume, and ``drain-request``: the
  one drain request that Job must answer (the PVC's resourceVersion when the drain was asked
  for; the Job carries it as a label). A Job is known by that token, not by its name, as the
  Job controller knows its pods by ``controller-uid``: a Job of the same name left from an
  earlier drain (its delete failed, or another replica created it after a claim) is stale, is
  deleted and never taken as proof that the volume is empty (review D1, data loss).
- the finalizer ``buffer-protection``: a pool volume goes only when the operator lets it, once
  it is known empty or its backlog was abandoned on purpose (``ABANDON_ANNOTATION``); deleting
  it otherwise (a namespace deletion, ``kubectl delete pvc``) leaves it held, and says so.

Pool volumes are found by their label (``contract.POOL_LABEL``), never by an owner reference: they
carry none (manifests.py, D2), and the pool removes the one older versions set
(``producer_owned``), so that the garbage collector never deletes a volume before its drain.

Only volumes that fit the spec (volume_fit.py: size and storage class) go to new pods; free
ones that do not are grown, or drained and deleted. pool_actions.py carries out the plan,
pool_status.py turns what was found into the DurableProducer's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from durable_producer.contract import CLAIM_TOKEN_ANNOTATION, GROUP, KIND
from durable_producer.operator.decide import agent_start, pod_mutation, volume_fit
from durable_producer.operator.decide.kube_objects import (
    FINISHED_POD_PHASES,
    Object,
    annotations_of,
    format_time,
    name_of,
    parse_time,
)
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.model.installation import PoolPolicy

DRAIN_VOLUME_LABEL = f"{GROUP}/drain-volume"
CLAIMED_AT_ANNOTATION = f"{GROUP}/claimed-at"
RELEASED_TOKEN_ANNOTATION = f"{GROUP}/released-claim-token"
"""The claim token the volume was last released from (clean_shutdown.py)."""
CLAIM_KEY_ANNOTATION = f"{GROUP}/claim-key"
RELEASED_AT_ANNOTATION = f"{GROUP}/released-at"
BACKLOG_ANNOTATION = f"{GROUP}/backlog"
DRAIN_JOB_ANNOTATION = f"{GROUP}/drain-job"
DRAIN_REQUEST_ANNOTATION = f"{GROUP}/drain-request"
DRAIN_REQUEST_LABEL = DRAIN_REQUEST_ANNOTATION  # the same token on the Job
DRAIN_FAILURES_ANNOTATION = f"{GROUP}/drain-failures"
PLACEMENT_ANNOTATION = f"{GROUP}/drain-placement"
"""The claiming pod's tolerations, nodeSelector and node affinity, for drain Jobs (JSON)."""
VOLUME_FINALIZER = f"{GROUP}/buffer-protection"
ABANDON_ANNOTATION = f"{GROUP}/abandon-backlog"
"""On a DurableProducer, ``"true"``: let volumes go without draining them (see docs)."""

BACKLOG_EMPTY = "empty"
BACKLOG_UNKNOWN = "unknown"

VOLUME_NAME_PREFIX_LENGTH = 40


class VolumeState(StrEnum):
    IN_USE = "InUse"
    CLAIMED = "Claimed"
    FREE = "Free"
    DRAINING = "Draining"


def seconds_since(text: str | None, now: datetime) -> float | None:
    moment = parse_time(text)
    return None if moment is None else (now - moment).total_seconds()


def is_deleted(obj: Object) -> bool:
    return (obj.get("metadata") or {}).get("deletionTimestamp") is not None


def never_written(pvc: Object) -> bool:
    """A PVC still Pending was never bound to storage: nothing can have been written to it."""
    return (pvc.get("status") or {}).get("phase") == "Pending"


def backlog_abandoned(producer: Object) -> bool:
    return str(annotations_of(producer).get(ABANDON_ANNOTATION, "")).lower() == "true"


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
    annotations = annotations_of(pvc)
    if users:
        return VolumeState.IN_USE
    if annotations.get(DRAIN_JOB_ANNOTATION):
        return VolumeState.DRAINING
    claim_age = seconds_since(annotations.get(CLAIMED_AT_ANNOTATION), now)
    if (
        annotations.get(CLAIM_TOKEN_ANNOTATION)
        and claim_age is not None
        and (claim_age < policy.claim_grace_seconds)
    ):
        return VolumeState.CLAIMED
    return VolumeState.FREE


def volume_name(producer: str, suffix: str) -> str:
    return f"{producer[:VOLUME_NAME_PREFIX_LENGTH].rstrip('-.')}-buffer-{suffix}"


def drain_job_name(pvc_name: str) -> str:
    return f"{pvc_name}-drain"


def drain_request_token(pvc: Object, stamp: str) -> str:
    """A new drain request's token: the PVC's resourceVersion (unique per state of the volume;
    the patch that records it is guarded by it), else the time's digits. A label value."""
    version = str((pvc.get("metadata") or {}).get("resourceVersion") or "")
    return version if version.isalnum() else "".join(c for c in stamp if c.isdigit())


def answers_drain_request(job: Object, pvc: Object) -> bool:
    """Whether ``job`` was created for the volume's current drain request (a volume drained
    before tokens existed has neither: accepted)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return labels.get(DRAIN_REQUEST_LABEL) == annotations_of(pvc).get(DRAIN_REQUEST_ANNOTATION)


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


def kept_dead_letters(job: Object) -> bool:
    """Whether a drain Job failed because dead letters are still on its volume (its pod
    exited DRAIN_KEPT_DEAD_LETTERS_EXIT: the Job's pod failure policy failed it at once)."""
    return any(
        condition.get("type") == "Failed"
        and condition.get("status") == "True"
        and condition.get("reason") == "PodFailurePolicy"
        for condition in (job.get("status") or {}).get("conditions") or []
    )


def release_patch(pvc: Object) -> dict[str, Any]:
    """Merge patch removing our finalizer (the API server may then remove the PVC)."""
    metadata = pvc.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "finalizers": [f for f in metadata.get("finalizers") or [] if f != VOLUME_FINALIZER],
        }
    }


@dataclass(frozen=True)
class VolumePatch:
    name: str
    patch: dict[str, Any]


@dataclass(frozen=True)
class VolumeSummary:
    """One volume as the status shows it."""

    name: str
    state: VolumeState
    size_bytes: int | None
    storage_class: str | None
    fits: bool


@dataclass
class PoolPlan:
    """What the pool timer should do, and what it found."""

    patches: list[VolumePatch] = field(default_factory=list)
    jobs_to_create: list[str] = field(default_factory=list)  # PVC names
    drain_requests: dict[str, str] = field(default_factory=dict)  # PVC name -> its Job's token
    jobs_to_delete: list[str] = field(default_factory=list)  # Job names
    volumes_to_delete: list[str] = field(default_factory=list)
    volumes_to_expand: list[str] = field(default_factory=list)
    releases: list[VolumePatch] = field(default_factory=list)  # finalizers to remove
    held: list[str] = field(default_factory=list)  # deleted, may hold backlog, not drainable
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    volumes: list[VolumeSummary] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (
            self.patches
            or self.jobs_to_create
            or self.jobs_to_delete
            or self.volumes_to_delete
            or self.volumes_to_expand
            or self.releases
        )


def producer_owned(pvc: Object) -> bool:
    """Whether a volume still carries the owner reference to its DurableProducer that
    versions before D2's fix set (the garbage collector would delete it first in a foreground
    or namespace deletion, before it can be drained)."""
    return any(
        isinstance(reference, Mapping) and reference.get("kind") == KIND
        for reference in (pvc.get("metadata") or {}).get("ownerReferences") or []
    )


def _patch(
    pvc: Object,
    annotations: dict[str, Any],
    *,
    protect: bool = False,
    disown: bool = False,
) -> VolumePatch:
    """One merge patch for one volume, guarded by the resourceVersion read; ``protect`` adds
    our finalizer (to a volume made before volumes carried it); ``disown`` removes the owner
    reference to the DurableProducer (set by older versions), keeping any other."""
    current = pvc.get("metadata") or {}
    metadata: dict[str, Any] = {"resourceVersion": current.get("resourceVersion")}
    if annotations:
        metadata["annotations"] = annotations
    if protect:
        metadata["finalizers"] = [*(current.get("finalizers") or []), VOLUME_FINALIZER]
    if disown:
        metadata["ownerReferences"] = [
            reference
            for reference in current.get("ownerReferences") or []
            if not (isinstance(reference, Mapping) and reference.get("kind") == KIND)
        ]
    return VolumePatch(name_of(pvc), {"metadata": metadata})


@dataclass(frozen=True)
class _Context:
    now: datetime
    policy: PoolPolicy
    deleting: bool
    abandon: bool
    fit: VolumeFit | None
    jobs: Mapping[str, Object]

    @property
    def stamp(self) -> str:
        return format_time(self.now)


def plan_pool(
    pvcs: Iterable[Object],
    pods: Iterable[Object],
    jobs: Iterable[Object],
    now: datetime,
    policy: PoolPolicy,
    *,
    deleting: bool = False,
    fit: VolumeFit | None = None,
    abandon: bool = False,
) -> PoolPlan:
    """Decide, for every pool volume, whether to release, drain, grow, finish a drain or delete.

    With ``deleting`` (the DurableProducer is being deleted) there is no grace period and no
    TTL: every free volume is drained if it may hold backlog, then deleted. ``abandon`` (the
    DurableProducer's ABANDON_ANNOTATION) lets volumes with backlog go undrained, but only
    while the DurableProducer or the volume is being deleted. ``fit`` None: every volume fits.
    """
    users = volume_users(list(pods))
    context = _Context(now, policy, deleting, abandon, fit, {name_of(j): j for j in jobs})
    plan = PoolPlan(counts={state.value: 0 for state in VolumeState})
    for pvc in pvcs:
        state = volume_state(pvc, users.get(name_of(pvc), []), now, policy)
        plan.counts[state.value] += 1
        fits = fit is None or volume_fit.fits(pvc, fit)
        plan.volumes.append(
            VolumeSummary(
                name_of(pvc),
                state,
                volume_fit.usable_bytes(pvc),
                volume_fit.requested_class(pvc),
                fits,
            )
        )
        _check_pending(plan, pvc, state, now, policy)
        if is_deleted(pvc):
            _plan_deleted(plan, pvc, state, context)
            continue
        updates = _plan_volume(plan, pvc, state, fits, context)
        if updates is None:
            continue  # deleted this run: the delete carries the resourceVersion read
        protect = VOLUME_FINALIZER not in ((pvc.get("metadata") or {}).get("finalizers") or [])
        disown = producer_owned(pvc)
        if updates or protect or disown:
            plan.patches.append(_patch(pvc, updates, protect=protect, disown=disown))
    stuck = agent_start.agents_not_starting(pods, now, policy.agent_start_grace_seconds)
    if stuck:
        plan.problems.append(agent_start.problem(stuck, policy.agent_start_grace_seconds))
    return plan


def _check_pending(
    plan: PoolPlan, pvc: Object, state: VolumeState, now: datetime, policy: PoolPolicy
) -> None:
    """A volume a pod waits for that stays Pending is a problem; an unused one is not (a
    WaitForFirstConsumer class binds only for a pod)."""
    pending_for = seconds_since((pvc.get("metadata") or {}).get("creationTimestamp"), now)
    if (
        state in (VolumeState.IN_USE, VolumeState.CLAIMED)
        and never_written(pvc)
        and pending_for is not None
        and pending_for > policy.pending_volume_seconds
    ):
        plan.problems.append(
            f"PersistentVolumeClaim {name_of(pvc)} is still Pending after"
            f" {int(pending_for)}s: check its StorageClass and events"
        )


def _plan_volume(
    plan: PoolPlan, pvc: Object, state: VolumeState, fits: bool, context: _Context
) -> dict[str, Any] | None:
    """The annotation updates for one volume not being deleted; None when it is deleted now."""
    annotations = annotations_of(pvc)
    if state is VolumeState.IN_USE:
        return {RELEASED_AT_ANNOTATION: None} if annotations.get(RELEASED_AT_ANNOTATION) else {}
    if state is VolumeState.CLAIMED:
        return {}
    if state is VolumeState.DRAINING:
        return _plan_draining(plan, pvc, context)
    return _plan_free(plan, pvc, fits, context)


def _plan_free(
    plan: PoolPlan, pvc: Object, fits: bool, context: _Context
) -> dict[str, Any] | None:
    name = name_of(pvc)
    annotations = annotations_of(pvc)
    released_for = seconds_since(annotations.get(RELEASED_AT_ANNOTATION), context.now)
    updates: dict[str, Any] = {}
    token = annotations.get(CLAIM_TOKEN_ANNOTATION)
    if token or released_for is None:
        # The pod that claimed it is gone (or never came): free from now on.
        updates = {
            CLAIM_TOKEN_ANNOTATION: None,
            CLAIMED_AT_ANNOTATION: None,
            CLAIM_KEY_ANNOTATION: None,
            RELEASED_AT_ANNOTATION: context.stamp,
        }
        if token:
            updates[RELEASED_TOKEN_ANNOTATION] = token  # its pod's shutdown record may follow
        released_for = 0.0
    empty = annotations.get(BACKLOG_ANNOTATION) == BACKLOG_EMPTY
    idle_ttl = 0.0 if context.deleting else context.policy.idle_ttl_seconds
    if never_written(pvc) or (empty and (not fits or released_for >= idle_ttl)):
        plan.volumes_to_delete.append(name)  # nothing on it: deleted, never drained
        return None
    if empty:
        return updates
    if context.deleting and context.abandon:
        plan.problems.append(f"volume {name} deleted without a drain: its backlog was abandoned")
        plan.volumes_to_delete.append(name)
        return None
    if not fits and context.fit is not None and volume_fit.can_expand(pvc, context.fit):
        plan.volumes_to_expand.append(name)  # it fits once grown; a new pod may replay it
        return updates
    # Asked to grow and not there yet: not handed out until it has grown (usually within
    # the drain grace, then a new pod replays it), drained after the grace as any other.
    growing = context.fit is not None and volume_fit.resize_pending(pvc, context.fit)
    urgent = context.deleting or not (fits or growing)
    failures = drain_failures(pvc)
    if released_for >= drain_delay(context.policy, failures, urgent=urgent):
        token = drain_request_token(pvc, context.stamp)
        plan.jobs_to_create.append(name)  # only once this patch is in (pool_actions)
        plan.drain_requests[name] = token
        updates[DRAIN_JOB_ANNOTATION] = drain_job_name(name)
        updates[DRAIN_REQUEST_ANNOTATION] = token
    return updates


def drain_failures(pvc: Object) -> int:
    """Drains of the volume that failed in a row (none since the last success)."""
    try:
        return max(0, int(annotations_of(pvc).get(DRAIN_FAILURES_ANNOTATION) or 0))
    except ValueError:
        return 0


def drain_delay(policy: PoolPolicy, failures: int, *, urgent: bool) -> float:
    """Seconds a free volume that may hold backlog waits after its release before a drain.

    The first drain waits the drain grace, for a new pod that would replay the volume (none
    when ``urgent``: its producer is being deleted, or the volume no longer fits its spec).
    After ``failures`` failed drains (Kafka down for hours, say) the wait doubles each time, up
    to ``drain_retry_max_seconds``: meanwhile the volume stays free, and a new pod takes it and
    replays the backlog instead of the pool growing by a volume per pod."""
    if failures <= 0:
        return 0.0 if urgent else policy.drain_grace_seconds
    doubled = max(policy.drain_grace_seconds, 1.0) * 2.0 ** min(failures - 1, 32)
    return min(doubled, policy.drain_retry_max_seconds)


def _plan_deleted(plan: PoolPlan, pvc: Object, state: VolumeState, context: _Context) -> None:
    """Someone deleted the volume: let it go once nothing can be lost, else hold it."""
    name = name_of(pvc)
    if state is VolumeState.IN_USE:
        return  # its pod still runs and forwards
    if state is VolumeState.DRAINING and str(annotations_of(pvc).get(DRAIN_JOB_ANNOTATION)) in (
        context.jobs
    ):
        # A drain that started before the delete: wait for it; the next run sees the outcome.
        updates = _plan_draining(plan, pvc, context)
        if updates:
            plan.patches.append(_patch(pvc, updates))
        return
    empty = annotations_of(pvc).get(BACKLOG_ANNOTATION) == BACKLOG_EMPTY
    if empty or never_written(pvc) or context.abandon:
        if VOLUME_FINALIZER in ((pvc.get("metadata") or {}).get("finalizers") or []):
            plan.releases.append(VolumePatch(name, release_patch(pvc)))
        return
    # A volume being deleted cannot be mounted any more, so no drain Job can read it.
    plan.held.append(name)


def _plan_draining(plan: PoolPlan, pvc: Object, context: _Context) -> dict[str, Any]:
    name = name_of(pvc)
    annotations = annotations_of(pvc)
    job_name = str(annotations.get(DRAIN_JOB_ANNOTATION))
    job = context.jobs.get(job_name)
    if job is None:
        # Not created yet (the create follows the annotation) or removed by someone: retry.
        plan.jobs_to_create.append(name)
        token = annotations.get(DRAIN_REQUEST_ANNOTATION)
        if token:
            plan.drain_requests[name] = str(token)
        return {}
    if not answers_drain_request(job, pvc):
        # A Job of this name from an earlier request: it proves nothing about the volume now.
        # Deleted; the next run creates the one for this request.
        plan.jobs_to_delete.append(job_name)
        return {}
    outcome = job_outcome(job)
    if outcome == "running":
        return {}
    plan.jobs_to_delete.append(job_name)
    if outcome == "succeeded":
        return {
            DRAIN_JOB_ANNOTATION: None,
            DRAIN_REQUEST_ANNOTATION: None,
            BACKLOG_ANNOTATION: BACKLOG_EMPTY,
            RELEASED_AT_ANNOTATION: context.stamp,
            DRAIN_FAILURES_ANNOTATION: None,
        }
    failures = drain_failures(pvc) + 1
    retry = drain_delay(context.policy, failures, urgent=False)
    if kept_dead_letters(job):
        plan.problems.append(
            f"volume {name} is not empty: its WAL reached Kafka but dead letters (records Kafka"
            f" refused for good) are on it (drain Job {job_name}, {failures} time(s)); it is"
            f" kept and drained again in {retry:.0f}s: re-send them or, if they are not wanted,"
            f" set {ABANDON_ANNOTATION}=true on the DurableProducer (runbook: Dead letters)"
        )
    else:
        plan.problems.append(
            f"drain Job {job_name} for volume {name} failed ({failures} time(s)); it is retried"
            f" in {retry:.0f}s (each failure doubles the wait): check the Job's logs and the"
            " Kafka connection"
        )
    return {
        DRAIN_JOB_ANNOTATION: None,
        DRAIN_REQUEST_ANNOTATION: None,
        RELEASED_AT_ANNOTATION: context.stamp,
        DRAIN_FAILURES_ANNOTATION: str(failures),
    }
