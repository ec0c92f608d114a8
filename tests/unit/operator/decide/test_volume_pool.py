"""Volume pool decisions: hand-out, optimistic claims, release, drain, reclaim, deletion."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from durable_producer import contract
from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.figures.metrics import PREFIX as METRICS_PREFIX
from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.contract import BACKLOG_METRIC, POOL_LABEL
from durable_producer.operator.act import agent_scrape
from durable_producer.operator.decide import (
    agent_figures,
    handout,
    manifests,
    pool_status,
    volume_fit,
)
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.decide.kube_objects import format_time
from durable_producer.operator.decide.sizing import SizingInputs, size_buffer
from durable_producer.operator.model.installation import AgentImage, PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.settings import POOL_ENV
from support.times import NOW, ago

POLICY = PoolPolicy(claim_grace_seconds=60, drain_grace_seconds=30, idle_ttl_seconds=300,
                    drain_timeout_seconds=120, pending_volume_seconds=120)
PRODUCER = {"apiVersion": "durable.dev/v1alpha1", "kind": "DurableProducer",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "dp-uid"}}


def make_spec(**overrides: Any) -> DurableProducerSpec:
    raw: dict[str, Any] = {"kafka": {"bootstrapServers": ["kafka:9092"]},
                           "throughput": {"peakBytesPerSecond": 2**20}}
    raw.update(overrides)
    return DurableProducerSpec.model_validate(raw)


def pvc(name: str, *, version: str = "1", **annotations: str | None) -> dict[str, Any]:
    keys = {"claim": vp.CLAIM_TOKEN_ANNOTATION, "claimed_at": vp.CLAIMED_AT_ANNOTATION,
            "released_at": vp.RELEASED_AT_ANNOTATION, "backlog": vp.BACKLOG_ANNOTATION,
            "drain_job": vp.DRAIN_JOB_ANNOTATION, "failures": vp.DRAIN_FAILURES_ANNOTATION,
            "request": vp.DRAIN_REQUEST_ANNOTATION}
    return {"metadata": {
        "name": name, "resourceVersion": version, "labels": {POOL_LABEL: "orders"},
        "annotations": {keys[k]: v for k, v in annotations.items() if v is not None},
        "creationTimestamp": ago(3600), "finalizers": [vp.VOLUME_FINALIZER],
    }}


def pod(name: str, claim: str | None, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app"}]}
    if claim:
        spec["volumes"] = [{"name": contract.BUFFER_VOLUME_NAME,
                            "persistentVolumeClaim": {"claimName": claim}}]
        spec["initContainers"] = [{"name": contract.AGENT_CONTAINER_NAME,
                                   "restartPolicy": "Always"}]
    return {"metadata": {"name": name, "labels": {contract.PRODUCER_LABEL: "orders"}},
            "spec": spec, "status": {"phase": phase}}


def job(name: str, request: str | None = None, **status: Any) -> dict[str, Any]:
    labels = {vp.DRAIN_REQUEST_LABEL: request} if request else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"backoffLimit": 2},
            "status": status}


def annotation_patch(plan: vp.PoolPlan, name: str) -> dict[str, Any]:
    (patch,) = [p for p in plan.patches if p.name == name]
    return patch.patch["metadata"]["annotations"]


# Hand-out


def test_free_volume_with_possible_backlog_is_handed_out_first() -> None:
    volumes = [pvc("a", released_at=ago(5), backlog="empty"),
               pvc("b", released_at=ago(5), backlog="unknown")]

    chosen = handout.choose_volume(volumes, [], NOW, POLICY)

    assert chosen is not None and chosen["metadata"]["name"] == "b"


def test_volumes_in_use_recently_claimed_draining_or_deleted_are_not_handed_out() -> None:
    deleted = pvc("deleted", released_at=ago(5))
    deleted["metadata"]["deletionTimestamp"] = ago(1)
    volumes = [
        pvc("used", claim="t1", claimed_at=ago(600)),
        pvc("claimed", claim="t2", claimed_at=ago(10)),
        pvc("draining", released_at=ago(100), drain_job="draining-drain"),
        deleted,
    ]

    assert handout.choose_volume(volumes, [pod("p", "used")], NOW, POLICY) is None


def test_claim_that_outlived_its_grace_without_a_pod_is_free_again() -> None:
    volumes = [pvc("stale", claim="t1", claimed_at=ago(61))]

    chosen = handout.choose_volume(volumes, [], NOW, POLICY)

    assert chosen is not None and chosen["metadata"]["name"] == "stale"


def test_finished_pods_do_not_hold_their_volume() -> None:
    volumes = [pvc("v", claim="t1", claimed_at=ago(600))]

    assert handout.choose_volume(volumes, [pod("done", "v", phase="Succeeded")], NOW, POLICY)


def test_claim_patch_is_guarded_by_the_resource_version_and_marks_backlog_unknown() -> None:
    patch = handout.claim_patch(pvc("v", version="42", backlog="empty"), "token-1", NOW)

    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["annotations"] == {
        vp.CLAIM_TOKEN_ANNOTATION: "token-1",
        vp.CLAIMED_AT_ANNOTATION: format_time(NOW),
        vp.RELEASED_AT_ANNOTATION: None,
        vp.BACKLOG_ANNOTATION: "unknown",
        vp.DRAIN_FAILURES_ANNOTATION: None,
        vp.PLACEMENT_ANNOTATION: None,
    }


class Conflict(Exception):
    pass


class VersionedStore:
    """The API server's optimistic concurrency for merge patches, nothing else."""

    def __init__(self, volumes: list[dict[str, Any]]) -> None:
        self.volumes = {v["metadata"]["name"]: copy.deepcopy(v) for v in volumes}

    def list(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.volumes.values()))

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        current = self.volumes[name]["metadata"]
        expected = patch["metadata"].get("resourceVersion")
        if expected is not None and expected != current["resourceVersion"]:
            raise Conflict(name)
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                current["annotations"].pop(key, None)
            else:
                current["annotations"][key] = value
        current["resourceVersion"] = str(int(current["resourceVersion"]) + 1)


