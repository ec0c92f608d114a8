"""After a spec change only volumes that fit go to new pods; the others grow or retire.

Defect: ``choose_volume`` ignored size and storage class, so after raising the throughput new
pods got the old 6Gi claim while their agent was told 18.5 GiB.
"""

from __future__ import annotations

from typing import Any

from durable_producer.operator.decide import handout, manifests, volume_fit
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.decide.volume_fit import VolumeFit
from durable_producer.operator.model.installation import PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import GIB
from support.times import NOW, ago

POLICY = PoolPolicy(claim_grace_seconds=60, drain_grace_seconds=30, idle_ttl_seconds=300)
FIT = VolumeFit(size_bytes=18 * GIB, storage_class="fast", expandable_classes=frozenset({"fast"}))
PRODUCER = {"metadata": {"name": "orders", "namespace": "shop", "uid": "dp-uid"}}


def pvc(name: str, size: str, storage_class: str | None = "fast", *,
        backlog: str = "unknown", recorded: bool = True, **annotations: str) -> dict[str, Any]:
    notes = {vp.RELEASED_AT_ANNOTATION: ago(5), vp.BACKLOG_ANNOTATION: backlog, **annotations}
    if recorded:
        notes[volume_fit.STORAGE_CLASS_ANNOTATION] = storage_class or ""
    spec: dict[str, Any] = {"resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"metadata": {"name": name, "resourceVersion": "1", "annotations": notes,
                         "finalizers": [vp.VOLUME_FINALIZER]},
            "spec": spec, "status": {"phase": "Bound"}}


def test_only_volumes_that_fit_size_and_class_are_handed_out() -> None:
    volumes = [pvc("old-6gi", "6Gi"), pvc("other-class", "18Gi", "slow"),
               pvc("bigger", "20Gi"), pvc("exact", "18Gi")]

    chosen = handout.choose_volume(volumes, [], NOW, POLICY, fit=FIT)
    without_fitting = handout.choose_volume(volumes[:2], [], NOW, POLICY, fit=FIT)

    assert chosen is not None and chosen["metadata"]["name"] == "bigger"
    assert without_fitting is None  # a new volume of the right size is created instead


def test_the_cluster_default_class_is_told_apart_from_a_named_one() -> None:
    default_fit = VolumeFit(size_bytes=6 * GIB)
    made_for_default = pvc("default", "6Gi", None)
    made_for_default["spec"]["storageClassName"] = "standard"  # filled in by the API server
    made_for_fast = pvc("fast", "6Gi", "fast")
    made_before_classes_were_recorded = pvc("legacy", "6Gi", "standard", recorded=False)

    assert volume_fit.fits(made_for_default, default_fit)
    assert not volume_fit.fits(made_for_fast, default_fit)
    assert volume_fit.fits(made_before_classes_were_recorded, default_fit)
    assert not volume_fit.fits(made_for_default, FIT)


def test_a_too_small_free_volume_with_backlog_grows_when_its_class_allows_it() -> None:
    plan = vp.plan_pool([pvc("small", "6Gi")], [], [], NOW, POLICY, fit=FIT)

    assert plan.volumes_to_expand == ["small"]
    assert not plan.jobs_to_create and not plan.volumes_to_delete
    assert volume_fit.expansion_patch(FIT) == {
        "spec": {"resources": {"requests": {"storage": "18Gi"}}}}
    assert volume_fit.classes_to_check([pvc("small", "6Gi"), pvc("ok", "18Gi")], FIT) == {"fast"}


def test_a_too_small_volume_that_cannot_grow_is_drained_at_once_then_deleted() -> None:
    fixed = VolumeFit(size_bytes=18 * GIB, storage_class="fast")  # no allowVolumeExpansion
    released_now = pvc("small", "6Gi", released_at=ago(0))

    draining = vp.plan_pool([released_now], [], [], NOW, POLICY, fit=fixed)
    drained = vp.plan_pool([pvc("small", "6Gi", backlog="empty")], [], [], NOW, POLICY, fit=fixed)

    assert draining.jobs_to_create == ["small"]  # no grace: no new pod may claim it
    assert drained.volumes_to_delete == ["small"]  # no idle TTL: no new pod may use it


def test_a_refused_expansion_retires_the_volume_instead() -> None:
    refused = pvc("small", "6Gi", **{volume_fit.EXPANSION_REFUSED_ANNOTATION: "18Gi"})

    plan = vp.plan_pool([refused], [], [], NOW, POLICY, fit=FIT)

    assert not plan.volumes_to_expand
    assert plan.jobs_to_create == ["small"]


