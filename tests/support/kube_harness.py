"""The real operator against the real API server (the session's local control plane).

A test gets a fresh namespace (``kube_api``) and installs the chart there with ``helm
install`` (``start_chart_operator``): its RBAC, its ServiceAccount, its peering object and its
MutatingWebhookConfiguration pointed by ``webhook.url`` at the operator on 127.0.0.1, with a
certificate signed by the cluster's CA (openssl). The operator then runs as the chart's
Deployment would run it (its command line and environment are read from the installed
release), as a local process (`kopf run`) authenticated with its ServiceAccount's token: RBAC
is enforced. Pod creates go through the whole admission chain, webhook included, and kwok runs
the admitted pods.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_producer import contract
from durable_producer.local.kube_client import KubeClient
from durable_producer.local.kube_pki import CertificateAuthority
from durable_producer.local.kube_processes import JOB_POD_EXIT_ANNOTATION
from durable_producer.local.ports import LOOPBACK, free_port
from durable_producer.operator.model import model
from support.kube_cluster import AuditedRequest, Cluster, audited_requests
from support.operator_harness import OPERATOR_START_TIMEOUT_SECONDS, OperatorProcess
from support.outcome import call_failed
from support.tools import CHART_DIR, helm_binary
from support.waiting import wait_for
from support.webhook_harness import AGENT_IMAGE, WebhookOperator

# What tests outside kopf's own settings change: the pool timer runs every half second.
# The volume pool's claim grace in tests: a claim the webhook made lives this long without its
# pod before the pool takes the volume back. With 1 s, a pod the API server was still creating
# on a loaded machine lost its volume (deleted as never used; the pod then stayed Pending).
CLAIM_GRACE = "10"
TEST_OPERATOR_ENV = {"DURABLE_PRODUCER_POOL_INTERVAL_SECONDS": "0.5", "PYTHONUNBUFFERED": "1"}
HELM_TIMEOUT_SECONDS = 180
FAILED_LOG_LINES = 200  # of each operator replica, printed after a failed test
WEBHOOK_SECRET = "operator-webhook-tls"


class KubeApi:
    """One test's namespace on the real API server, as the admin sees it."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.client: KubeClient = cluster.admin
        self.namespace = namespace
        self.collection_path = (
            f"/apis/{model.GROUP}/{model.VERSION}/namespaces/{namespace}/{model.PLURAL}")
        self.pods_path = f"/api/v1/namespaces/{namespace}/pods"
        self.pvcs_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
        self.jobs_path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        self.configmaps_path = f"/api/v1/namespaces/{namespace}/configmaps"
        self.events_path = f"/api/v1/namespaces/{namespace}/events"

    def call(self, method: str, path: str, body: Any = None,
             content_type: str | None = None) -> tuple[int, Any]:
        return self.client.request(method, path, body, content_type=content_type)

    def try_create(self, manifest: dict[str, Any]) -> tuple[int, Any]:
        """POST a DurableProducer; (status, answer): the API server's schema and CEL run."""
        return self.call("POST", self.collection_path, manifest)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        status, created = self.try_create(manifest)
        assert status == 201, created
        return dict(created)

    def get(self, name: str) -> dict[str, Any] | None:
        status, found = self.call("GET", f"{self.collection_path}/{name}")
        return found if status == 200 else None

    def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the spec (the API server bumps metadata.generation)."""
        status, patched = self.call("PATCH", f"{self.collection_path}/{name}",
                                    {"spec": spec_patch})
        assert status == 200, patched
        return dict(patched)

    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        status, answer = self.call("PATCH", f"{self.collection_path}/{name}",
                                   {"metadata": {"annotations": annotations}})
        assert status == 200, answer

    def delete(self, name: str, propagation: str | None = None) -> None:
        path = f"{self.collection_path}/{name}"
        if propagation:
            path += f"?propagationPolicy={propagation}"
        status, answer = self.call("DELETE", path)
        assert status == 200, answer

    def opted_in_pods(self) -> dict[str, dict[str, Any]]:
        """The namespace's pods with the opt-in label (the chart's own operator pods run here
        too, as kwok runs its Deployment)."""
        return self.items(f"{self.pods_path}?labelSelector={contract.PRODUCER_LABEL}")

    def items(self, path: str) -> dict[str, dict[str, Any]]:
        status, listing = self.call("GET", path)
        assert status == 200, listing
        return {item["metadata"]["name"]: item for item in listing.get("items") or []}

    def create_pod(self, pod: dict[str, Any], *, dry_run: bool = False) -> tuple[int, Any]:
        """POST a pod through the whole admission chain (webhook included)."""
        status, answer, _ = self.create_pod_warned(pod, dry_run=dry_run)
        return status, answer

    def create_pod_warned(self, pod: dict[str, Any], *, dry_run: bool = False
                          ) -> tuple[int, Any, list[str]]:
        """``create_pod``, and the warnings the API server passed on (kubectl prints them)."""
        pod = json.loads(json.dumps(pod))
        pod.setdefault("metadata", {})["namespace"] = self.namespace
        return self.client.exchange("POST", self.pods_path + ("?dryRun=All" if dry_run else ""),
                                    pod)

    def run_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create the pod and wait until kwok reports it Running (its volume bound)."""
        status, created = self.create_pod(pod)
        assert status == 201, created
        name = created["metadata"]["name"]
        try:
            return wait_for(lambda: (found := self.items(self.pods_path).get(name))
                            and (found.get("status") or {}).get("phase") == "Running" and found,
                            timeout=60, what=f"pod {name} Running")
        except AssertionError as error:
            pod = self.items(self.pods_path).get(name) or {}
            claims = {n: ((c.get("status") or {}).get("phase"), c["spec"].get("volumeName"),
                          (c["metadata"].get("annotations") or {}).get(
                              "volume.kubernetes.io/selected-node"))
                      for n, c in self.items(self.pvcs_path).items()}
            events = [(e.get("reason"), e.get("message")) for e in self.events()
                      if (e.get("involvedObject") or {}).get("name") == name]
            raise AssertionError(f"{error}: node {pod.get('spec', {}).get('nodeName')},"
                                 f" status {pod.get('status')}, claims {claims},"
                                 f" events {events}") from None

    def delete_pod(self, name: str) -> None:
        status, answer = self.call("DELETE", f"{self.pods_path}/{name}")
        assert status == 200, answer

    def finish_drains(self, exit_code: str = "0") -> list[str]:
        """End every running Job pod of the namespace (drain Jobs) with ``exit_code``, as the
        agent in drain mode would exit; kwok does the rest. The Jobs' names."""
        finished = []
        for name, pod in self.items(f"{self.pods_path}?labelSelector=batch.kubernetes.io/job-name"
                                    ).items():
            annotations = pod["metadata"].get("annotations") or {}
            if (pod.get("status") or {}).get("phase") != "Running" or (
                    JOB_POD_EXIT_ANNOTATION in annotations):
                continue
            status, _ = self.call("PATCH", f"{self.pods_path}/{name}", {"metadata": {
                "annotations": {JOB_POD_EXIT_ANNOTATION: exit_code}}})
            if status == 200:
                finished.append(pod["metadata"]["labels"]["batch.kubernetes.io/job-name"])
        return finished

    def events(self) -> list[dict[str, Any]]:
        return list(self.items(self.events_path).values())

    def requests(self) -> list[AuditedRequest]:
        """Every request made in this namespace so far (the API server's audit log)."""
        return [r for r in audited_requests(self.cluster.plane)
                if r.namespace == self.namespace]

    def cluster_requests(self) -> list[AuditedRequest]:
        """Every request to cluster-scoped objects so far (StorageClasses, ...)."""
        return [r for r in audited_requests(self.cluster.plane) if r.namespace is None]


