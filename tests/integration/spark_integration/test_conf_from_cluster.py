"""``conf --producer NAME``: templates fetched from the DurableProducer's ConfigMap via the API."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from durable_producer.contract import DRIVER_TEMPLATE_KEY, EXECUTOR_TEMPLATE_KEY
from durable_producer.spark_integration.cli import main
from durable_producer.spark_integration.cluster import templates_configmap_name
from durable_producer.spark_integration.conf import EXECUTOR_CONTAINER_NAME, EXECUTOR_TEMPLATE_FILE
from integration.spark_integration.spark_harness import Emulator
from support.spark_templates import executor_template

pytestmark = pytest.mark.integration

EXECUTOR_TEMPLATE = executor_template(grace_seconds=90)


def test_cli_fetches_templates_of_a_producer(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.create(
        "/api/v1/namespaces/data/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": templates_configmap_name("orders"), "namespace": "data"},
            "data": {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE},
        },
    )
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    output = tmp_path / "templates"
    code = main(
        [
            "conf",
            "--producer",
            "orders",
            "--namespace",
            "data",
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
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    code = main(
        [
            "conf",
            "--configmap",
            "absent",
            "--kubeconfig",
            str(kubeconfig),
            "--output-dir",
            str(tmp_path / "templates"),
        ]
    )
    assert code == 2
    assert "cannot read ConfigMap default/absent with the Spark pod templates (404" in (
        capsys.readouterr().err
    )
