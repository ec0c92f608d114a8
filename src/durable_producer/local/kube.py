"""A real Kubernetes control plane on this machine, built from source (scripts/install-kube.sh).

``KubeControlPlane`` starts etcd and kube-apiserver as controller-runtime's envtest does
(loopback ports, a CA and serving certificate from openssl, a token file, service-account
keys, RBAC, the default admission plugins, an audit log), then kube-controller-manager
(garbage collector, namespace deletion, Jobs, ServiceAccounts, ...), and with ``nodes`` > 0
kube-scheduler and kwok with that many fake nodes (pods get scheduled and Running; their IPs
are loopback addresses). Ready: /readyz is ok and the default namespace has its
ServiceAccount (and every fake node is Ready). A failed start leaves nothing running.

Everyone talks to it with a bearer token: ``admin`` (system:masters) for set-up, and a
ServiceAccount's own token (``service_account_client``, TokenRequest) for a process whose
RBAC must be enforced, such as the operator. ``write_kubeconfig`` gives kubectl, helm and kopf
the same access. ``audit_events`` reads the API server's audit log: every request, with its
user, verb, resource and user agent.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from durable_producer.local.kube_binaries import KubeBinaries
from durable_producer.local.kube_client import KubeApiError, KubeClient, write_kubeconfig
from durable_producer.local.kube_pki import CertificateAuthority, service_account_keys
from durable_producer.local.kube_processes import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_VALUE,
    ApiServerFiles,
    Etcd,
    KubeApiServer,
    KubeControllerManager,
    KubeScheduler,
    Kwok,
)
from durable_producer.local.process import Managed, ManagedProcess, poll_until

P = TypeVar("P", bound=ManagedProcess)

ADMIN_USER = "local-admin"
MASTERS_GROUP = "system:masters"
# The control plane's own components, each with its own user (so the audit log can leave
# them out) and full access.
COMPONENT_USERS = ("system:kube-controller-manager", "system:kube-scheduler", "kwok")
TOKEN_LIFETIME_SECONDS = 24 * 3600
NAMESPACE_READY_TIMEOUT_SECONDS = 60.0
NODE_NAME_PREFIX = "kwok-node-"
# Requests the tests may ask about: every one but the control plane's own and the noisy
# read-only ones (leases, discovery); events with their bodies.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "users": [*COMPONENT_USERS, "system:apiserver"]},
        {"level": "None", "userGroups": ["system:nodes"]},
        {"level": "None", "resources": [{"group": "coordination.k8s.io",
                                         "resources": ["leases"]}]},
        {"level": "None", "nonResourceURLs": ["/api*", "/version", "/healthz", "/readyz",
                                              "/livez", "/openapi*"]},
        {"level": "Request", "resources": [{"group": "", "resources": ["events"]},
                                           {"group": "events.k8s.io", "resources": ["events"]}],
         "verbs": ["create"]},
        {"level": "Metadata"},
    ],
}


class KubeControlPlane(Managed):
    """etcd + kube-apiserver + kube-controller-manager (+ scheduler and kwok for ``nodes``)."""

    def __init__(self, work_dir: Path | None = None, *, nodes: int = 0,
                 binaries: KubeBinaries | None = None) -> None:
        self.binaries = binaries
        self.nodes = nodes
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="durable-kube-"))
        self.processes: list[ManagedProcess] = []
        self.start_seconds: dict[str, float] = {}
        self.admin_token = secrets.token_hex(16)
        self._admin: KubeClient | None = None
        self._files: ApiServerFiles | None = None

    # -- starting and stopping --

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        binaries = self.binaries or KubeBinaries.locate()
        began = time.monotonic()
        files = self._files = self._write_files()
        etcd = self._launch(Etcd(binaries, self.work_dir / "etcd", self._log("etcd")))
        apiserver = self._launch(KubeApiServer(binaries, etcd, files, self.admin_token,
                                               self._log("kube-apiserver")))
        self._admin = apiserver.admin
        self.start_seconds["etcd+kube-apiserver"] = time.monotonic() - began
        component_kubeconfig = self._component_kubeconfig(COMPONENT_USERS[0])
        self._launch(KubeControllerManager(binaries, component_kubeconfig, files, self.admin,
                                           self._log("kube-controller-manager")))
        self.start_seconds["+kube-controller-manager"] = time.monotonic() - began
        if self.nodes > 0:
            self._launch(KubeScheduler(binaries, self._component_kubeconfig(COMPONENT_USERS[1]),
                                       self._log("kube-scheduler")))
            names = tuple(f"{NODE_NAME_PREFIX}{index}" for index in range(self.nodes))
            for name in names:
                self.admin.call("POST", "/api/v1/nodes", fake_node(name))
            self._launch(Kwok(binaries, self._component_kubeconfig(COMPONENT_USERS[2]),
                              self.work_dir, self.admin, names, self._log("kwok")))
            self.start_seconds["+kube-scheduler+kwok"] = time.monotonic() - began

    def _launch(self, process: P) -> P:
        self.processes.append(process)
        process.start()
        return process

    def _log(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    def close(self) -> None:
        """Stop every process (newest first); delete the work directory if it was ours."""
        for process in reversed(self.processes):
            process.stop(timeout=10)
        self.processes.clear()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _write_files(self) -> ApiServerFiles:
        pki = self.work_dir / "pki"
        authority = CertificateAuthority.create(pki)
        serving = authority.serving_certificate(
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default",
                       "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"))
        service_accounts = service_account_keys(pki)
        self.component_tokens = {user: secrets.token_hex(16) for user in COMPONENT_USERS}
        tokens = [(self.admin_token, ADMIN_USER), *((token, user) for user, token
                                                    in self.component_tokens.items())]
        token_file = pki / "tokens.csv"
        token_file.write_text("".join(f'{token},{user},{user},"{MASTERS_GROUP}"\n'
                                      for token, user in tokens))
        token_file.chmod(0o600)
        audit_policy = self.work_dir / "audit-policy.json"
        audit_policy.write_text(json.dumps(AUDIT_POLICY))
        return ApiServerFiles(
            ca_certificate=authority.certificate, serving_certificate=serving.certificate,
            serving_key=serving.key, service_account_public_key=service_accounts.certificate,
            service_account_private_key=service_accounts.key, token_file=token_file,
            audit_policy=audit_policy, audit_log=self.work_dir / "audit.log")

    def _component_kubeconfig(self, user: str) -> Path:
        client = self.admin.with_token(self.component_tokens[user])
        return write_kubeconfig(self.work_dir / f"{user.replace(':', '-')}.kubeconfig", client,
                                user=user)

    # -- using it --

    @property
    def admin(self) -> KubeClient:
        """A client with full access (system:masters)."""
        if self._admin is None:
            raise RuntimeError("the control plane is not started")
        return self._admin

    @property
    def server_url(self) -> str:
        return self.admin.server

    @property
    def ca_file(self) -> Path:
        return self.admin.ca_file

    @property
    def certificate_authority(self) -> CertificateAuthority:
        """The cluster's CA: it also signs serving certificates for webhooks."""
        return CertificateAuthority(self.ca_file.parent)

    def admin_kubeconfig(self, path: Path | None = None, namespace: str | None = None) -> Path:
        return write_kubeconfig(path or self.work_dir / "admin.kubeconfig", self.admin,
                                user=ADMIN_USER, namespace=namespace)

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Create a namespace and wait until its default ServiceAccount exists (pods are
        refused before that)."""
        self.admin.call("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}})
        path = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        if not poll_until(lambda: self.admin.exists(path),
                          timeout=NAMESPACE_READY_TIMEOUT_SECONDS, interval=0.1):
            raise TimeoutError(f"namespace {name} got no default ServiceAccount in"
                               f" {NAMESPACE_READY_TIMEOUT_SECONDS}s: is the"
                               " kube-controller-manager running?")

    def service_account_token(self, namespace: str, name: str,
                              lifetime_seconds: int = TOKEN_LIFETIME_SECONDS) -> str:
        """A token of the ServiceAccount (the TokenRequest API, as kubelet gets one)."""
        answer = self.admin.call(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": lifetime_seconds}})
        return str(answer["status"]["token"])

    def service_account_client(self, namespace: str, name: str) -> KubeClient:
        return self.admin.with_token(self.service_account_token(namespace, name))

    def write_kubeconfig(self, path: Path, client: KubeClient, *, user: str,
                         namespace: str | None = None) -> Path:
        return write_kubeconfig(path, client, user=user, namespace=namespace)

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """The audit log's events so far (ResponseComplete and Panic stages)."""
        if self._files is None:
            return
        try:
            lines = self._files.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a line being written

    def log_tails(self, size: int = 2000) -> str:
        """The end of each process's log (for a failure message)."""
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(size)}" for p in self.processes)


def fake_node(name: str) -> dict[str, Any]:
    """A Node that kwok runs (no taint: every pod may go there)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                   "type": "kwok"}}}


__all__ = ["KubeApiError", "KubeClient", "KubeControlPlane", "fake_node"]