def claim(store: VersionedStore, snapshot: list[dict[str, Any]], token: str) -> str | None:
    """The webhook's claim loop: on a conflict, re-read and try the next free volume."""
    excluded: set[str] = set()
    for _ in range(5):
        candidate = handout.choose_volume(snapshot, [], NOW, POLICY, exclude=excluded)
        if candidate is None:
            return None
        try:
            store.patch(candidate["metadata"]["name"], handout.claim_patch(candidate, token, NOW))
        except Conflict:
            excluded.add(candidate["metadata"]["name"])
            snapshot = store.list()
            continue
        return str(candidate["metadata"]["name"])
    return None


def test_two_claims_from_the_same_snapshot_never_share_a_volume() -> None:
    store = VersionedStore([pvc("a", released_at=ago(5)), pvc("b", released_at=ago(5))])
    snapshot = store.list()  # both webhook calls read before either writes

    first = claim(store, snapshot, "pod-1")
    second = claim(store, snapshot, "pod-2")

    assert {first, second} == {"a", "b"}
    owners = {name: v["metadata"]["annotations"][vp.CLAIM_TOKEN_ANNOTATION]
              for name, v in store.volumes.items()}
    assert sorted(owners.values()) == ["pod-1", "pod-2"]
    assert handout.claim_is_ours(store.volumes[first], "pod-1")


def test_losing_claimer_gets_nothing_when_the_only_volume_is_taken() -> None:
    store = VersionedStore([pvc("a", released_at=ago(5))])
    snapshot = store.list()

    assert claim(store, snapshot, "pod-1") == "a"
    assert claim(store, snapshot, "pod-2") is None  # the webhook then creates a new volume
    assert store.volumes["a"]["metadata"]["annotations"][vp.CLAIM_TOKEN_ANNOTATION] == "pod-1"


