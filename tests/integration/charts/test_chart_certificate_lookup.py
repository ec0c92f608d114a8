"""The chart-generated webhook certificate is made once and reused: helm's `lookup` path.

`helm install` and `helm upgrade` render the chart with access to the cluster, and the chart
looks the webhook's Secret up: found, its certificate, key and CA are reused, so the caBundle
and the Secret stay the same on every upgrade, and so does the operator pods' checksum (no
restart, no window in which the API server trusts a CA the replicas do not serve).

The real helm binary installs and upgrades the chart on the real API server (release records
included; --skip-crds: the session's cluster-wide CRDs serve); each test has its own
namespace, and its release is uninstalled after it.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from support.kube_cluster import Cluster
from support.tools import CHART_DIR, helm_binary, objects_of_kind, single_object

pytestmark = pytest.mark.integration

@dataclass
class Release:
    cluster: Cluster
    namespace: str

    @property
    def name(self) -> str:
        return f"dp-{self.namespace}"

    def helm(self, *args: str) -> str:
        # Only this namespace's pods go to the webhook (a leftover never sees other tests').
        selector = json.dumps({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [self.namespace]}]})
        result = subprocess.run(
            [str(helm_binary()), "--kubeconfig", str(self.cluster.kubeconfig), *args,
             self.name, str(CHART_DIR), "--namespace", self.namespace,
             "--set-json", f"webhook.namespaceSelector={selector}"],
            capture_output=True, text=True, timeout=180, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def render_with_cluster(self) -> list[dict[str, Any]]:
        """What `helm upgrade --install` renders: the chart with cluster access (lookup)."""
        out = self.helm("template", "--dry-run=server", "--skip-crds")
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def installed(self) -> list[dict[str, Any]]:
        """The release's objects as the API server has them now."""
        manifest = subprocess.run(
            [str(helm_binary()), "--kubeconfig", str(self.cluster.kubeconfig), "get",
             "manifest", self.name, "--namespace", self.namespace],
            capture_output=True, text=True, timeout=60, check=True).stdout
        objects = []
        for doc in yaml.safe_load_all(manifest):
            if doc and doc["kind"] in ("Secret", "MutatingWebhookConfiguration", "Deployment"):
                path = {"Secret": f"/api/v1/namespaces/{self.namespace}/secrets",
                        "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/"
                                                        "v1/mutatingwebhookconfigurations",
                        "Deployment": f"/apis/apps/v1/namespaces/{self.namespace}/deployments",
                        }[doc["kind"]]
                objects.append(self.cluster.admin.call(
                    "GET", f"{path}/{doc['metadata']['name']}"))
        return objects


@pytest.fixture()
def release(control_plane: Cluster, kube_namespace: str) -> Iterator[Release]:
    helm_binary()  # skip early when helm is missing
    chosen = Release(control_plane, kube_namespace)
    yield chosen
    subprocess.run([str(helm_binary()), "--kubeconfig", str(control_plane.kubeconfig),
                    "uninstall", chosen.name, "--namespace", kube_namespace, "--wait=false"],
                   capture_output=True, timeout=120, check=False)


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


def test_upgrades_reuse_the_certificate_the_install_made(release: Release) -> None:
    release.helm("install", "--skip-crds")
    installed = certificate_material(release.installed())

    release.helm("upgrade", "--skip-crds")
    first_upgrade = certificate_material(release.installed())
    release.helm("upgrade", "--skip-crds", "--set", "operator.logLevel=debug")
    second_upgrade = certificate_material(release.installed())

    assert first_upgrade == installed
    assert second_upgrade == installed
    assert installed["caBundle"] == installed["ca.crt"]
    assert b"BEGIN CERTIFICATE" in base64.b64decode(installed["caBundle"])


def test_without_the_secret_each_render_makes_a_new_certificate(release: Release) -> None:
    """The control: the reuse above comes from the lookup, not from a fixed seed."""
    first = certificate_material(release.render_with_cluster())
    second = certificate_material(release.render_with_cluster())

    assert first["caBundle"] != second["caBundle"]
    assert first["checksum"] != second["checksum"]


def test_a_secret_without_a_ca_is_not_reused(release: Release) -> None:
    """A Secret of that name that the chart did not make (no ca.crt) cannot give a caBundle:
    the chart makes a complete new set instead of a configuration that trusts nothing."""
    install = release.render_with_cluster()
    foreign = single_object(install, "Secret")
    del foreign["data"]["ca.crt"]
    foreign["metadata"].setdefault("annotations", {}).update({  # as if an install made it
        "meta.helm.sh/release-name": release.name,
        "meta.helm.sh/release-namespace": release.namespace})
    release.cluster.admin.call("POST", f"/api/v1/namespaces/{release.namespace}/secrets",
                               foreign)

    upgrade = certificate_material(release.render_with_cluster())

    assert upgrade["tls.crt"] != foreign["data"]["tls.crt"]
    assert upgrade["caBundle"] == upgrade["ca.crt"]
    assert not objects_of_kind(install, "Certificate")
