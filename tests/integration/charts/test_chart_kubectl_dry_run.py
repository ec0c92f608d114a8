"""`kubectl apply --dry-run=client` of the rendered chart, with the real kubectl binary.

kubectl needs an API server even for a client-side dry run: it maps each kind to a resource
through API discovery. No kube-apiserver runs here, so kmock's KubernetesEmulator (with its
bundled discovery data for the built-in resources; support/kube_discovery.py) stands in.
The emulator serves no OpenAPI documents, so kubectl's own schema validation is off
(--validate=false); the schemas are checked by kubernetes-validate in
tests/unit/charts/test_chart_render.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.kube_discovery import DiscoveryServer, custom_resources_from_crds
from support.tools import REPO_ROOT, kubectl_binary, render_chart

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    kubectl_binary()  # skip before starting anything when kubectl is missing
    with DiscoveryServer(custom_resources_from_crds()) as server:
        yield server.write_kubeconfig(tmp_path_factory.mktemp("kubectl") / "kubeconfig")


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
        "PodDisruptionBudget": "poddisruptionbudget.policy",
        "ClusterKopfPeering": "clusterkopfpeering.kopf.dev",
        "KopfPeering": "kopfpeering.kopf.dev",
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
