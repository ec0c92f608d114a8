"""What the pool timer and the delete handler publish, and volumes held because of backlog.

Defects: namespace deletion lost unforwarded data (the PVCs went with the namespace, the
finalizer let go); ``backlogBytes`` stayed stale when no agent answered; the pool's Degraded
condition had no observedGeneration; the status said nothing of the sizes deployed.
"""

from __future__ import annotations

from typing import Any

from durable_producer.operator.decide import pool_status
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.model.conditions import MAX_CONDITION_MESSAGE, capped_message
from durable_producer.operator.model.installation import PoolPolicy
from durable_producer.operator.model.quantities import GIB
from support.times import NOW, ago

POLICY = PoolPolicy(claim_grace_seconds=60, drain_grace_seconds=30, idle_ttl_seconds=300)
SPEC = {"kafka": {"bootstrapServers": ["kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 5 * 2**20}}  # 23Gi for the default hour


def pvc(name: str, *, backlog: str = "unknown", deleted: bool = False, size: str = "23Gi",
        finalizers: tuple[str, ...] = (vp.VOLUME_FINALIZER,), **annotations: str) -> dict:
    metadata: dict[str, Any] = {
        "name": name, "resourceVersion": "7", "finalizers": list(finalizers),
        "annotations": {vp.RELEASED_AT_ANNOTATION: ago(100), vp.BACKLOG_ANNOTATION: backlog,
                        **annotations}}
    if deleted:
        metadata["deletionTimestamp"] = ago(1)
    return {"metadata": metadata, "spec": {"resources": {"requests": {"storage": size}}},
            "status": {"phase": "Bound"}}


def running_pod(name: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Running"},
            "spec": {"initContainers": [{"name": "durable-agent", "restartPolicy": "Always"}],
                     "volumes": [{"name": "durable-buffer",
                                  "persistentVolumeClaim": {"claimName": claim}}]}}


READY = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
         "observedGeneration": 4}


def producer(status: dict[str, Any] | None = None, **annotations: str) -> dict[str, Any]:
    """A DurableProducer whose generation 4 the reconcile handler has written (the pool
    timer writes conditions only then), with ``status`` on top."""
    return {"metadata": {"name": "orders", "namespace": "shop", "generation": 4,
                         "annotations": annotations},
            "spec": SPEC,
            "status": {"observedGeneration": 4, "conditions": [READY], **(status or {})}}


# Defect 8: a volume that may hold backlog is never let go undrained, unless abandoned.


def test_a_deleted_volume_with_possible_backlog_is_held_not_released() -> None:
    plan = vp.plan_pool([pvc("v", deleted=True)], [], [], NOW, POLICY)

    assert plan.held == ["v"]
    assert not plan.releases and not plan.jobs_to_create  # a deleted PVC cannot be mounted
    (problem,) = pool_status.pool_problems(plan, [])
    assert "v" in problem and vp.ABANDON_ANNOTATION in problem and "runbook" in problem


def test_a_deleted_volume_known_empty_or_abandoned_is_released() -> None:
    empty = vp.plan_pool([pvc("v", backlog="empty", deleted=True)], [], [], NOW, POLICY)
    abandoned = vp.plan_pool([pvc("v", deleted=True)], [], [], NOW, POLICY, abandon=True)

    for plan in (empty, abandoned):
        (release,) = plan.releases
        assert release.patch == {"metadata": {"resourceVersion": "7", "finalizers": []}}
        assert not plan.held


def test_a_deleted_volume_still_mounted_or_being_drained_is_waited_for() -> None:
    draining = pvc("d", deleted=True, **{vp.DRAIN_JOB_ANNOTATION: "d-drain"})
    job = {"metadata": {"name": "d-drain"}, "status": {"active": 1}}

    plan = vp.plan_pool([pvc("u", deleted=True), draining], [running_pod("p", "u")], [job],
                        NOW, POLICY)

    assert plan.idle and not plan.held


def test_abandoning_lets_a_deleted_producer_go_without_drains() -> None:
    plan = vp.plan_pool([pvc("v")], [], [], NOW, POLICY, deleting=True, abandon=True)

    assert plan.volumes_to_delete == ["v"] and not plan.jobs_to_create
    assert any("abandoned" in problem for problem in plan.problems)
    kept = vp.plan_pool([pvc("v")], [], [], NOW, POLICY, deleting=False, abandon=True)
    assert not kept.volumes_to_delete  # on a live DurableProducer the annotation does nothing


def test_volumes_made_before_the_finalizer_get_it() -> None:
    plan = vp.plan_pool([pvc("v", finalizers=("kubernetes.io/pvc-protection",))], [], [], NOW,
                        POLICY)

    (patch,) = plan.patches
    assert patch.patch["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection",
                                                     vp.VOLUME_FINALIZER]
    assert patch.patch["metadata"]["resourceVersion"] == "7"


def test_deleting_status_says_why_the_deletion_waits_and_the_way_out() -> None:
    plan = vp.plan_pool([pvc("v", deleted=True)], [], [], NOW, POLICY, deleting=True)
    plan.problems.append("cannot create drain Job for volume w, which may hold data not yet"
                         " forwarded to Kafka: HTTP 403 Forbidden: namespace is being terminated")

    update = pool_status.deleting_status(producer(), plan, ["v"], NOW)

    ready, condition = update.changes["conditions"]
    assert ready == READY, "the other conditions are kept"
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Deleting", "True", "BacklogHeld")
    assert condition["observedGeneration"] == 4
    assert "being terminated" in condition["message"]
    assert f"{vp.ABANDON_ANNOTATION}=true" in condition["message"] == update.message
    again = pool_status.deleting_status(producer({"conditions": [condition]}), plan, ["v"], NOW)
    assert again.changes == {}  # nothing new: no patch

    waiting = vp.plan_pool([pvc("v")], [running_pod("p", "v")], [], NOW, POLICY, deleting=True)
    plain = pool_status.deleting_status(producer(), waiting, ["v"], NOW)
    assert plain.changes["conditions"][1]["reason"] == "DrainingVolumes"


# Defect 10: stale backlog, Degraded without observedGeneration.


def test_backlog_is_removed_when_no_agent_answers() -> None:
    plan = vp.plan_pool([], [], [], NOW, POLICY)

    stale = pool_status.pool_status_update(producer({"backlogBytes": 4321}), plan, [], None, NOW)
    fresh = pool_status.pool_status_update(producer({"backlogBytes": 4321}), plan, [], 7, NOW)

    assert "backlogBytes" in stale.changes and stale.changes["backlogBytes"] is None
    assert fresh.changes["backlogBytes"] == 7


def test_the_pool_degraded_condition_carries_the_generation() -> None:
    plan = vp.plan_pool([], [], [], NOW, POLICY)
    plan.problems.append("drain Job v-drain for volume v failed (1 time(s))")

    update = pool_status.pool_status_update(producer(), plan, [], None, NOW)

    degraded = next(c for c in update.changes["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "VolumePoolProblem"
    assert degraded["observedGeneration"] == 4


# Defect 2: what is deployed, and the runway of the smallest volume in use.


def test_status_shows_sizes_by_state_and_the_runway_of_the_smallest_volume_in_use() -> None:
    fit = VolumeFit(size_bytes=23 * GIB)
    volumes = [pvc("old", size="6Gi"), pvc("new", size="23Gi"), pvc("spare", size="6Gi",
                                                                     backlog="empty")]
    pods = [running_pod("a", "old"), running_pod("b", "new")]
    plan = vp.plan_pool(volumes, pods, [], NOW, POLICY, fit=fit)

    update = pool_status.pool_status_update(producer({"runwaySeconds": 3640}), plan, pods, 0, NOW)

    assert update.changes["deployedVolumes"] == [
        {"size": "6Gi", "fitsSpec": False, "inUse": 1, "claimed": 0, "free": 1, "draining": 0},
        {"size": "23Gi", "fitsSpec": True, "inUse": 1, "claimed": 0, "free": 0, "draining": 0},
    ]
    assert 800 < update.changes["runwaySeconds"] < 1000  # 6Gi at 5 MiB/s, not 3640
    degraded = next(c for c in update.changes["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "VolumesBelowSpec" and "6Gi" in degraded["message"]
    assert update.warnings == []  # Warning events with reason VolumePoolProblem only
    assert plan.volumes_to_delete == ["spare"]  # empty and too small: not kept for reuse

    # Once the old pod is gone and its volume retired, Degraded goes back to what it was.
    later = producer({"runwaySeconds": update.changes["runwaySeconds"],
                      "conditions": update.changes["conditions"]})
    plan = vp.plan_pool([pvc("new", size="23Gi")], pods[1:], [], NOW, POLICY, fit=fit)
    cleared = pool_status.pool_status_update(later, plan, pods[1:], 0, NOW)
    assert cleared.changes["runwaySeconds"] == 3640
    degraded = next(c for c in cleared.changes["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")


def test_a_degraded_message_longer_than_the_crd_allows_is_capped_and_then_left_alone() -> None:
    """D7: pool problems of hundreds of volumes made a message over the CRD's 32,768
    characters; the API server refused the whole status write (422) and status froze."""
    problems = [f"volume orders-buffer-{index:08x} cannot be drained: its drain Job failed"
                for index in range(1000)]

    first = pool_status.degraded_conditions([], [], problems, "VolumePoolProblem", NOW)

    assert first is not None
    (degraded,) = first
    assert len(degraded["message"]) == MAX_CONDITION_MESSAGE
    assert degraded["message"].startswith(problems[0])
    assert degraded["message"].endswith("the rest is in the operator's log)")
    # The next run sees the same problems: nothing to write.
    assert pool_status.degraded_conditions(first, [], problems, "VolumePoolProblem", NOW) is None


def test_a_deleting_message_naming_thousands_of_volumes_is_capped_and_then_left_alone() -> None:
    """D7: the Deleting message joins every volume waited for. It was capped when written,
    but compared uncapped with what was stored, so every retry of the delete handler wrote
    the same condition again."""
    names = [f"orders-buffer-{index:08x}" for index in range(3000)]
    plan = vp.plan_pool([], [], [], NOW, POLICY, deleting=True)

    first = pool_status.deleting_status(producer(), plan, names, NOW)

    (deleting,) = [c for c in first.changes["conditions"] if c["type"] == "Deleting"]
    assert len(deleting["message"]) == MAX_CONDITION_MESSAGE
    assert deleting["message"].startswith("waiting for 3000 buffer volume(s)")
    again = pool_status.deleting_status(producer({"conditions": [deleting]}), plan, names, NOW)
    assert again.changes == {}


def test_every_condition_message_the_pool_writes_is_capped() -> None:
    """Held volumes, pods without an agent and stuck Pending volumes all join names into
    Degraded; whatever the mix, the message stays within the CRD's limit."""
    held = [pvc(f"orders-buffer-{index:08x}", deleted=True) for index in range(1500)]
    pods = [running_pod(f"pod-{index:06d}-without-an-agent", "none") for index in range(1500)]
    for pod in pods:
        pod["spec"]["initContainers"] = []
    plan = vp.plan_pool(held, pods, [], NOW, POLICY)

    update = pool_status.pool_status_update(producer(), plan, pods, None, NOW)

    for condition in update.changes["conditions"]:
        assert len(condition["message"]) <= MAX_CONDITION_MESSAGE, condition["type"]


def test_short_messages_are_kept_whole() -> None:
    assert capped_message("x" * MAX_CONDITION_MESSAGE) == "x" * MAX_CONDITION_MESSAGE
