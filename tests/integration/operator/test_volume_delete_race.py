"""The pool's writes to a volume racing another writer's, on the real API server.

The pool deleting a free, empty volume while the webhook claims it: the two writers' steps
are interleaved by the test (the window is a few milliseconds in a cluster; a script makes
it certain): the webhook read the volume before the pool's first write, so its claim is
refused (409), it reads again and claims what it then finds. The API server's optimistic
concurrency, finalizers and deletion are real. Review D10: the pool
removed its finalizer before deleting, so the re-read found a live volume without it, the
claim won, the guarded delete was refused, and a volume in use had no protection.

The deletion handler releasing a deleted, empty volume while another finalizer leaves it (in
a namespace being deleted, Kubernetes' pvc-protection controller removes its own as the pool
runs): the guarded release is refused (409). The handler counted every planned release as
done, let the DurableProducer go, and the volume kept our finalizer with no one left to
remove it: the namespace stayed Terminating (a CI run of the namespace-deletion test).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf
import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import POOL_LABEL
from durable_producer.operator.act import cluster as cluster_module
from durable_producer.operator.act import pool_actions
from durable_producer.operator.act.api_access import POOL_USER_AGENT
from durable_producer.operator.act.cluster import Cluster
from durable_producer.operator.decide import handout
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.operator.settings import OperatorConfig
from integration.operator.test_operator_on_api_server import condition, durable_producer
from support.kube_harness import KubeApi
from support.operator_clients import admin_api_client, operator_clients_on
from support.waiting import wait_for

pytestmark = pytest.mark.integration


class ClaimBetween(Cluster):
    """The operator's real API access; after the pool's first write to the volume, the
    webhook's claim (from the version it read before) runs against the real API server."""

    def __init__(self, client: kubernetes.client.ApiClient, read_before: dict[str, Any]) -> None:
        super().__init__(client)
        self.read_before = read_before
        self.claims: list[str] = []

    def _webhook_claims(self, namespace: str, name: str) -> None:
        if self.claims:
            return
        patch = handout.claim_patch(self.read_before, "webhook", datetime.now(UTC))
        try:
            super().patch_volume(namespace, name, patch)
            self.claims.append("claimed at once")
            return
        except ApiException as error:
            assert error.status == 409, error
        fresh = self.core.read_namespaced_persistent_volume_claim(name, namespace).to_dict()
        if fresh["metadata"].get("deletion_timestamp"):
            self.claims.append("refused: deleted")  # handout never offers a deleted volume
            return
        again = {"metadata": {"resourceVersion": fresh["metadata"]["resource_version"],
                              "annotations": patch["metadata"]["annotations"]}}
        super().patch_volume(namespace, name, again)
        self.claims.append("claimed after a re-read")

    def patch_volume(self, namespace: str, name: str, patch: Any) -> Any:
        answer = super().patch_volume(namespace, name, patch)
        self._webhook_claims(namespace, name)
        return answer

    def delete_volume(self, namespace: str, name: str, resource_version: str | None) -> Any:
        answer = super().delete_volume(namespace, name, resource_version)
        self._webhook_claims(namespace, name)
        return answer


def test_a_volume_claimed_while_the_pool_deletes_it_keeps_its_finalizer(kube_api: KubeApi) -> None:
    status, created = kube_api.call("POST", kube_api.pvcs_path, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "orders-buffer-1", "labels": {POOL_LABEL: "orders"},
                     "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY},
                     "finalizers": [vp.VOLUME_FINALIZER]},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    assert status == 201, created
    api = ClaimBetween(admin_api_client(kube_api.cluster), read_before=created)

    pool_actions._delete_volume(api, kube_api.namespace, created)

    status, found = kube_api.call("GET", f"{kube_api.pvcs_path}/orders-buffer-1")
    print(f"\nthe webhook: {api.claims}; the volume: {status}"
          f" {(found.get('metadata') or {}).get('finalizers') if status == 200 else ''}")
    assert api.claims, "the webhook's claim ran between the pool's writes"
    if status == 200 and not found["metadata"].get("deletionTimestamp"):
        assert vp.VOLUME_FINALIZER in (found["metadata"].get("finalizers") or []), (
            f"a live volume the webhook claimed ({api.claims}) lost its protection")
    else:
        assert api.claims == ["refused: deleted"]


