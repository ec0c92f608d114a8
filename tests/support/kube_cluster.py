"""The local Kubernetes control plane for tests (durable_producer.local.kube), and what a test
needs on it: a fresh namespace, the CRDs applied with kubectl, a client, the audit log.

One control plane per pytest session, started by the first test that asks for it (fixture
``control_plane``), with one kwok node so pods are scheduled and Running. A test gets its
own namespace (``kube_namespace``), deleted after it by the real namespace controller; the
finalizers the stopped operator can no longer remove are taken off first, and its
DurableProducers deleted at once (a later test's operator must not find them).

What stands in for a real cluster's node agents: kwok (kubelet: pods Running, Job pods exit
0, deleted pods go) and ``VolumeProvisioner`` (a CSI provisioner: a PersistentVolume for each
new claim, bound by the real PV controller).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_producer.local.kube import KubeControlPlane
from durable_producer.local.kube_binaries import KubeBinariesMissing
from durable_producer.local.kube_client import JSON_PATCH, KubeApiError, KubeClient
from support.tools import REPO_ROOT, kubectl_binary

CRDS_DIR = REPO_ROOT / "crds"
FAKE_NODES = 1
PROVISIONER_INTERVAL_SECONDS = 0.2
PROVISIONED_LABEL = "durable.dev/test-provisioned-for"
PRODUCERS_PATH = "/apis/durable.dev/v1alpha1/namespaces/{namespace}/durableproducers"
FINALIZED_PLURALS = (
    PRODUCERS_PATH,
    "/api/v1/namespaces/{namespace}/persistentvolumeclaims",
)


@dataclass
class Cluster:
    """The session's control plane and its admin kubeconfig."""

    plane: KubeControlPlane
    kubeconfig: Path

    @property
    def admin(self) -> KubeClient:
        return self.plane.admin

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input_text: str | None = None,
                check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(kubectl_binary()), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input_text, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok for the whole
    session, with this repository's CRDs applied by ``kubectl apply -f crds/``."""
    kubectl_binary()  # skip early, with the install hint, when kubectl is missing
    try:
        with running_cluster(tmp_path_factory.mktemp("kube")) as cluster:
            yield cluster
    except KubeBinariesMissing as error:
        pytest.skip(str(error))


@contextlib.contextmanager
def running_cluster(work_dir: Path) -> Iterator[Cluster]:
    """The control plane the ``control_plane`` fixture gives (benchmarks use it too);
    KubeBinariesMissing when the binaries are not installed."""
    plane = KubeControlPlane(work_dir, nodes=FAKE_NODES)
    try:
        plane.start()
        cluster = Cluster(plane, plane.admin_kubeconfig())
        apply_crds(cluster)
        cluster.admin.call("POST", "/apis/storage.k8s.io/v1/storageclasses",
                           storage_class(DEFAULT_STORAGE_CLASS, default=True))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "-f", str(CRDS_DIR))
        print(f"\nlocal control plane started: {plane.start_seconds}")
        yield cluster
    finally:
        plane.close()


def apply_crds(cluster: Cluster) -> None:
    """``kubectl apply -f crds/``, as users install the CRDs (server-side apply)."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRDS_DIR))


def _strip_finalizers(admin: KubeClient, namespace: str) -> None:
    for collection in FINALIZED_PLURALS:
        path = collection.format(namespace=namespace)
        status, listing = admin.request("GET", path)
        if status != 200:
            continue
        for item in listing.get("items") or []:
            if item["metadata"].get("finalizers"):
                admin.request("PATCH", f"{path}/{item['metadata']['name']}",
                              [{"op": "remove", "path": "/metadata/finalizers"}],
                              content_type=JSON_PATCH)


# The cluster's default StorageClass: WaitForFirstConsumer, as on EKS, GKE and AKS, so a claim
# is bound only once the scheduler picked a node for a pod that uses it.
DEFAULT_STORAGE_CLASS = "local-wffc"
FAKE_PROVISIONER = "local.durable.dev/provisioner"
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"


def storage_class(name: str, *, default: bool = False, expandable: bool = False
                  ) -> dict[str, Any]:
    """A WaitForFirstConsumer StorageClass that VolumeProvisioner serves."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": FAKE_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": expandable, "reclaimPolicy": "Delete"}