# The pool timer


def test_in_use_volume_is_left_alone_except_a_stale_release_mark() -> None:
    plan = vp.plan_pool([pvc("v", claim="t", claimed_at=ago(600), released_at=ago(700))],
                        [pod("p", "v")], [], NOW, POLICY)

    assert annotation_patch(plan, "v") == {vp.RELEASED_AT_ANNOTATION: None}
    assert plan.counts["InUse"] == 1
    assert not (plan.jobs_to_create or plan.volumes_to_delete)


def test_volume_whose_pod_is_gone_is_released_then_drained_after_the_grace() -> None:
    released = vp.plan_pool([pvc("v", claim="t", claimed_at=ago(600), backlog="unknown")],
                            [], [], NOW, POLICY)

    assert annotation_patch(released, "v") == {
        vp.CLAIM_TOKEN_ANNOTATION: None, vp.CLAIMED_AT_ANNOTATION: None,
        vp.CLAIM_KEY_ANNOTATION: None, vp.RELEASED_AT_ANNOTATION: format_time(NOW),
        # The claim it was released from: its pod's shutdown record may still arrive.
        vp.RELEASED_TOKEN_ANNOTATION: "t"}
    assert not released.jobs_to_create

    within_grace = vp.plan_pool([pvc("v", released_at=ago(29), backlog="unknown")], [], [], NOW,
                                POLICY)
    assert within_grace.idle

    past_grace = vp.plan_pool([pvc("v", released_at=ago(30), backlog="unknown", version="17")],
                              [], [], NOW, POLICY)
    assert past_grace.jobs_to_create == ["v"]
    assert past_grace.drain_requests == {"v": "17"}  # the version the request was made from
    assert annotation_patch(past_grace, "v") == {vp.DRAIN_JOB_ANNOTATION: "v-drain",
                                                 vp.DRAIN_REQUEST_ANNOTATION: "17"}


def test_running_drain_is_waited_for_and_a_successful_one_empties_the_volume() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain")

    running = vp.plan_pool([volume], [], [job("v-drain", active=1)], NOW, POLICY)
    done = vp.plan_pool([volume], [], [job("v-drain", succeeded=1)], NOW, POLICY)

    assert running.idle and running.counts["Draining"] == 1
    assert done.jobs_to_delete == ["v-drain"]
    assert annotation_patch(done, "v") == {
        vp.DRAIN_JOB_ANNOTATION: None, vp.DRAIN_REQUEST_ANNOTATION: None,
        vp.BACKLOG_ANNOTATION: "empty", vp.RELEASED_AT_ANNOTATION: format_time(NOW),
        vp.DRAIN_FAILURES_ANNOTATION: None}


# D1 (data loss): a drain Job was known by its name only, so a Complete Job left from an
# earlier drain of the same volume marked it empty, and the volume was deleted with backlog.


def test_a_complete_job_from_an_earlier_drain_request_proves_nothing_and_is_deleted() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain",
                 request="42")
    stale = job("v-drain", request="17", succeeded=1,
                conditions=[{"type": "Complete", "status": "True"}])

    plan = vp.plan_pool([volume], [], [stale], NOW, POLICY)

    assert plan.jobs_to_delete == ["v-drain"]
    assert not plan.patches  # not marked empty
    assert plan.volumes_to_delete == []
    again = vp.plan_pool([volume], [], [], NOW, POLICY)  # once it is gone
    assert again.jobs_to_create == ["v"] and again.drain_requests == {"v": "42"}


def test_the_job_of_the_current_request_counts() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain",
                 request="42")
    done = job("v-drain", request="42", succeeded=1,
               conditions=[{"type": "Complete", "status": "True"}])

    plan = vp.plan_pool([volume], [], [done], NOW, POLICY)

    assert annotation_patch(plan, "v")[vp.BACKLOG_ANNOTATION] == "empty"