@pytest.fixture()
def kube_api(control_plane: Cluster, kube_namespace: str) -> KubeApi:
    return KubeApi(control_plane, kube_namespace)


@dataclass
class ChartRelease:
    """The chart installed in the test's namespace, and what its operator runs with."""

    name: str
    namespace: str
    container: dict[str, Any]
    service_account: str
    webhook_port: int
    certificate: Path
    key: Path
    ca_file: Path
    kubeconfig: Path
    values: dict[str, Any]

    @property
    def fullname(self) -> str:
        return f"{self.name}-durable-producer"


def _helm(cluster: Cluster, *args: str, values: dict[str, Any] | None = None
          ) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary()), f"--kubeconfig={cluster.kubeconfig}", *args]
    if values is not None:
        command += ["--values", "-"]
    return subprocess.run(command, input=json.dumps(values) if values is not None else None,
                          capture_output=True, text=True, timeout=HELM_TIMEOUT_SECONDS,
                          check=False)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def install_chart(cluster: Cluster, namespace: str, work_dir: Path,
                  values: dict[str, Any] | None = None, *,
                  workload_namespace: str | None = None) -> ChartRelease:
    """`helm install` the chart into ``namespace``, its webhook pointed at 127.0.0.1 and
    serving the pods of ``workload_namespace`` (default: the same namespace)."""
    served = workload_namespace or namespace
    port = free_port()
    authority = CertificateAuthority(cluster.plane.ca_file.parent)
    pair = authority.serving_certificate(f"webhook-{namespace}")
    cluster.kubectl("-n", namespace, "create", "secret", "tls", WEBHOOK_SECRET,
                    f"--cert={pair.certificate}", f"--key={pair.key}")
    name = f"dp-{namespace}"
    chosen = _merge({
        # Cluster-wide (the chart's default): with watchNamespaces the operator starts about
        # a minute late (NEW-2, test_chart_on_api_server.py).
        "operator": {"logLevel": "verbose", "peeringLifetimeSeconds": 6},
        "agent": {"image": {"repository": AGENT_IMAGE.rsplit(":", 1)[0],
                            "tag": AGENT_IMAGE.rsplit(":", 1)[1]}},
        # Only this test's namespace: a release left by another test never sees its pods.
        "webhook": {"url": f"https://{LOOPBACK}:{port}", "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                  "values": [served]}]}, "tls": {
            "existingSecret": WEBHOOK_SECRET,
            "caBundle": base64.b64encode(cluster.plane.ca_file.read_bytes()).decode()}},
    }, values or {})
    # The CRDs are the session's (kubectl apply -f crds/); helm would take them over.
    result = _helm(cluster, "install", name, str(CHART_DIR), "--namespace", namespace,
                   "--skip-crds", values=chosen)
    assert result.returncode == 0, f"helm install failed:\n{result.stderr}"
    manifest = _helm(cluster, "get", "manifest", name, "--namespace", namespace)
    assert manifest.returncode == 0, manifest.stderr
    objects = [doc for doc in yaml.safe_load_all(manifest.stdout) if doc]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    account = pod_spec["serviceAccountName"]
    token = cluster.plane.service_account_token(namespace, account)
    kubeconfig = cluster.plane.write_kubeconfig(
        work_dir / f"{name}.kubeconfig", cluster.admin.with_token(token),
        user=f"system:serviceaccount:{namespace}:{account}", namespace=namespace)
    return ChartRelease(name=name, namespace=namespace, container=container,
                        service_account=account, webhook_port=port,
                        certificate=pair.certificate, key=pair.key,
                        ca_file=cluster.plane.ca_file, kubeconfig=kubeconfig, values=chosen)


