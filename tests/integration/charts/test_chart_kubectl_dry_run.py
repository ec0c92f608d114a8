"""`kubectl apply --dry-run=server` of the rendered chart on the real API server.

The objects go through the API server's whole write path (schemas, defaulting, validation,
admission) without being stored: what `helm template ... | kubectl apply -f -` meets. The
chart's CRDs are tried by tests/integration/operator/test_crds_on_api_server.py; the
session's (kubectl apply -f crds/) serve the custom resources here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.kube_cluster import Cluster
from support.tools import REPO_ROOT, kubectl_binary, render_chart

pytestmark = pytest.mark.integration


@pytest.fixture()
def kubeconfig(control_plane: Cluster, kube_namespace: str) -> Path:
    return control_plane.kubeconfig


@pytest.fixture()
def other_namespaces(control_plane: Cluster, kube_namespace: str) -> Iterator[list[str]]:
    """Two more namespaces (for watchNamespaces), deleted after the test."""
    names = [f"{kube_namespace}-a", f"{kube_namespace}-b"]
    for name in names:
        control_plane.plane.create_namespace(name)
    yield names
    for name in names:
        control_plane.admin.request("DELETE", f"/api/v1/namespaces/{name}")


def chart(kube_namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered chart in the test's namespace, without its CRDs (see above)."""
    return [o for o in render_chart(values, namespace=kube_namespace)
            if o["kind"] != "CustomResourceDefinition"]


def kubectl_dry_run_apply(kubeconfig: Path, objects: list[dict[str, Any]],
                          namespace: str | None = None) -> subprocess.CompletedProcess[str]:
    """Like docs/install.md's `helm template ... | kubectl apply -f -` (objects carry their
    own namespaces, so no --namespace unless given)."""
    namespace_args = ["--namespace", namespace] if namespace else []
    return subprocess.run(
        [str(kubectl_binary()), "--kubeconfig", str(kubeconfig), "--cache-dir",
         str(kubeconfig.parent / "cache"), "apply", "--dry-run=server",
         *namespace_args, "-f", "-"],
        input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=60,
        check=False,
    )


def expected_lines(objects: list[dict[str, Any]]) -> set[str]:
    """kubectl's "<resource>.<group>/<name> created (server dry run)" line for each object."""
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
    return {f"{resources[o['kind']]}/{o['metadata']['name']} created (server dry run)"
            for o in objects}


def test_default_chart_applies(kubeconfig: Path, kube_namespace: str) -> None:
    objects = chart(kube_namespace)
    result = kubectl_dry_run_apply(kubeconfig, objects)

    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(objects)


def test_chart_with_watched_namespaces_applies(
    kubeconfig: Path, kube_namespace: str, other_namespaces: list[str]
) -> None:
    objects = chart(kube_namespace, {"operator": {"watchNamespaces": other_namespaces},
                                     "rbac": {"features": {"volumePool": True,
                                                           "drainJobs": True}}})
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
def test_chart_variants_apply(
    kubeconfig: Path, kube_namespace: str, values: dict[str, Any]
) -> None:
    objects = chart(kube_namespace, values)
    result = kubectl_dry_run_apply(kubeconfig, objects)

    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(objects)
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_the_install_docs_example_applies_once_the_crd_is_known(
    kubeconfig: Path, control_plane: Cluster
) -> None:
    text = (REPO_ROOT / "docs" / "install.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]
    examples = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "DurableProducer"]

    docs_namespace = "team-a"  # the examples' own
    if not control_plane.admin.exists(f"/api/v1/namespaces/{docs_namespace}"):
        control_plane.plane.create_namespace(docs_namespace)
    result = kubectl_dry_run_apply(kubeconfig, examples, namespace=docs_namespace)

    assert examples
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == expected_lines(examples)


def test_an_unknown_api_version_is_refused(kubeconfig: Path, kube_namespace: str) -> None:
    """The dry run is a real check: kubectl refuses kinds the API does not serve."""
    deployment = next(o for o in chart(kube_namespace) if o["kind"] == "Deployment")
    deployment["apiVersion"] = "apps/v1beta9"

    result = kubectl_dry_run_apply(kubeconfig, [deployment])

    assert result.returncode != 0
    assert 'no matches for kind "Deployment" in version "apps/v1beta9"' in result.stderr


def test_an_invalid_object_is_refused_by_the_api_server(
    kubeconfig: Path, kube_namespace: str
) -> None:
    """What only a server dry run sees: the Deployment's own validation."""
    deployment = next(o for o in chart(kube_namespace) if o["kind"] == "Deployment")
    deployment["spec"]["replicas"] = -1

    result = kubectl_dry_run_apply(kubeconfig, [deployment])

    assert result.returncode != 0
    assert "spec.replicas: Invalid value: -1" in result.stderr