def test_failed_drain_is_a_named_problem_and_retried() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain", failures="1")
    failed = job("v-drain", conditions=[{"type": "Failed", "status": "True"}])

    plan = vp.plan_pool([volume], [], [failed], NOW, POLICY)

    assert plan.jobs_to_delete == ["v-drain"]
    assert annotation_patch(plan, "v")[vp.DRAIN_FAILURES_ANNOTATION] == "2"
    assert annotation_patch(plan, "v")[vp.DRAIN_JOB_ANNOTATION] is None
    (problem,) = plan.problems
    assert "v-drain" in problem and "volume v" in problem


def test_missing_drain_job_is_created_again() -> None:
    plan = vp.plan_pool([pvc("v", released_at=ago(100), drain_job="v-drain")], [], [], NOW,
                        POLICY)

    assert plan.jobs_to_create == ["v"]


def test_empty_volume_is_deleted_only_after_its_idle_ttl() -> None:
    young = vp.plan_pool([pvc("v", released_at=ago(299), backlog="empty")], [], [], NOW, POLICY)
    old = vp.plan_pool([pvc("v", released_at=ago(300), backlog="empty")], [], [], NOW, POLICY)

    assert young.idle
    assert old.volumes_to_delete == ["v"]


def test_deleting_producer_drains_and_deletes_at_once_but_never_in_use_volumes() -> None:
    volumes = [pvc("backlog", claim="t", claimed_at=ago(600)),
               pvc("empty", released_at=ago(1), backlog="empty"),
               pvc("used", claim="t2", claimed_at=ago(600))]

    plan = vp.plan_pool(volumes, [pod("p", "used")], [], NOW, POLICY, deleting=True)

    assert plan.jobs_to_create == ["backlog"]
    assert annotation_patch(plan, "backlog")[vp.DRAIN_JOB_ANNOTATION] == "backlog-drain"
    assert plan.volumes_to_delete == ["empty"]


def test_one_patch_per_volume_so_resource_versions_never_conflict_with_ourselves() -> None:
    plan = vp.plan_pool([pvc("v", claim="t", claimed_at=ago(600))], [], [], NOW, POLICY,
                        deleting=True)

    assert [p.name for p in plan.patches] == ["v"]
    assert plan.patches[0].patch["metadata"]["resourceVersion"] == "1"


def test_long_pending_volume_is_a_problem() -> None:
    volume = pvc("v", claim="t", claimed_at=ago(10))
    volume["status"] = {"phase": "Pending"}

    plan = vp.plan_pool([volume], [], [], NOW, POLICY)

    assert any("v is still Pending" in problem for problem in plan.problems)


def test_audit_names_running_pods_without_an_agent() -> None:
    pods = [pod("ok", "v"), pod("bare", None), pod("starting", None, phase="Pending")]

    assert pool_status.pods_without_agent(pods) == ["bare"]
    assert pool_status.attached_pods(pods) == 1


# Manifests


def test_new_volume_is_labelled_not_owned_sized_and_already_claimed() -> None:
    """No owner reference: the finalizer owns the volume's lifecycle, and a foreground or
    namespace deletion must not make the garbage collector delete it before its drain (D2)."""
    spec = make_spec(storage={"storageClassName": "replicated"})

    manifest = manifests.new_volume_manifest(PRODUCER, spec, "orders-buffer-1", "tok", NOW)

    assert "ownerReferences" not in manifest["metadata"]
    assert manifest["metadata"]["finalizers"] == [vp.VOLUME_FINALIZER]
    assert manifest["metadata"]["labels"] == {POOL_LABEL: "orders"}
    assert manifest["metadata"]["annotations"][vp.CLAIM_TOKEN_ANNOTATION] == "tok"
    assert manifest["spec"]["storageClassName"] == "replicated"
    assert manifest["spec"]["resources"]["requests"]["storage"] == size_buffer(
        SizingInputs.from_spec(spec)).size_quantity


