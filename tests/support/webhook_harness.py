"""Building blocks of the webhook tests: AdmissionReviews as the API server sends them, the
JSONPatch applied as it applies it, the pods and DurableProducers the tests use, and a replica
seen through its HTTPS webhook server (``WebhookOperator``).

Also the operator against kmock (``start_webhook_operator``, with operator_harness's
emulator), for the one test that needs an API server that hangs (test_webhook_security.py).
No test functions here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import kmock
import pytest

from durable_producer.local.ports import free_port
from support import operator_harness
from support.operator_harness import (
    NAMESPACE,
    KubernetesApi,
    OperatorProcess,
)
from support.waiting import wait_for

POOL_RESOURCES: dict[str, kmock.ResourceInfo] = {
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True),
    "v1/persistentvolumeclaims": kmock.ResourceInfo(kind="PersistentVolumeClaim", namespaced=True),
    "batch/v1/jobs": kmock.ResourceInfo(kind="Job", namespaced=True),
}
WEBHOOK_PATH = "/attach-buffer-agent"
AGENT_IMAGE = "registry.example/durable-agent:test"


@pytest.fixture(autouse=True)
def pool_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declare pods, PVCs and Jobs in the emulator (before it starts)."""
    for resource, info in POOL_RESOURCES.items():
        monkeypatch.setitem(operator_harness.DECLARED_RESOURCES, resource, info)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (kopf's own generator needs oscrypto, which
    cannot load OpenSSL 3); the CLI is what a cluster admin would use too."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is needed to make the webhook certificate")
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@dataclass
class WebhookOperator:
    """The running operator: its process, webhook URL and the CA to trust."""

    process: OperatorProcess
    base_url: str
    ca_file: Path

    def post(self, payload: bytes, path: str = WEBHOOK_PATH) -> tuple[int, Any]:
        """POST raw bytes over verified HTTPS; (HTTP status, decoded JSON or text)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            self.base_url + path, data=payload, method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15, context=context) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    def review(self, pod: dict[str, Any], *, dry_run: bool = False,
               operation: str = "CREATE") -> dict[str, Any]:
        """Send an AdmissionReview for the pod (created by default); the `response` part."""
        review = admission_review(pod, dry_run=dry_run, operation=operation)
        status, answer = self.post(json.dumps(review).encode())
        assert status == 200, answer
        return answer["response"]


def admission_review(pod: dict[str, Any], *, dry_run: bool = False,
                     operation: str = "CREATE") -> dict[str, Any]:
    """What the API server sends for `kubectl create` of a pod (admission.k8s.io/v1); for an
    UPDATE, the pod is both the new and the old object."""
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(operation,
                                                                         "DeleteOptions")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": (pod.get("metadata") or {}).get("namespace", NAMESPACE),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None if operation == "CREATE" else pod,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
        },
    }


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The pod with the webhook's JSONPatch applied (as the API server does)."""
    if "patch" not in response:
        return json.loads(json.dumps(pod))
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, ops, in_place=False)


def opted_in_pod(name: str, producer: str = "orders", **spec_fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": "orders", "durable.dev/producer": producer},
        },
        "spec": {"containers": [{"name": "app", "image": "shop/orders:1"}], **spec_fields},
    }


def durable_producer(name: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": "durable.dev/v1alpha1",
        "kind": "DurableProducer",
        "metadata": {"name": name},
        "spec": {
            "kafka": {"bootstrapServers": ["kafka-0.kafka:9092"]},
            "throughput": {"peakBytesPerSecond": 2**20},
            "outageSeconds": 600,
        },
    }


def answer_with(kubernetes_api: KubernetesApi, request: str, *payload: Any) -> None:
    """Make the emulator answer ``request`` ("get /api/v1/...", any query) with ``payload``
    (e.g. 403 and a Status), as an API server would without RBAC for it."""
    reactions = kubernetes_api._emulator[request]
    for item in payload:
        reactions = reactions << item


def _webhook_accepts_tls(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture()
def start_webhook_operator(
    kubernetes_api: KubernetesApi, tmp_path: Path
) -> Iterator[Callable[..., WebhookOperator]]:
    """Starts `kopf run` with a webhook certificate (so the webhook is served); stops it after."""
    kubeconfig = tmp_path / "kubeconfig"
    operator_harness._write_kubeconfig(kubeconfig, kubernetes_api.base_url)
    cert, key = make_certificate(tmp_path)
    started: list[WebhookOperator] = []

    def start(*, serve_webhook: bool = True, peering: str | None = None,
              **pool_env: str) -> WebhookOperator:
        """``serve_webhook=False``: wait for the liveness endpoint instead (no webhook server
        runs when the volume pool is switched off). ``peering``: run as the chart does, as one
        of several replicas sharing the handlers through that peering object (not
        standalone)."""
        port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONUNBUFFERED": "1",
            "DURABLE_PRODUCER_AGENT_IMAGE": AGENT_IMAGE,
            "DURABLE_PRODUCER_WEBHOOK_ADDR": "127.0.0.1",
            "DURABLE_PRODUCER_WEBHOOK_PORT": str(port),
            "DURABLE_PRODUCER_WEBHOOK_CERT_FILE": str(cert),
            "DURABLE_PRODUCER_WEBHOOK_KEY_FILE": str(key),
            "DURABLE_PRODUCER_POOL_INTERVAL_SECONDS": "0.5",
            **pool_env,
        }
        liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        log_path = tmp_path / f"operator-{len(started)}.log"
        command = [
            sys.executable, "-m", "kopf", "run",
            "-m", "durable_producer.operator.handlers",
            "--standalone" if peering is None else f"--peering={peering}",
            "--all-namespaces", f"--liveness={liveness_url}", "--verbose",
        ]  # fmt: skip
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path
            )
        operator = WebhookOperator(
            process=OperatorProcess(process=process, liveness_url=liveness_url,
                                    log_path=log_path),
            base_url=f"https://127.0.0.1:{port}",
            ca_file=cert,
        )
        started.append(operator)
        if serve_webhook:
            wait_for(lambda: process.poll() is not None or _webhook_accepts_tls(port),
                     timeout=operator_harness.OPERATOR_START_TIMEOUT_SECONDS,
                     what="the operator's webhook server")
        else:
            wait_for(lambda: process.poll() is not None or operator_harness._liveness_ok(
                liveness_url), timeout=operator_harness.OPERATOR_START_TIMEOUT_SECONDS,
                what="the operator's liveness endpoint")
        assert process.poll() is None, f"the operator exited early:\n{operator.process.log()}"
        return operator

    try:
        yield start
    finally:
        for operator in started:
            operator.process.stop()
