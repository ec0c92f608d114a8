"""The control plane's processes, each a ManagedProcess: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes), started the way
controller-runtime's envtest starts them (loopback ports, TLS, a token file), plus the
controllers and fake nodes envtest leaves out. kube.py puts them together."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from durable_producer.local.kube_binaries import (
    ETCD,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KWOK,
    KubeBinaries,
)
from durable_producer.local.kube_client import KubeClient
from durable_producer.local.ports import LOOPBACK, free_port
from durable_producer.local.process import ManagedProcess

# Addresses only this control plane's objects carry; nothing listens on, or routes to, them.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
# kwok gives pods addresses from here: loopback, so that whatever the operator sends to a
# pod's IP (its metrics scrape) stays on this machine.
POD_CIDR = "127.64.0.0/16"
NODE_IP = LOOPBACK
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
PROBE_TIMEOUT_SECONDS = 2.0
# The in-tree admission plugins on by default in kube-apiserver 1.35 include these, which the
# operator meets in real clusters: their order is fixed by the API server, LimitRanger and
# ServiceAccount before the mutating webhooks, ResourceQuota after them.
ADMISSION_PLUGINS = ("NamespaceLifecycle", "LimitRanger", "ServiceAccount",
                     "DefaultStorageClass", "MutatingAdmissionWebhook",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook", "ResourceQuota")


def _http_ok(url: str, context: ssl.SSLContext | None = None,
             headers: dict[str, str] | None = None) -> bool:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_SECONDS,
                                    context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Etcd(ManagedProcess):
    """A single-member etcd on loopback, without fsync (test data only)."""

    name: ClassVar[str] = "etcd"

    def __init__(self, binaries: KubeBinaries, data_dir: Path, log_path: Path) -> None:
        super().__init__(log_path)
        self.binaries = binaries
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    def command(self) -> list[str]:
        peer_url = f"http://{LOOPBACK}:{self.peer_port}"
        return [
            str(self.binaries.path(ETCD)), "--name=local", f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}", "--unsafe-no-fsync=true",
            "--log-level=warn", "--quota-backend-bytes=4294967296",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        return _http_ok(f"{self.client_url}/health")


@dataclass(frozen=True)
class ApiServerFiles:
    """What kube-apiserver reads at start."""

    ca_certificate: Path
    serving_certificate: Path
    serving_key: Path
    service_account_public_key: Path
    service_account_private_key: Path
    token_file: Path
    audit_policy: Path
    audit_log: Path


class KubeApiServer(ManagedProcess):
    """kube-apiserver on a loopback port: TLS, token authentication, RBAC, audit log."""

    name: ClassVar[str] = "kube-apiserver"
    ready_timeout: ClassVar[float] = 120.0

    def __init__(self, binaries: KubeBinaries, etcd: Etcd, files: ApiServerFiles,
                 admin_token: str, log_path: Path) -> None:
        super().__init__(log_path)
        self.binaries = binaries
        self.etcd = etcd
        self.files = files
        self.port = free_port()
        self.admin = KubeClient(self.server_url, files.ca_certificate, admin_token)

    @property
    def server_url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        files = self.files
        return [
            str(self.binaries.path(KUBE_APISERVER)),
            f"--advertise-address={LOOPBACK}", f"--bind-address={LOOPBACK}",
            f"--secure-port={self.port}", f"--etcd-servers={self.etcd.client_url}",
            f"--tls-cert-file={files.serving_certificate}",
            f"--tls-private-key-file={files.serving_key}",
            f"--client-ca-file={files.ca_certificate}",
            f"--token-auth-file={files.token_file}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={files.service_account_public_key}",
            f"--service-account-signing-key-file={files.service_account_private_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=RBAC", "--allow-privileged=true",
            f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
            f"--audit-policy-file={files.audit_policy}", f"--audit-log-path={files.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking", "--profiling=false",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        status, answer = _safe_request(self.admin, "/readyz")
        return status == 200 and answer == "ok"


def _safe_request(client: KubeClient, path: str) -> tuple[int, object]:
    try:
        return client.request("GET", path, timeout=PROBE_TIMEOUT_SECONDS)
    except (urllib.error.URLError, OSError):
        return 0, None


class KubeControllerManager(ManagedProcess):
    """The controllers a cluster runs (garbage collector, namespace, Job, ServiceAccount,
    PV binder, ...); ready once the default namespace's ServiceAccount exists."""

    name: ClassVar[str] = "kube-controller-manager"
    ready_timeout: ClassVar[float] = 120.0

    def __init__(self, binaries: KubeBinaries, kubeconfig: Path, files: ApiServerFiles,
                 admin: KubeClient, log_path: Path) -> None:
        super().__init__(log_path)
        self.binaries = binaries
        self.kubeconfig = kubeconfig
        self.files = files
        self.admin = admin
        self.port = free_port()

    def command(self) -> list[str]:
        return [
            str(self.binaries.path(KUBE_CONTROLLER_MANAGER)),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={LOOPBACK}", f"--secure-port={self.port}",
            "--leader-elect=false", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={self.files.service_account_private_key}",
            f"--root-ca-file={self.files.ca_certificate}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allocate-node-cidrs=false", "--profiling=false",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        status, _ = _safe_request(self.admin, "/api/v1/namespaces/default/serviceaccounts/default")
        return status == 200


class KubeScheduler(ManagedProcess):
    """kube-scheduler: binds pods to the fake nodes."""

    name: ClassVar[str] = "kube-scheduler"
    ready_timeout: ClassVar[float] = 60.0

    def __init__(self, binaries: KubeBinaries, kubeconfig: Path, log_path: Path) -> None:
        super().__init__(log_path)
        self.binaries = binaries
        self.kubeconfig = kubeconfig
        self.port = free_port()

    def command(self) -> list[str]:
        return [
            str(self.binaries.path(KUBE_SCHEDULER)), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={LOOPBACK}", f"--secure-port={self.port}",
            "--leader-elect=false", "--profiling=false",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        # Its own self-signed serving certificate: only "is it up" is asked here.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return _http_ok(f"https://{LOOPBACK}:{self.port}/healthz", context)


JOB_POD_EXIT_ANNOTATION = "local.durable.dev/exit-code"
CONTAINER_STOP_MESSAGE_ANNOTATION = "local.durable.dev/stop-message"
# kwok's behaviour, as its Stage objects: a node becomes Ready; a scheduled pod becomes Running
# (native sidecars started, other init containers completed); a pod of a Job runs until it is
# annotated with JOB_POD_EXIT_ANNOTATION "0" (it succeeds, as a drain Job's pod does once its
# volume is forwarded) or "1" or "4" (it fails with that exit code); a pod being deleted goes
# (what the kubelet does once its containers stopped). A pod annotated with
# CONTAINER_STOP_MESSAGE_ANNOTATION first gets the status the kubelet writes before it deletes
# a pod whose containers stopped: every container terminated with exit code 0, the init
# containers (the agent, a native sidecar) with that termination message (what the agent
# wrote to its termination-message file).
KWOK_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn,
       values: ['True']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Ready, status: "True", reason: KubeletReady, message: "kwok node",
         lastHeartbeatTime: {{ $now | Quote }}, lastTransitionTime: {{ $now | Quote }}}
      addresses:
      - {type: InternalIP, address: {{ NodeIP | Quote }}}
      - {type: Hostname, address: {{ NodeName | Quote }}}
      allocatable: {cpu: "1k", memory: 1Ti, pods: "1M"}
      capacity: {cpu: "1k", memory: 1Ti, pods: "1M"}
      nodeInfo: {kubeletVersion: fake, architecture: amd64, operatingSystem: linux}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-running}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn,
       values: ['True']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
         started: true, state: {running: {startedAt: {{ $now | Quote }}}}}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      {{ if eq .restartPolicy "Always" }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
         started: true, state: {running: {startedAt: {{ $now | Quote }}}}}
      {{ else }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
         state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }},
                              finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      {{ end }}
      {{ with NodeIPsWith .spec.nodeName }}
      hostIP: {{ index . 0 | Quote }}
      {{ end }}
      {{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
              ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - {ip: {{ . | Quote }}}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: job-pod-exit-0}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
    - {key: '.metadata.annotations["EXIT_ANNOTATION"]', operator: In, values: ['0']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: 0, reason: Completed,
                                              startedAt: {{ $now | Quote }},
                                              finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      conditions:
      - {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "False", reason: PodCompleted,
         lastTransitionTime: {{ $now | Quote }}}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: job-pod-exit-1}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
    - {key: '.metadata.annotations["EXIT_ANNOTATION"]', operator: In, values: ['1', '4']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $code := index .metadata.annotations "EXIT_ANNOTATION" }}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: {{ $code }}, reason: Error,
                                              startedAt: {{ $now | Quote }},
                                              finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      conditions:
      - {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "False", reason: PodCompleted,
         lastTransitionTime: {{ $now | Quote }}}
      phase: Failed
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.annotations["STOP_ANNOTATION"]', operator: DoesNotExist}
  next:
    delete: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-stop-with-messages}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.annotations["STOP_ANNOTATION"]', operator: Exists}
    - {key: '.status.phase', operator: In, values: [Running]}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $message := index .metadata.annotations "STOP_ANNOTATION" }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: 0, reason: Completed,
                                              message: {{ $message | Quote }},
                                              startedAt: {{ $now | Quote }},
                                              finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 0,
         started: false, state: {terminated: {exitCode: 0, reason: Completed,
                                              startedAt: {{ $now | Quote }},
                                              finishedAt: {{ $now | Quote }}}}}
      {{ end }}
      conditions:
      - {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete-stopped}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.annotations["STOP_ANNOTATION"]', operator: Exists}
    - {key: '.status.phase', operator: In, values: [Succeeded, Failed]}
  next:
    delete: true