def test_a_drain_job_is_owned_without_blocking_the_producers_deletion() -> None:
    manifest = manifests.drain_job_manifest(
        PRODUCER, make_spec(), "orders-buffer-1", POLICY, AgentImage())

    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["blockOwnerDeletion"]) == ("dp-uid", False)


def owned(volume: dict[str, Any], *references: dict[str, Any]) -> dict[str, Any]:
    volume["metadata"]["ownerReferences"] = list(references)
    return volume


PRODUCER_REFERENCE = manifests.owner_reference(PRODUCER)
OTHER_REFERENCE = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keep", "uid": "c-1"}


def test_the_pool_removes_the_owner_reference_older_versions_set() -> None:
    volume = owned(pvc("v", backlog=vp.BACKLOG_EMPTY, released_at=ago(10)),
                   PRODUCER_REFERENCE, OTHER_REFERENCE)

    plan = vp.plan_pool([volume], [], [], NOW, POLICY)

    (patch,) = plan.patches
    assert patch.name == "v"
    assert patch.patch == {"metadata": {"resourceVersion": "1",
                                        "ownerReferences": [OTHER_REFERENCE]}}


def test_an_in_use_volume_is_disowned_too_and_nothing_else_changes() -> None:
    volume = owned(pvc("v", claim="t", claimed_at=ago(600)), PRODUCER_REFERENCE)

    plan = vp.plan_pool([volume], [pod("p", "v")], [], NOW, POLICY)

    assert [p.patch for p in plan.patches] == [
        {"metadata": {"resourceVersion": "1", "ownerReferences": []}}]
    assert not (plan.jobs_to_create or plan.volumes_to_delete)


def test_a_volume_without_our_owner_reference_needs_no_patch() -> None:
    volume = owned(pvc("v", backlog=vp.BACKLOG_EMPTY, released_at=ago(10)), OTHER_REFERENCE)

    assert vp.plan_pool([volume], [], [], NOW, POLICY).idle


def test_drain_job_runs_the_agent_drain_mode_on_the_volume() -> None:
    manifest = manifests.drain_job_manifest(
        PRODUCER, make_spec(), "orders-buffer-1", POLICY, AgentImage())
    pod_spec = manifest["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]

    args = build_parser({}).parse_args(container["args"])

    assert manifest["metadata"]["name"] == "orders-buffer-1-drain"
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "orders-buffer-1"}
    assert args.command == "drain" and args.timeout == 120.0
    assert contract.PRODUCER_LABEL not in manifest["spec"]["template"]["metadata"]["labels"]


