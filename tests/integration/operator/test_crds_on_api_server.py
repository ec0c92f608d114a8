"""The shipped CRDs on the real API server (kube-apiserver v1.35), as users apply them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from durable_producer.local.kube import KubeControlPlane
from support.kube_cluster import CRDS_DIR, Cluster
from support.tools import CHART_DIR, helm_binary

pytestmark = pytest.mark.integration


def test_the_shipped_crds_are_accepted_by_kubectl_apply(control_plane: Cluster) -> None:
    result = control_plane.kubectl("apply", "--server-side", "--dry-run=server",
                                   "--force-conflicts", "-f", str(CRDS_DIR), check=False)

    assert result.returncode == 0, result.stderr


def test_helm_install_on_a_fresh_cluster_installs_the_crds(
    control_plane: Cluster, tmp_path: Path
) -> None:
    """A cluster of its own (the session's already has the CRDs): what a first install meets."""
    with KubeControlPlane(tmp_path / "fresh") as fresh:
        kubeconfig = fresh.admin_kubeconfig()
        result = subprocess.run(
            [str(helm_binary()), f"--kubeconfig={kubeconfig}", "install", "dp", str(CHART_DIR),
             "--namespace", "durable-system", "--create-namespace"],
            capture_output=True, text=True, timeout=180, check=False)

        assert result.returncode == 0, result.stderr
        assert fresh.admin.exists(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/durableproducers.durable.dev")