# The chart's cluster-scoped objects: helm cannot remove them once a test deleted the
# namespace (and with it the release's record).
CLUSTER_SCOPED = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                  "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                  "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                  "/apis/kopf.dev/v1/clusterkopfpeerings")


def uninstall_chart(cluster: Cluster, release: ChartRelease) -> None:
    _helm(cluster, "uninstall", release.name, "--namespace", release.namespace, "--wait=false")
    selector = urllib.parse.quote(f"app.kubernetes.io/instance={release.name}")
    for collection in CLUSTER_SCOPED:
        cluster.admin.request("DELETE", f"{collection}?labelSelector={selector}")


@dataclass
class ChartOperator(WebhookOperator):
    """A running replica: its process, webhook address, and /metrics and /readyz."""

    replica: str = ""
    metrics_url: str = ""
    readyz_url: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    namespace: str = ""

    def review(self, pod: dict[str, Any], *, dry_run: bool = False,
               operation: str = "CREATE") -> dict[str, Any]:
        """An AdmissionReview of the pod in the test's namespace (the pod is not changed)."""
        placed = json.loads(json.dumps(pod))
        placed.setdefault("metadata", {})["namespace"] = self.namespace
        return super().review(placed, dry_run=dry_run, operation=operation)


def operator_command(release: ChartRelease, liveness_url: str) -> list[str]:
    """The chart's `kopf run ...` with a local liveness address."""
    command = list(release.container["command"]) + list(release.container.get("args") or [])
    assert command[0] == "kopf", command
    return [sys.executable, "-m", "kopf",
            *(f"--liveness={liveness_url}" if arg.startswith("--liveness=") else arg
              for arg in command[1:])]


def operator_environment(release: ChartRelease, replica: str, webhook_port: int,
                         metrics_port: int, overrides: dict[str, str]) -> dict[str, str]:
    """The chart's env for the container (the pod's name for fieldRefs), with local paths
    and ports for the certificate, the webhook server and /metrics."""
    env: dict[str, str] = {}
    for item in release.container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == (
                "metadata.name"):
            env[item["name"]] = replica
    return {**os.environ, **env, **TEST_OPERATOR_ENV,
            "KUBECONFIG": str(release.kubeconfig),
            "DURABLE_PRODUCER_WEBHOOK_ADDR": LOOPBACK,
            "DURABLE_PRODUCER_WEBHOOK_PORT": str(webhook_port),
            "DURABLE_PRODUCER_WEBHOOK_CERT_FILE": str(release.certificate),
            "DURABLE_PRODUCER_WEBHOOK_KEY_FILE": str(release.key),
            "DURABLE_PRODUCER_METRICS_ADDR": LOOPBACK,
            "DURABLE_PRODUCER_METRICS_PORT": str(metrics_port), **overrides}


