"""The pool deleting a free, empty volume while the webhook claims it, on the real API server.

The two writers' steps are interleaved by the test (the window is a few milliseconds in a
cluster; a script makes it certain): the webhook read the volume before the pool's first
write, so its claim is refused (409), it reads again and claims what it then finds. The API
server's optimistic concurrency, finalizers and deletion are real. Review D10: the pool
removed its finalizer before deleting, so the re-read found a live volume without it, the
claim won, the guarded delete was refused, and a volume in use had no protection.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import POOL_LABEL
from durable_producer.operator.act import pool_actions
from durable_producer.operator.act.cluster import Cluster
from durable_producer.operator.decide import handout
from durable_producer.operator.decide import volume_pool as vp
from support.kube_harness import KubeApi

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


def test_a_volume_claimed_while_the_pool_deletes_it_keeps_its_finalizer(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    status, created = kube_api.call("POST", kube_api.pvcs_path, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "orders-buffer-1", "labels": {POOL_LABEL: "orders"},
                     "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY},
                     "finalizers": [vp.VOLUME_FINALIZER]},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    assert status == 201, created
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=str(kube_api.cluster.plane.admin_kubeconfig(tmp_path / "admin.kubeconfig")),
        client_configuration=configuration)
    api = ClaimBetween(kubernetes.client.ApiClient(configuration), read_before=created)

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
