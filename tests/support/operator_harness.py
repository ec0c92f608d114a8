"""A Kubernetes API emulator (kmock), for the one operator test that needs what a real API
server cannot give (an API call that hangs: test_webhook_security.py); the operator tests run
on the real API server (kube_harness.py). Also the operator process record both use.

The emulator runs on its own event loop in a background thread; tests talk to it over HTTP,
as kubectl would. It has no admission: ``create`` validates objects against the CRD schema.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kmock
import pytest

from durable_producer.operator import crd
from durable_producer.operator.model import model

NAMESPACE = "default"
COLLECTION_PATH = f"/apis/{model.GROUP}/{model.VERSION}/namespaces/{NAMESPACE}/{model.PLURAL}"
OPERATOR_START_TIMEOUT_SECONDS = 30.0
OPERATOR_STOP_TIMEOUT_SECONDS = 10.0

# Everything the operator might touch must be declared, or the emulator answers 404.
DECLARED_RESOURCES: dict[str, kmock.ResourceInfo] = {
    f"{model.GROUP}/{model.VERSION}/{model.PLURAL}": kmock.ResourceInfo(
        kind=model.KIND,
        singular=model.SINGULAR,
        shortnames=set(model.SHORT_NAMES),
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    # The volume pool (pool_actions, claims) lists pods, PVCs and drain Jobs.
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True),
    "v1/persistentvolumeclaims": kmock.ResourceInfo(kind="PersistentVolumeClaim", namespaced=True),
    "batch/v1/jobs": kmock.ResourceInfo(kind="Job", namespaced=True),
    # The Spark pod templates (spark_actions) live in a ConfigMap per DurableProducer.
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True),
    # kopf waits for namespaces to be discoverable even when it never lists them (cluster-wide).
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False),
    "events.k8s.io/v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False
    ),
}


class KubernetesApi:
    """The emulator, seen through HTTP (with the API server's admission done client-side)."""

    def __init__(self, base_url: str, loop: asyncio.AbstractEventLoop, emulator: Any) -> None:
        self.base_url = base_url
        self._loop = loop
        self._emulator = emulator
        # create() checks the OpenAPI schema only (the emulator has no admission).
        self._validator = jsonschema.Draft202012Validator(crd.strict_schema(crd.resource_schema()))

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def create(self, manifest: dict[str, Any], *, admit: bool = True) -> dict[str, Any]:
        """POST a DurableProducer; admit=False skips the CRD schema check (invalid-spec test)."""
        if admit:
            self._validator.validate(manifest)
        body = json.loads(json.dumps(manifest))
        # What the API server adds on creation (kopf's JSON patches test resourceVersion).
        body.setdefault("metadata", {}).update(
            namespace=NAMESPACE,
            generation=1,
            resourceVersion="1",
            uid=str(uuid.uuid4()),
            creationTimestamp="2026-01-01T00:00:00Z",
        )
        status, created = self._call("POST", COLLECTION_PATH, body)
        assert status in (200, 201), created
        return created

    def get(self, name: str) -> dict[str, Any] | None:
        status, found = self._call("GET", f"{COLLECTION_PATH}/{name}")
        return found if status == 200 else None


@pytest.fixture()
def kubernetes_api() -> Iterator[KubernetesApi]:
    """A fresh emulator on a free loopback port, stopped after the test."""
    ready = threading.Event()
    started: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        started["stop"] = stop
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for resource, info in DECLARED_RESOURCES.items():
                emulator.resources[resource] = info
            started["emulator"] = emulator
            started["url"] = f"http://127.0.0.1:{server.port}"
            started["loop"] = asyncio.get_running_loop()
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(timeout=10), "the Kubernetes emulator did not start"
    loop: asyncio.AbstractEventLoop = started["loop"]
    try:
        yield KubernetesApi(started["url"], loop, started["emulator"])
    finally:
        loop.call_soon_threadsafe(started["stop"].set)
        thread.join(timeout=10)


@dataclass(frozen=True)
class OperatorProcess:
    process: subprocess.Popen[bytes]
    liveness_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (kopf's graceful stop), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=OPERATOR_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=OPERATOR_STOP_TIMEOUT_SECONDS)


def _write_kubeconfig(path: Path, server_url: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server_url}}],
        "users": [{"name": "tester", "user": {"token": "any-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tester", "namespace": NAMESPACE},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(json.dumps(config))


def _liveness_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