def _ready(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class ChartOperators:
    """Installs the chart (once, on first use) and starts operator replicas as it runs them."""

    def __init__(self, cluster: Cluster, namespace: str, work_dir: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.work_dir = work_dir
        self.release: ChartRelease | None = None
        self.started: list[ChartOperator] = []
        self.own_namespace: str | None = None

    def install(self, values: dict[str, Any] | None = None, *,
                own_namespace: bool = False) -> ChartRelease:
        """``own_namespace``: the release in a namespace of its own, as in production (a
        test that deletes its namespace would delete the operator's ServiceAccount with it:
        its token stops working 60 s later, mid-test)."""
        if self.release is None:
            release_namespace = self.namespace
            if own_namespace:
                self.own_namespace = release_namespace = f"{self.namespace}-operator"
                self.cluster.plane.create_namespace(release_namespace)
            self.release = install_chart(self.cluster, release_namespace, self.work_dir, values,
                                         workload_namespace=self.namespace)
        return self.release

    def start(self, *, replica: str | None = None, values: dict[str, Any] | None = None,
              wait_ready: bool = True, own_namespace: bool = False,
              **env: str) -> ChartOperator:
        """Start one replica. The first one alive serves the webhook at webhook.url; others
        listen on ports of their own (tests post reviews to them directly)."""
        release = self.install(values, own_namespace=own_namespace)
        name = replica or f"operator-{len(self.started)}"
        url_taken = any(o.process.process.poll() is None and o.base_url.endswith(
            f":{release.webhook_port}") for o in self.started)
        webhook_port = free_port() if url_taken else release.webhook_port
        metrics_port, liveness_port = free_port(), free_port()
        liveness_url = f"http://{LOOPBACK}:{liveness_port}/healthz"
        environment = operator_environment(release, name, webhook_port, metrics_port, env)
        log_path = self.work_dir / f"{name}.log"
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(operator_command(release, liveness_url),
                                       stdout=log_file, stderr=subprocess.STDOUT,
                                       env=environment, cwd=self.work_dir)
        operator = ChartOperator(
            process=OperatorProcess(process=process, liveness_url=liveness_url,
                                    log_path=log_path),
            base_url=f"https://{LOOPBACK}:{webhook_port}", ca_file=release.ca_file,
            replica=name, metrics_url=f"http://{LOOPBACK}:{metrics_port}/metrics",
            readyz_url=f"http://{LOOPBACK}:{metrics_port}/readyz", environment=environment,
            namespace=self.namespace)
        self.started.append(operator)
        if wait_ready:
            wait_for(lambda: process.poll() is not None or _ready(operator.readyz_url),
                     timeout=OPERATOR_START_TIMEOUT_SECONDS * 2, interval=0.1,
                     what=f"{name}'s /readyz")
            assert process.poll() is None, f"the operator exited:\n{operator.process.log()}"
        return operator

    def stop_all(self) -> None:
        for operator in self.started:
            operator.process.stop()
        if self.release is not None:
            uninstall_chart(self.cluster, self.release)
        if self.own_namespace is not None:
            self.cluster.admin.request("DELETE", f"/api/v1/namespaces/{self.own_namespace}")


@pytest.fixture()
def chart_operators(request: pytest.FixtureRequest, control_plane: Cluster, kube_namespace: str,
                    tmp_path: Path) -> Iterator[ChartOperators]:
    operators = ChartOperators(control_plane, kube_namespace, tmp_path)
    try:
        yield operators
    finally:
        operators.stop_all()
        if call_failed(request):  # what the operators did, in the report of the failed test
            for operator in operators.started:
                print(f"--- {operator.replica}'s log (last {FAILED_LOG_LINES} lines) ---")
                print("\n".join(operator.process.log().splitlines()[-FAILED_LOG_LINES:]))


@pytest.fixture()
def start_chart_operator(chart_operators: ChartOperators) -> Callable[..., ChartOperator]:
    """Start a replica of the chart's operator (installing the chart first)."""
    return chart_operators.start


def query(path: str, **params: str) -> str:
    return f"{path}?{urllib.parse.urlencode(params)}"


__all__ = ["ChartOperator", "ChartOperators", "KubeApi", "chart_operators", "kube_api",
           "start_chart_operator"]