def test_a_volume_in_use_is_never_grown_or_retired_while_its_pod_runs() -> None:
    used = pvc("small", "6Gi", **{vp.CLAIM_TOKEN_ANNOTATION: "t", vp.CLAIMED_AT_ANNOTATION:
                                   ago(600)})
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Running"},
           "spec": {"volumes": [{"name": "durable-buffer",
                                 "persistentVolumeClaim": {"claimName": "small"}}]}}

    plan = vp.plan_pool([used], [pod], [], NOW, POLICY, fit=FIT)

    assert not (plan.volumes_to_expand or plan.jobs_to_create or plan.volumes_to_delete)
    assert plan.counts["InUse"] == 1
    (summary,) = plan.volumes
    assert (summary.size_bytes, summary.storage_class, summary.fits) == (6 * GIB, "fast", False)


def test_new_volumes_record_the_class_asked_for() -> None:
    spec = DurableProducerSpec.model_validate({"kafka": {"bootstrapServers": ["k:9092"]},
                                               "throughput": {"peakBytesPerSecond": 1}})

    manifest = manifests.new_volume_manifest(PRODUCER, spec, "orders-buffer-1", "tok", NOW)

    assert manifest["metadata"]["annotations"][volume_fit.STORAGE_CLASS_ANNOTATION] == ""
    assert "storageClassName" not in manifest["spec"]
    assert volume_fit.fits(manifest, VolumeFit.from_spec(spec))


# Review D10: an expansion counted as done once requested.


def resized(name: str, requested: str, capacity: str, **status: Any) -> dict[str, Any]:
    """A bound volume asked to grow to ``requested`` that has ``capacity`` so far."""
    volume = pvc(name, requested)
    volume["status"] = {"phase": "Bound", "capacity": {"storage": capacity}, **status}
    return volume


def test_a_volume_asked_to_grow_counts_at_the_size_it_has() -> None:
    """fits() read spec.resources.requests: a pending or refused expansion was handed out as
    done, its agent told a WAL limit the disk could not hold."""
    pending = resized("pending", "18Gi", "6Gi",
                      conditions=[{"type": "Resizing", "status": "True"}])
    refused = resized("refused", "18Gi", "6Gi",
                      allocatedResourceStatuses={"storage": "ControllerResizeInfeasible"})
    filesystem_left = [{"type": "FileSystemResizePending", "status": "True"}]
    only_the_filesystem = resized("fs", "18Gi", "6Gi", conditions=filesystem_left)
    done = resized("done", "18Gi", "18Gi")
    unbound = pvc("unbound", "18Gi")

    assert [volume_fit.usable_bytes(v) for v in (pending, refused, only_the_filesystem, done,
                                                  unbound)] == [6 * GIB, 6 * GIB, *[18 * GIB] * 3]
    assert not volume_fit.fits(pending, FIT) and not volume_fit.fits(refused, FIT)
    assert volume_fit.fits(only_the_filesystem, FIT)  # the kubelet grows it at the next mount
    assert handout.choose_volume([pending, refused], [], NOW, POLICY, fit=FIT) is None
    chosen = handout.choose_volume([pending, done], [], NOW, POLICY, fit=FIT)
    assert chosen is not None and chosen["metadata"]["name"] == "done"


def test_a_volume_waiting_for_its_resize_is_not_asked_again_nor_retired_at_once() -> None:
    pending = resized("pending", "18Gi", "6Gi")
    refused = resized("refused", "18Gi", "6Gi",
                      allocatedResourceStatuses={"storage": "NodeResizeInfeasible"})

    plan = vp.plan_pool([pending, refused], [], [], NOW, POLICY, fit=FIT)

    assert plan.volumes_to_expand == []
    assert plan.jobs_to_create == ["refused"]  # the storage cannot: drained and retired now
    assert volume_fit.resize_pending(pending, FIT) and not volume_fit.resize_pending(refused, FIT)
    later = resized("pending", "18Gi", "6Gi")
    later["metadata"]["annotations"][vp.RELEASED_AT_ANNOTATION] = ago(POLICY.drain_grace_seconds)
    assert vp.plan_pool([later], [], [], NOW, POLICY, fit=FIT).jobs_to_create == ["pending"]


def test_the_status_shows_the_size_volumes_have_and_the_runway_it_buys() -> None:
    in_use = resized("in-use", "18Gi", "6Gi")
    pod = {"metadata": {"name": "p", "uid": "u"}, "status": {"phase": "Running"},
           "spec": {"volumes": [{"name": "durable-buffer",
                                 "persistentVolumeClaim": {"claimName": "in-use"}}]}}

    plan = vp.plan_pool([in_use], [pod], [], NOW, POLICY, fit=FIT)

    assert [(v.name, v.size_bytes, v.fits) for v in plan.volumes] == [("in-use", 6 * GIB, False)]