""".replace("EXIT_ANNOTATION", JOB_POD_EXIT_ANNOTATION).replace(
    "STOP_ANNOTATION", CONTAINER_STOP_MESSAGE_ANNOTATION
)
# The annotation that marks a node as kwok's to run.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"


class Kwok(ManagedProcess):
    """kwok: plays the kubelet of the fake nodes (KWOK_STAGES)."""

    name: ClassVar[str] = "kwok"
    ready_timeout: ClassVar[float] = 60.0

    def __init__(self, binaries: KubeBinaries, kubeconfig: Path, config_dir: Path,
                 admin: KubeClient, node_names: tuple[str, ...], log_path: Path) -> None:
        super().__init__(log_path)
        self.binaries = binaries
        self.kubeconfig = kubeconfig
        self.stages = config_dir / "kwok-stages.yaml"
        self.stages.write_text(KWOK_STAGES)
        self.admin = admin
        self.node_names = node_names

    def command(self) -> list[str]:
        return [
            str(self.binaries.path(KWOK)), f"--kubeconfig={self.kubeconfig}",
            f"--config={self.stages}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
            f"--cidr={POD_CIDR}", f"--node-ip={NODE_IP}", "--node-lease-duration-seconds=40",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        return all(self._node_ready(name) for name in self.node_names)

    def _node_ready(self, name: str) -> bool:
        status, node = _safe_request(self.admin, f"/api/v1/nodes/{name}")
        if status != 200 or not isinstance(node, dict):
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