class VolumeProvisioner:
    """Stands in for a CSI provisioner: a PersistentVolumeClaim of the namespace for which
    the scheduler selected a node (WaitForFirstConsumer) gets a PersistentVolume of its size
    and class, pre-bound to it; the PV controller binds them and the scheduler then binds the
    pod to the kwok node. A claim no pod uses stays Pending, as with a real provisioner."""

    def __init__(self, admin: KubeClient, namespace: str) -> None:
        self.admin = admin
        self.namespace = namespace
        self.provisioned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volume-provisioner", daemon=True)

    def __enter__(self) -> VolumeProvisioner:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.admin.request("DELETE", "/api/v1/persistentvolumes?labelSelector="
                           f"{PROVISIONED_LABEL}%3D{self.namespace}")

    def _run(self) -> None:
        while not self._stop.wait(PROVISIONER_INTERVAL_SECONDS):
            with contextlib.suppress(OSError, KubeApiError):
                self._provision()

    def _provision(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims"
        status, listing = self.admin.request("GET", path)
        if status != 200:
            return
        for claim in listing.get("items") or []:
            metadata, spec = claim["metadata"], claim.get("spec") or {}
            if metadata["uid"] in self.provisioned or spec.get("volumeName"):
                continue
            if SELECTED_NODE_ANNOTATION not in (metadata.get("annotations") or {}):
                continue
            if metadata.get("deletionTimestamp"):
                continue
            size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {
                "name": f"pv-{metadata['uid']}",
                "labels": {PROVISIONED_LABEL: self.namespace}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "storageClassName": spec.get("storageClassName") or "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": f"/nonexistent/{metadata['uid']}"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                 "namespace": self.namespace, "name": metadata["name"],
                                 "uid": metadata["uid"]}}}
            status, _ = self.admin.request("POST", "/api/v1/persistentvolumes", volume)
            if status in (200, 201, 409):
                self.provisioned.add(metadata["uid"])


def _delete_producers(admin: KubeClient, namespace: str) -> None:
    """Delete the namespace's DurableProducers now, finalizers off, not when the namespace
    controller gets to them: until then a later test's operator (they watch every namespace,
    as the chart's does) would find them, put its finalizer back and run their deletion for
    the rest of the session, beside its own test's work (seen in CI: a namespace deletion and
    a volume retirement timed out while an operator worked on five such leftovers)."""
    _strip_finalizers(admin, namespace)
    admin.request("DELETE", PRODUCERS_PATH.format(namespace=namespace))


def _clear_leftovers(admin: KubeClient) -> None:
    """Delete the DurableProducers of every namespace being deleted (an earlier test's, or
    one a test deleted itself)."""
    status, listing = admin.request("GET", "/api/v1/namespaces")
    if status != 200:
        return
    for item in listing.get("items") or []:
        if item["metadata"].get("deletionTimestamp"):
            _delete_producers(admin, item["metadata"]["name"])


@pytest.fixture()
def kube_namespace(control_plane: Cluster) -> Iterator[str]:
    """A fresh namespace (with a provisioner for its volumes); deleted after the test, its
    DurableProducers first. A test starts with no DurableProducer left in any namespace
    being deleted."""
    _clear_leftovers(control_plane.admin)
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.plane.create_namespace(name)
    try:
        with VolumeProvisioner(control_plane.admin, name):
            yield name
    finally:
        _delete_producers(control_plane.admin, name)
        control_plane.admin.request("DELETE", f"/api/v1/namespaces/{name}")


@dataclass(frozen=True)
class AuditedRequest:
    """One API request from the audit log, in the terms RBAC authorizes it."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None
    user: str
    user_agent: str
    code: int
    body: Any

    @property
    def plural(self) -> str:
        return self.resource


def audited_requests(plane: KubeControlPlane) -> list[AuditedRequest]:
    requests = []
    for event in plane.audit_events():
        if event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        if not ref.get("resource"):
            continue
        requests.append(AuditedRequest(
            verb=event.get("verb", ""), group=ref.get("apiGroup", ""),
            resource=ref["resource"], subresource=ref.get("subresource"),
            namespace=ref.get("namespace"), name=ref.get("name"),
            user=(event.get("user") or {}).get("username", ""),
            user_agent=event.get("userAgent", ""),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            body=event.get("requestObject")))
    return requests


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
