"""The chart-generated webhook certificate is made once and reused: helm's `lookup` path.

`helm install` and `helm upgrade` render the chart with access to the cluster, and the chart
looks the webhook's Secret up: found, its certificate, key and CA are reused, so the caBundle
and the Secret stay the same on every upgrade, and so does the operator pods' checksum (no
restart, no window in which the API server trusts a CA the replicas do not serve).

No kube-apiserver runs here. The real helm binary renders against kmock's emulator with
`helm template --dry-run=server`, the same rendering with cluster access that install and
upgrade do (the release bookkeeping around it is not exercised: kmock cannot decode the
protobuf in which helm stores releases). The emulator starts empty, as a first install sees
it; the Secret of the first render is then created in it, as the install would; every later
render must give that certificate back.

What this cannot show without a cluster: the API server calling the webhook with that
caBundle, and the kubelet refreshing the mounted Secret (kopf reloads changed files).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.kube_discovery import DiscoveryServer, custom_resources_from_crds
from support.tools import CHART_DIR, helm_binary, objects_of_kind, single_object

pytestmark = pytest.mark.integration

NAMESPACE = "durable-system"
SECRET_PATH = f"/api/v1/namespaces/{NAMESPACE}/secrets"


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[DiscoveryServer, Path]]:
    helm_binary()  # skip before starting anything when helm is missing
    with DiscoveryServer(custom_resources_from_crds()) as server:
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")


def render_with_cluster(kubeconfig: Path, *extra: str) -> list[dict[str, Any]]:
    """What `helm upgrade --install` renders: the chart with cluster access (lookup works)."""
    result = subprocess.run(
        [str(helm_binary()), "--kubeconfig", str(kubeconfig), "template", "dp", str(CHART_DIR),
         "--namespace", NAMESPACE, "--dry-run=server", "--disable-openapi-validation", *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def as_installed(manifest: dict[str, Any]) -> dict[str, Any]:
    """The object as `helm install` leaves it: annotated as the release's own."""
    manifest["metadata"].setdefault("annotations", {}).update({
        "meta.helm.sh/release-name": "dp", "meta.helm.sh/release-namespace": NAMESPACE})
    return manifest


def certificate_material(objects: list[dict[str, Any]]) -> dict[str, str]:
    secret = single_object(objects, "Secret")
    (webhook,) = single_object(objects, "MutatingWebhookConfiguration")["webhooks"]
    pod = single_object(objects, "Deployment")["spec"]["template"]
    return {
        "tls.crt": secret["data"]["tls.crt"],
        "tls.key": secret["data"]["tls.key"],
        "ca.crt": secret["data"]["ca.crt"],
        "caBundle": webhook["clientConfig"]["caBundle"],
        "checksum": pod["metadata"]["annotations"]["checksum/webhook-tls"],
    }


def test_upgrades_reuse_the_certificate_the_install_made(
    cluster: tuple[DiscoveryServer, Path],
) -> None:
    server, kubeconfig = cluster
    install = render_with_cluster(kubeconfig)
    installed = certificate_material(install)
    server.create(SECRET_PATH, as_installed(single_object(install, "Secret")))

    first_upgrade = certificate_material(render_with_cluster(kubeconfig))
    second_upgrade = certificate_material(
        render_with_cluster(kubeconfig, "--set", "operator.logLevel=debug"))

    assert first_upgrade == installed
    assert second_upgrade == installed
    assert installed["caBundle"] == installed["ca.crt"]
    assert b"BEGIN CERTIFICATE" in base64.b64decode(installed["caBundle"])


def test_without_the_secret_each_render_makes_a_new_certificate(
    cluster: tuple[DiscoveryServer, Path],
) -> None:
    """The control: the reuse above comes from the lookup, not from a fixed seed."""
    _, kubeconfig = cluster

    first = certificate_material(render_with_cluster(kubeconfig))
    second = certificate_material(render_with_cluster(kubeconfig))

    assert first["caBundle"] != second["caBundle"]
    assert first["checksum"] != second["checksum"]


def test_a_secret_without_a_ca_is_not_reused(cluster: tuple[DiscoveryServer, Path]) -> None:
    """A Secret of that name that the chart did not make (no ca.crt) cannot give a caBundle:
    the chart makes a complete new set instead of a configuration that trusts nothing."""
    server, kubeconfig = cluster
    install = render_with_cluster(kubeconfig)
    foreign = single_object(install, "Secret")
    del foreign["data"]["ca.crt"]
    server.create(SECRET_PATH, as_installed(foreign))

    upgrade = certificate_material(render_with_cluster(kubeconfig))

    assert upgrade["tls.crt"] != foreign["data"]["tls.crt"]
    assert upgrade["caBundle"] == upgrade["ca.crt"]
    assert not objects_of_kind(install, "Certificate")