OTHER_FINALIZER = "example.com/another-owner"
"""Stands for Kubernetes' own ``kubernetes.io/pvc-protection``, whose controller removes it
on its own schedule; the test removes this one at the chosen moment instead."""


class FinalizerLeavesBetween(Cluster):
    """The operator's real API access; just before the pool's first release of a volume
    (the patch that removes our finalizer), the other owner removes its finalizer from the
    volume as the pool read it, so the pool's release, guarded by that version, is refused."""

    def __init__(self, client: kubernetes.client.ApiClient, kube_api: KubeApi) -> None:
        super().__init__(client)
        self.kube_api = kube_api
        self.interleaved: list[str] = []

    def patch_volume(self, namespace: str, name: str, patch: Any) -> Any:
        finalizers = (patch.get("metadata") or {}).get("finalizers")
        if not self.interleaved and finalizers is not None and (
                vp.VOLUME_FINALIZER not in finalizers):
            status, now = self.kube_api.call("GET", f"{self.kube_api.pvcs_path}/{name}")
            assert status == 200, now
            status, answer = self.kube_api.call(
                "PATCH", f"{self.kube_api.pvcs_path}/{name}",
                {"metadata": {"finalizers": [f for f in now["metadata"]["finalizers"]
                                             if f != OTHER_FINALIZER]}},
                content_type="application/merge-patch+json")
            assert status == 200, answer
            self.interleaved.append(name)
        return super().patch_volume(namespace, name, patch)


def our_finalizer_holds(kube_api: KubeApi, volume: str) -> bool:
    status, found = kube_api.call("GET", f"{kube_api.pvcs_path}/{volume}")
    if status == 404:
        return False
    assert status == 200, found
    return vp.VOLUME_FINALIZER in (found["metadata"].get("finalizers") or [])


def test_a_release_refused_during_deletion_holds_the_producer_until_it_is_done(
    kube_api: KubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube_api.create(durable_producer("orders"))
    status, created = kube_api.call("POST", kube_api.pvcs_path, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "orders-buffer-1", "labels": {POOL_LABEL: "orders"},
                     "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY},
                     "finalizers": [vp.VOLUME_FINALIZER, OTHER_FINALIZER]},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    assert status == 201, created
    status, answer = kube_api.call("DELETE", f"{kube_api.pvcs_path}/orders-buffer-1")
    assert status == 200, answer  # deleted (as a namespace deletion does), held by finalizers
    # The operator's other clients (storage classes, status) reach this API server as the admin.
    operator_clients_on(kube_api.cluster, monkeypatch)
    api = FinalizerLeavesBetween(admin_api_client(kube_api.cluster), kube_api)
    monkeypatch.setitem(cluster_module._clusters, (POOL_USER_AGENT, True), api)
    logger = logging.getLogger(__name__)

    try:
        pool_actions.handle_deletion(kube_api.get("orders") or {}, OperatorConfig(), logger)
        let_go = True
    except kopf.TemporaryError:
        let_go = False

    assert api.interleaved == ["orders-buffer-1"], "the other owner's step ran before the release"
    holds = our_finalizer_holds(kube_api, "orders-buffer-1")
    print(f"\nfirst run: producer let go {let_go}, our finalizer on the volume {holds}")
    assert not (let_go and holds), (
        "the DurableProducer was let go while its volume kept our finalizer: nothing would"
        " ever remove it")
    if holds:
        deleting = condition(kube_api.get("orders"), "Deleting") or {}
        assert "orders-buffer-1" in str(deleting.get("message")), deleting

    pool_actions.handle_deletion(kube_api.get("orders") or {}, OperatorConfig(), logger)
    wait_for(lambda: kube_api.call("GET", f"{kube_api.pvcs_path}/orders-buffer-1")[0] == 404,
             timeout=30, what="the released volume to go")