def test_drain_pods_are_kept_out_of_service_meshes() -> None:
    """D4 (a): a proxy injected into a drain pod as an ordinary container never exits, so the
    Job would never complete (it would hit activeDeadlineSeconds and count as failed)."""
    manifest = manifests.drain_job_manifest(
        PRODUCER, make_spec(), "orders-buffer-1", POLICY, AgentImage(), request="r-1")
    template = manifest["spec"]["template"]

    assert template["metadata"]["annotations"] == {
        "sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}
    assert template["metadata"]["labels"][vp.DRAIN_REQUEST_LABEL] == "r-1"


def test_volume_names_stay_short_enough_for_job_names() -> None:
    name = vp.volume_name("x" * 250, "abcdef12")

    assert len(vp.drain_job_name(name)) <= 63


def test_job_outcome_from_counts() -> None:
    assert vp.job_outcome(job("j")) == "running"
    assert vp.job_outcome(job("j", succeeded=1)) == "succeeded"
    assert vp.job_outcome(job("j", failed=3)) == "failed"
    assert vp.job_outcome(job("j", failed=2)) == "running"


def test_lifecycle_document_draws_every_state_and_lists_every_annotation() -> None:
    doc = (Path(__file__).resolve().parents[4] / "docs" / "volume-lifecycle.md").read_text()
    diagram = doc.split("```mermaid", 1)[1].split("```", 1)[0]

    for state in vp.VolumeState:
        assert f"{state.value}" in diagram, state
    for annotation in (vp.CLAIM_TOKEN_ANNOTATION, vp.CLAIMED_AT_ANNOTATION,
                       vp.RELEASED_AT_ANNOTATION, vp.BACKLOG_ANNOTATION,
                       vp.DRAIN_JOB_ANNOTATION, vp.DRAIN_FAILURES_ANNOTATION,
                       vp.CLAIM_KEY_ANNOTATION, vp.PLACEMENT_ANNOTATION,
                       volume_fit.STORAGE_CLASS_ANNOTATION,
                       volume_fit.EXPANSION_REFUSED_ANNOTATION, vp.VOLUME_FINALIZER,
                       vp.ABANDON_ANNOTATION):
        assert f"`{annotation}`" in doc, annotation
    for variable in POOL_ENV.values():
        if "PENDING" not in variable:
            assert f"`{variable}`" in doc, variable


def test_backlog_is_read_from_the_agents_real_metrics_exposition() -> None:
    metrics = AgentMetrics()
    metrics.refresh_buffer(size_bytes=123_456, max_bytes=2**30, quarantined_segments=0)

    assert f"{METRICS_PREFIX}_backlog_bytes" == BACKLOG_METRIC
    assert agent_figures.parse_backlog_bytes(metrics.render().decode()) == 123_456
    assert agent_figures.parse_backlog_bytes("durable_agent_backlog_bytes_total 5\n") is None
    assert agent_figures.parse_backlog_bytes('durable_agent_backlog_bytes{pod="a"} 7.0\n') == 7


def test_metrics_urls_of_running_agents_only() -> None:
    running = pod("a", "v")
    running["status"]["podIP"] = "10.0.0.7"
    ipv6 = pod("b", "w")
    ipv6["status"]["podIP"] = "fd00::5"
    bare = pod("c", None)
    bare["status"]["podIP"] = "10.0.0.8"
    starting = pod("d", "x", phase="Pending")

    urls = agent_scrape.agent_metrics_urls([running, ipv6, bare, starting], 9644)

    assert urls == ["http://10.0.0.7:9644/metrics", "http://[fd00::5]:9644/metrics"]


def condition(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": "Degraded", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": ago(600)}


READY = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "ok",
         "lastTransitionTime": ago(600)}


def test_pool_problems_make_the_producer_degraded_and_keep_a_runway_warning() -> None:
    current = [READY, condition("True", "RunwayBelowTarget", "runway short")]
    baseline = [READY, condition("True", "RunwayBelowTarget", "runway short")]

    updated = pool_status.degraded_conditions(
        current, baseline, ["pod x has no agent"], "Pool", NOW)

    assert updated is not None
    (degraded,) = [c for c in updated if c["type"] == "Degraded"]
    assert degraded["reason"] == "Pool"
    assert degraded["message"] == "pod x has no agent; runway short"
    assert degraded["lastTransitionTime"] == ago(600)  # still True: no transition
    assert READY in updated


