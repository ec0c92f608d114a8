"""A Kubernetes API emulator (kmock) and the real operator process (`kopf run`) against it.

The emulator runs on its own event loop in a background thread; tests talk to it over HTTP,
as kubectl would. It has no admission: the helpers below validate objects against the CRD
schema and bump metadata.generation on spec changes, as the API server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kmock
import pytest

from durable_producer.operator import crd, model
from support.crd_validation import ApiServerValidation
from support.waiting import wait_for

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


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    group: str | None
    plural: str | None
    subresource: str | None
    name: str | None
    watch: bool
    user_agent: str
    data: Any

    @property
    def verb(self) -> str:
        """The RBAC verb Kubernetes would authorize this request as."""
        if self.method == "GET":
            if self.watch:
                return "watch"
            return "get" if self.name else "list"
        return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[
            self.method
        ]


class KubernetesApi:
    """The emulator, seen through HTTP (with the API server's admission done client-side)."""

    def __init__(self, base_url: str, loop: asyncio.AbstractEventLoop, emulator: Any) -> None:
        self.base_url = base_url
        self._loop = loop
        self._emulator = emulator
        # create() checks the OpenAPI schema only, like an API server whose CRD predates its CEL
        # rules; admission_errors() is what a current one says.
        self._validator = jsonschema.Draft202012Validator(crd.strict_schema(crd.resource_schema()))
        self._api_server = ApiServerValidation(
            crd.resource_schema(), crd.strict_schema(crd.resource_schema())
        )

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

    def admission_errors(self, manifest: dict[str, Any]) -> list[str]:
        """Why an API server with this CRD (its CEL rules too) would refuse the object."""
        return self._api_server.errors(manifest)

    def refuse_creates(self, resource: str, status: int, message: str) -> None:
        """From now on answer every create of ``resource`` (e.g. "batch/v1/jobs") in the
        namespace with an API error and store nothing, as a real API server refusing it would
        (e.g. 403 for new objects in a namespace being deleted)."""
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api" if group_version == "v1" else "/apis"
        path = f"{prefix}/{group_version}/namespaces/{NAMESPACE}/{plural}"
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "reason": "Forbidden" if status == 403 else "Invalid", "code": status}
        emulator = self._emulator

        def refuse(request: Any) -> dict[str, Any]:
            name = (request.data or {}).get("metadata", {}).get("name")
            if name:
                with contextlib.suppress(KeyError):
                    del emulator.objects[resource, NAMESPACE, name]  # the emulator stores first
            return body

        async def install() -> None:
            emulator[f"post {path}"] << status << refuse

        asyncio.run_coroutine_threadsafe(install(), self._loop).result(timeout=10)

    def get(self, name: str) -> dict[str, Any] | None:
        status, found = self._call("GET", f"{COLLECTION_PATH}/{name}")
        return found if status == 200 else None

    def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the spec and bump metadata.generation, as the API server does."""
        current = self.get(name)
        assert current is not None
        merged = {"spec": json.loads(json.dumps(current["spec"]))}
        _deep_merge(merged["spec"], spec_patch)
        self._validator.validate({**current, **merged, "status": {}})
        generation = current["metadata"].get("generation", 1) + 1
        status, patched = self._call(
            "PATCH",
            f"{COLLECTION_PATH}/{name}",
            {"spec": spec_patch, "metadata": {"generation": generation}},
        )
        assert status == 200, patched
        return patched

    def delete(self, name: str) -> None:
        status, answer = self._call("DELETE", f"{COLLECTION_PATH}/{name}")
        assert status == 200, answer

    def requests(self) -> list[RecordedRequest]:
        """Every request the emulator has served so far."""

        async def snapshot() -> list[RecordedRequest]:
            return [
                RecordedRequest(
                    method=str(request.method.value).upper(),
                    path=request.url.path,
                    group=request.resource.group if request.resource is not None else None,
                    plural=request.resource.plural if request.resource is not None else None,
                    subresource=request.subresource,
                    name=request.name,
                    watch=request.params.get("watch") == "true",
                    user_agent=request.headers.get("User-Agent", ""),
                    data=request.data,
                )
                for request in self._emulator
            ]

        return asyncio.run_coroutine_threadsafe(snapshot(), self._loop).result(timeout=10)


def _deep_merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = value


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


@pytest.fixture()
def start_operator(
    kubernetes_api: KubernetesApi, tmp_path: Path
) -> Iterator[Callable[[], OperatorProcess]]:
    """Starts `kopf run` of our handlers, as the Helm chart runs it; stops all of them after."""
    kubeconfig = tmp_path / "kubeconfig"
    _write_kubeconfig(kubeconfig, kubernetes_api.base_url)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        liveness_url = f"http://127.0.0.1:{_free_port()}/healthz"
        log_path = tmp_path / f"operator-{len(started)}.log"
        command = [
            sys.executable, "-m", "kopf", "run",
            "-m", "durable_producer.operator.handlers",
            "--standalone", "--all-namespaces", f"--liveness={liveness_url}", "--verbose",
        ]  # fmt: skip
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=tmp_path
            )
        operator = OperatorProcess(process=process, liveness_url=liveness_url, log_path=log_path)
        started.append(operator)
        wait_for(
            lambda: process.poll() is not None or _liveness_ok(liveness_url),
            timeout=OPERATOR_START_TIMEOUT_SECONDS,
            what="the operator's liveness endpoint",
        )
        assert process.poll() is None, f"the operator exited early:\n{operator.log()}"
        return operator

    try:
        yield start
    finally:
        for operator in started:
            operator.stop()


@pytest.fixture()
def operator_process(start_operator: Callable[[], OperatorProcess]) -> OperatorProcess:
    """One running operator."""
    return start_operator()
