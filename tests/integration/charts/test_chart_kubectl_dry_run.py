"""`kubectl apply --dry-run=client` of the rendered chart, with the real kubectl binary.

kubectl needs an API server even for a client-side dry run: it maps each kind to a resource
through API discovery. No kube-apiserver runs here, so kmock's KubernetesEmulator (with its
bundled discovery data for the built-in resources) stands in for discovery. The emulator
serves no OpenAPI documents, so kubectl's own schema validation is off (--validate=false);
the schemas are checked by kubernetes-validate in tests/unit/charts/test_chart_render.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from support.tools import REPO_ROOT, kubectl_binary, render_chart

pytestmark = pytest.mark.integration


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
            # kmock 0.8 reports the core group's version list as groupVersion "/v1";
            # kubectl only maps core kinds (Service, ServiceAccount...) from "v1".
            core = await (await server.client.get("/api/v1")).json()
            core["groupVersion"] = "v1"
            emulator["get /api/v1"] << core
            self.url = f"http://127.0.0.1:{server.port}"
            self._ready.set()
            await self._stop.wait()


def custom_resources_from_crds() -> dict[str, kmock.ResourceInfo]:
    """What `kubectl apply -f crds/` would make discoverable."""
    resources = {}
    for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
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


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    kubectl_binary()  # skip before starting anything when kubectl is missing
    with DiscoveryServer(custom_resources_from_crds()) as server:
        path = tmp_path_factory.mktemp("kubectl") / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server.url}}],
            "users": [{"name": "tester", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "emulator",
                          "context": {"cluster": "emulator", "user": "tester"}}],
            "current-context": "emulator",
        }))
        yield path


def kubectl_dry_run_apply(kubeconfig: Path, objects: list[dict[str, Any]],
                          namespace: str | None = None) -> subprocess.CompletedProcess[str]:
    """Like docs/install.md's `helm template ... | kubectl apply -f -` (objects carry their
    own namespaces, so no --namespace unless given)."""
    namespace_args = ["--namespace", namespace] if namespace else []
    return subprocess.run(
        [str(kubectl_binary()), "--kubeconfig", str(kubeconfig), "--cache-dir",
         str(kubeconfig.parent / "cache"), "apply", "--dry-run=client", "--validate=false",
         *namespace_args, "-f", "-"],
        input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=60,
        check=False,
    )


def expected_lines(objects: list[dict[str, Any]]) -> set[str]:
    """kubectl's "<resource>.<group>/<name> created (dry run)" line for each object."""
    resources = {
        "ServiceAccount": "serviceaccount", "Service": "service",
        "Deployment": "deployment.apps",
        "ClusterRole": "clusterrole.rbac.authorization.k8s.io",
        "ClusterRoleBinding": "clusterrolebinding.rbac.authorization.k8s.io",
        "Role": "role.rbac.authorization.k8s.io",
        "RoleBinding": "rolebinding.rbac.authorization.k8s.io",
        "CustomResourceDefinition": "customresourcedefinition.apiextensions.k8s.io",
        "DurableProducer": "durableproducer.durable.dev",
        "Secret": "secret",
        "MutatingWebhookConfiguration":
            "mutatingwebhookconfiguration.admissionregistration.k8s.io",
    }
    return {f"{resources[o['kind']]}/{o['metadata']['name']} created (dry run)" for o in objects}


def test_default_chart_applies(kubeconfig: Path) -> None:
    objects = render_chart()
    result = kubectl_dry_run_apply(kubeconfig, objects)

    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(objects)


def test_chart_with_watched_namespaces_applies(kubeconfig: Path) -> None:
    objects = render_chart({"operator": {"watchNamespaces": ["team-a", "team-b"]},
                            "rbac": {"features": {"volumePool": True, "drainJobs": True}}})
    result = kubectl_dry_run_apply(kubeconfig, objects)

    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(objects)
    assert sum(o["kind"] == "Role" for o in objects) == 2


@pytest.mark.parametrize("values", [
    # docs/install.md's kubectl route: the certificate made once, the same on every render.
    {"webhook": {"tls": {"existingSecret": "durable-producer-webhook-cert",
                         "caBundle": "QUJDRA=="}}},
    # The volume pool switched off: no webhook, RBAC of the core and the Spark templates only.
    {"webhook": {"enabled": False},
     "rbac": {"features": {"podAudit": False, "volumePool": False, "drainJobs": False}}},
], ids=["provided-certificate", "volume-pool-off"])
def test_chart_variants_apply(kubeconfig: Path, values: dict[str, Any]) -> None:
    objects = render_chart(values)
    result = kubectl_dry_run_apply(kubeconfig, objects)

    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(objects)
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_the_install_docs_example_applies_once_the_crd_is_known(kubeconfig: Path) -> None:
    text = (REPO_ROOT / "docs" / "install.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]
    examples = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "DurableProducer"]

    result = kubectl_dry_run_apply(kubeconfig, examples, namespace="team-a")

    assert examples
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(examples)


def test_an_unknown_api_version_is_refused(kubeconfig: Path) -> None:
    """The dry run is a real check: kubectl refuses kinds the API does not serve."""
    deployment = next(o for o in render_chart() if o["kind"] == "Deployment")
    deployment["apiVersion"] = "apps/v1beta9"

    result = kubectl_dry_run_apply(kubeconfig, [deployment])

    assert result.returncode != 0
    assert 'no matches for kind "Deployment" in version "apps/v1beta9"' in result.stderr
