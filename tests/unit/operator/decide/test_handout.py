"""A pod refused after the webhook: its retries reuse the claim; unused volumes go undrained.

Defect: each retry inside the claim grace created a new PVC, and each got a drain Job later
(six refused attempts: six PVCs, six drain Jobs).
"""

from __future__ import annotations

from typing import Any

from durable_producer.operator.decide import handout, pod_key
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.model.installation import PoolPolicy
from support.times import NOW, ago

POLICY = PoolPolicy(claim_grace_seconds=120, drain_grace_seconds=30, idle_ttl_seconds=300)
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "orders-5d8f", "uid": "rs-uid",
         "controller": True}


def pod(name: str | None = None, generate_name: str | None = None,
        claim: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"ownerReferences": [OWNER]}
    if name:
        metadata["name"] = name
    if generate_name:
        metadata["generateName"] = generate_name
    spec: dict[str, Any] = {"containers": [{"name": "app"}]}
    if claim:
        spec["volumes"] = [{"name": "durable-buffer",
                            "persistentVolumeClaim": {"claimName": claim}}]
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def claimed(name: str, key: handout.ClaimKey, age: float, phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "resourceVersion": "3", "finalizers": [vp.VOLUME_FINALIZER],
                         "annotations": {vp.CLAIM_TOKEN_ANNOTATION: "t", vp.CLAIMED_AT_ANNOTATION:
                                         ago(age), vp.CLAIM_KEY_ANNOTATION: key.value,
                                         vp.BACKLOG_ANNOTATION: vp.BACKLOG_UNKNOWN}},
            "status": {"phase": phase}}


def test_the_key_names_the_controller_and_the_pod() -> None:
    named = pod_key.claim_key(pod(name="orders-0"))
    generated = pod_key.claim_key(pod(generate_name="orders-5d8f-"))

    assert named == handout.ClaimKey("ReplicaSet/rs-uid/orders-0", one_pod=True)
    assert generated == handout.ClaimKey("ReplicaSet/rs-uid/orders-5d8f-*", one_pod=False)
    assert pod_key.claim_key({"metadata": {}}) is None


def test_a_retry_of_a_named_pod_reuses_its_claim_at_once() -> None:
    key = pod_key.claim_key(pod(name="orders-0"))
    assert key is not None
    volumes = [claimed("mine", key, 0.2),
               claimed("someone-elses", handout.ClaimKey("ReplicaSet/x/other", True), 0.2)]

    reused = handout.reusable_claim(volumes, [], key, NOW, POLICY)

    assert reused is not None and reused["metadata"]["name"] == "mine"
    patch = handout.claim_patch(reused, "new-token", NOW, key)
    assert patch["metadata"]["resourceVersion"] == "3"
    assert patch["metadata"]["annotations"][vp.CLAIM_KEY_ANNOTATION] == key.value


def test_a_generated_name_reuses_a_claim_only_once_siblings_had_time_to_be_created() -> None:
    key = pod_key.claim_key(pod(generate_name="orders-5d8f-"))
    assert key is not None
    young = [claimed("v", key, handout.CLAIM_SETTLE_SECONDS - 1)]
    settled = [claimed("v", key, handout.CLAIM_SETTLE_SECONDS)]

    assert handout.reusable_claim(young, [], key, NOW, POLICY) is None  # maybe a sibling's
    assert handout.reusable_claim(settled, [], key, NOW, POLICY) is not None


def test_a_claim_a_pod_mounts_or_that_expired_is_never_reused() -> None:
    key = pod_key.claim_key(pod(name="orders-0"))
    assert key is not None
    mounted = [claimed("v", key, 5)]
    expired = [claimed("v", key, POLICY.claim_grace_seconds + 1)]

    assert handout.reusable_claim(mounted, [pod(name="orders-0", claim="v")], key, NOW,
                                  POLICY) is None
    assert handout.reusable_claim(expired, [], key, NOW, POLICY) is None


def test_a_volume_claimed_for_a_refused_pod_is_deleted_undrained_once_the_claim_expires() -> None:
    key = handout.ClaimKey("ReplicaSet/rs-uid/orders-0", True)
    never_bound = claimed("v", key, POLICY.claim_grace_seconds + 1, phase="Pending")
    bound = claimed("w", key, POLICY.claim_grace_seconds + 1, phase="Bound")

    plan = vp.plan_pool([never_bound, bound], [], [], NOW, POLICY)

    assert plan.volumes_to_delete == ["v"]  # Pending: no storage was ever behind it
    assert "v" not in plan.jobs_to_create
    assert not [p for p in plan.patches if p.name == "v"]  # the delete is guarded by itself
    # Bound: a pod may have written to it before it went: drained after the grace, as before.
    assert [p.name for p in plan.patches] == ["w"]


def test_a_pending_volume_is_a_problem_only_when_a_pod_waits_for_it() -> None:
    key = handout.ClaimKey("-/p", True)
    waited_for = claimed("v", key, 400)
    waited_for["metadata"]["creationTimestamp"] = ago(400)
    unused = claimed("w", key, 1100)  # its claim expired: no pod is coming for it
    unused["metadata"]["creationTimestamp"] = ago(1100)
    policy = PoolPolicy(claim_grace_seconds=1000, pending_volume_seconds=300)

    plan = vp.plan_pool([waited_for, unused], [pod(name="p", claim="v")], [], NOW, policy)

    assert [problem.split()[1] for problem in plan.problems] == ["v"]
    assert plan.volumes_to_delete == ["w"]
