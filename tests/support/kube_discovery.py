"""kmock's Kubernetes emulator as the API server helm and kubectl talk to (no kube-apiserver
runs here): discovery of the built-in resources (kmock's bundled data) and any custom ones,
objects stored and served like an API server's, on a free loopback port in a thread.

Two gaps of kmock 0.8 are patched: the core group's resource list names its groupVersion
"/v1" (kubectl and helm only map core kinds from "v1"), and /version reports an old
Kubernetes (helm checks the chart's kubeVersion against it).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import kmock
import yaml

KUBERNETES_VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0",
                      "platform": "linux/amd64"}  # fmt: skip


class DiscoveryServer:
    """kmock's emulator on a free loopback port, served from a background thread."""

    def __init__(self, custom_resources: dict[str, kmock.ResourceInfo]) -> None:
        self._custom_resources = custom_resources
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock-discovery", daemon=True)
        self.url = ""

    def __enter__(self) -> DiscoveryServer:
        self._thread.start()
        if not self._ready.wait(timeout=30) or self._error is not None:
            self.__exit__()
            raise RuntimeError(f"the API emulator did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the starting thread
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources.load_bundled()
            for key, info in self._custom_resources.items():
                emulator.resources[key] = info
            core = await (await server.client.get("/api/v1")).json()
            core["groupVersion"] = "v1"
            emulator["get /api/v1"] << core
            emulator["get /version"] << KUBERNETES_VERSION
            self.url = f"http://127.0.0.1:{server.port}"
            self._ready.set()
            await self._stop.wait()

    def create(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """POST an object (as `kubectl create` would); the stored object."""
        request = urllib.request.Request(
            self.url + path, data=json.dumps(manifest).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            created: dict[str, Any] = json.loads(response.read())
        return created

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "emulator",
                          "context": {"cluster": "emulator", "user": "tester"}}],
            "current-context": "emulator",
        }))
        return path


def custom_resources_from_crds() -> dict[str, kmock.ResourceInfo]:
    """What `kubectl apply -f crds/` would make discoverable."""
    resources = {}
    for path in sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml")):
        definition = yaml.safe_load(path.read_text())
        spec = definition["spec"]
        for served in spec["versions"]:
            resources[f"{spec['group']}/{served['name']}/{spec['names']['plural']}"] = (
                kmock.ResourceInfo(
                    kind=spec["names"]["kind"],
                    singular=spec["names"]["singular"],
                    namespaced=spec["scope"] == "Namespaced",
                    shortnames=set(spec["names"].get("shortNames", [])),
                    verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                    subresources=set(served.get("subresources", {})),
                )
            )
    return resources
