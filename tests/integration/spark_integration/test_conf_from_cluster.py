"""``conf --producer NAME``: templates fetched from the DurableProducer's ConfigMap through the
real API server (its CA passed in SSL_CERT_FILE as well: NEW-3, see
test_rendered_templates_on_kubernetes.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from durable_producer.contract import DRIVER_TEMPLATE_KEY, EXECUTOR_TEMPLATE_KEY
from durable_producer.spark_integration.cli import main
from durable_producer.spark_integration.cluster import templates_configmap_name
from durable_producer.spark_integration.conf import EXECUTOR_CONTAINER_NAME, EXECUTOR_TEMPLATE_FILE
from integration.operator.kube_harness import KubeApi, kube_api
from support.spark_templates import executor_template

__all__ = ["kube_api"]

pytestmark = pytest.mark.integration

EXECUTOR_TEMPLATE = executor_template(grace_seconds=90)


@pytest.fixture()
def kubeconfig(kube_api: KubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The admin's kubeconfig, in the test's namespace; the CA trusted by OpenSSL too."""
    monkeypatch.setenv("SSL_CERT_FILE", str(kube_api.client.ca_file))  # NEW-3
    return kube_api.cluster.plane.admin_kubeconfig(tmp_path / "kubeconfig", kube_api.namespace)


def test_cli_fetches_templates_of_a_producer(
    kube_api: KubeApi, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = kube_api.call("POST", kube_api.configmaps_path, {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": templates_configmap_name("orders")},
        "data": {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE},
    })
    assert status == 201, answer
    output = tmp_path / "templates"
    code = main(
        [
            "conf",
            "--producer",
            "orders",
            "--namespace",
            kube_api.namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--output-dir",
            str(output),
        ]
    )
    assert code == 0, capsys.readouterr().err
    args = shlex.split(capsys.readouterr().out)
    entries = dict(arg.split("=", 1) for arg in args[1::2])
    assert entries[EXECUTOR_TEMPLATE_FILE] == str((output / EXECUTOR_TEMPLATE_KEY).resolve())
    assert entries[EXECUTOR_CONTAINER_NAME] == "spark-kubernetes-executor"
    assert (output / EXECUTOR_TEMPLATE_KEY).read_text() == EXECUTOR_TEMPLATE
    assert not (output / DRIVER_TEMPLATE_KEY).exists()


def test_missing_configmap_is_a_clear_error(
    kube_api: KubeApi, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "conf",
            "--configmap",
            "absent",
            "--namespace",
            kube_api.namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--output-dir",
            str(tmp_path / "templates"),
        ]
    )
    assert code == 2
    expected = f"cannot read ConfigMap {kube_api.namespace}/absent with the Spark pod templates"
    assert f"{expected} (404" in capsys.readouterr().err