def test_same_problems_change_nothing_and_resolved_ones_restore_the_baseline() -> None:
    ours = [READY, condition("True", "Pool", "pod x has no agent")]
    baseline = [READY, condition("False", "AsExpected")]

    unchanged = pool_status.degraded_conditions(ours, baseline, ["pod x has no agent"], "Pool", NOW)
    restored = pool_status.degraded_conditions(ours, baseline, [], "Pool", NOW)

    assert unchanged is None
    assert restored is not None
    (degraded,) = [c for c in restored if c["type"] == "Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert degraded["lastTransitionTime"] == format_time(NOW)


def test_degraded_follows_the_baseline_once_the_spec_changes() -> None:
    """With the pool on Degraded is the pool timer's alone (review D7): a spec that no longer
    gives a short runway clears the old RunwayBelowTarget; an invalid spec (no baseline)
    leaves Degraded as it is."""
    current = [READY, condition("True", "RunwayBelowTarget", "runway short")]

    updated = pool_status.degraded_conditions(
        current, [READY, condition("False", "AsExpected")], [], "Pool", NOW)
    assert updated is not None
    assert [c["reason"] for c in updated if c["type"] == "Degraded"] == ["AsExpected"]
    assert pool_status.degraded_conditions(current, [READY], [], "Pool", NOW) is None


def test_status_volume_counts_cover_every_state() -> None:
    counts = {vp.VolumeState.IN_USE.value: 2, vp.VolumeState.DRAINING.value: 1}
    assert pool_status.status_volume_counts(counts) == {
        "inUse": 2, "claimed": 0, "free": 0, "draining": 1}
    assert len(pool_status.status_volume_counts({})) == len(vp.VolumeState)


def test_each_failed_drain_doubles_the_wait_before_the_next_up_to_the_cap() -> None:
    """A days-long Kafka outage: a drain retried every grace period keeps the volume Draining
    nearly all the time, so each new pod gets a new volume (D9). The wait doubles per failure."""
    policy = PoolPolicy(claim_grace_seconds=60, drain_grace_seconds=30, idle_ttl_seconds=300,
                        drain_retry_max_seconds=200)

    def drains_after(seconds: float, failures: int) -> bool:
        volume = pvc("v", released_at=ago(seconds), backlog="unknown",
                     failures=str(failures) if failures else None)
        return vp.plan_pool([volume], [], [], NOW, policy).jobs_to_create == ["v"]

    waits = {failures: next(s for s in range(0, 1000, 5) if drains_after(s, failures))
             for failures in range(6)}

    assert waits == {0: 30, 1: 30, 2: 60, 3: 120, 4: 200, 5: 200}


def test_a_failed_drain_names_the_next_wait() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain", failures="2")
    failed = job("v-drain", conditions=[{"type": "Failed", "status": "True"}])

    (problem,) = vp.plan_pool([volume], [], [failed], NOW, POLICY).problems

    assert "failed (3 time(s))" in problem and "retried in 120s" in problem


def test_a_drain_failed_on_dead_letters_says_so_and_keeps_the_volume() -> None:
    volume = pvc("v", released_at=ago(100), backlog="unknown", drain_job="v-drain")
    failed = job("v-drain", conditions=[{"type": "Failed", "status": "True",
                                         "reason": "PodFailurePolicy"}])

    plan = vp.plan_pool([volume], [], [failed], NOW, POLICY)

    (problem,) = plan.problems
    assert "v is not empty" in problem and "dead letters" in problem
    assert vp.ABANDON_ANNOTATION in problem
    assert annotation_patch(plan, "v").get(vp.BACKLOG_ANNOTATION) is None  # not marked empty
    assert not plan.volumes_to_delete


def test_the_drain_job_fails_at_its_first_pod_that_finds_dead_letters() -> None:
    (rule,) = manifests.drain_job_manifest(
        {"metadata": {"name": "orders", "namespace": "shop", "uid": "u"}}, make_spec(), "v",
        POLICY, AgentImage())["spec"]["podFailurePolicy"]["rules"]
    assert rule == {"action": "FailJob", "onExitCodes": {
        "containerName": contract.AGENT_CONTAINER_NAME, "operator": "In",
        "values": [contract.DRAIN_KEPT_DEAD_LETTERS_EXIT]}}


def test_a_claim_clears_the_failed_drains() -> None:
    patch = handout.claim_patch(pvc("v", failures="4"), "token", NOW)

    assert patch["metadata"]["annotations"][vp.DRAIN_FAILURES_ANNOTATION] is None
