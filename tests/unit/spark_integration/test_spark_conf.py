"""Spark conf helpers pointing spark-submit / SparkSession at the rendered pod templates."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.contract import DRIVER_TEMPLATE_KEY, EXECUTOR_TEMPLATE_KEY
from durable_producer.spark_integration.cli import main
from durable_producer.spark_integration.conf import (
    DRIVER_CONTAINER_NAME,
    DRIVER_TEMPLATE_FILE,
    EXECUTOR_CONTAINER_NAME,
    EXECUTOR_TEMPLATE_FILE,
    PodTemplates,
    TemplateError,
    apply_to_builder,
    format_properties,
    spark_conf,
    spark_submit_args,
    templates_in_directory,
    write_rendered_templates,
)
from support.spark_templates import executor_template

EXECUTOR_TEMPLATE = executor_template(grace_seconds=120)

DRIVER_TEMPLATE = """\
apiVersion: v1
kind: Pod
spec:
  containers:
    - name: driver
"""


@pytest.fixture
def executor_template(tmp_path: Path) -> Path:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE)
    return path


@pytest.fixture
def driver_template(tmp_path: Path) -> Path:
    path = tmp_path / "driver.yaml"
    path.write_text(DRIVER_TEMPLATE)
    return path


def test_executor_template_conf(executor_template: Path) -> None:
    conf = spark_conf(PodTemplates(executor=executor_template))
    assert conf == {
        EXECUTOR_TEMPLATE_FILE: str(executor_template.resolve()),
        EXECUTOR_CONTAINER_NAME: "spark-kubernetes-executor",
        "spark.kubernetes.executor.label.durable.dev/producer": "orders",
        "spark.kubernetes.executor.terminationGracePeriodSeconds": "120",
        "spark.kubernetes.dynamicAllocation.deleteGracePeriod": "120s",
    }


def test_without_grace_period_spark_keeps_its_default(tmp_path: Path) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE.replace("  terminationGracePeriodSeconds: 120\n", ""))
    conf = spark_conf(PodTemplates(executor=path))
    assert "spark.kubernetes.executor.terminationGracePeriodSeconds" not in conf
    assert "spark.kubernetes.dynamicAllocation.deleteGracePeriod" not in conf


def test_invalid_grace_period_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE.replace("120", "soon"))
    with pytest.raises(TemplateError, match="terminationGracePeriodSeconds"):
        spark_conf(PodTemplates(executor=path))


def test_driver_template_adds_driver_entries(
    executor_template: Path, driver_template: Path
) -> None:
    conf = spark_conf(PodTemplates(executor=executor_template, driver=driver_template))
    assert conf[DRIVER_TEMPLATE_FILE] == str(driver_template.resolve())
    assert conf[DRIVER_CONTAINER_NAME] == "driver"
    assert "spark.kubernetes.driver.label.durable.dev/producer" not in conf


def test_single_container_is_found_without_a_name(tmp_path: Path) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE.replace("spark-kubernetes-executor", "app"))
    assert spark_conf(PodTemplates(executor=path))[EXECUTOR_CONTAINER_NAME] == "app"


def test_requested_container_must_exist(executor_template: Path) -> None:
    with pytest.raises(TemplateError, match=r"no container 'spark'.*spark-kubernetes-executor"):
        spark_conf(PodTemplates(executor=executor_template, executor_container="spark"))


def test_ambiguous_containers_must_be_named(tmp_path: Path) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE.replace("spark-kubernetes-executor", "a") + "    - name: b\n")
    with pytest.raises(TemplateError, match="name the Spark container explicitly"):
        spark_conf(PodTemplates(executor=path))
    conf = spark_conf(PodTemplates(executor=path, executor_container="b"))
    assert conf[EXECUTOR_CONTAINER_NAME] == "b"


def test_executor_template_without_opt_in_label_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(EXECUTOR_TEMPLATE.replace("durable.dev/producer: orders", "app: x"))
    with pytest.raises(TemplateError, match=r"no 'durable\.dev/producer' label"):
        spark_conf(PodTemplates(executor=path))


@pytest.mark.parametrize(
    ("content", "message"),
    [("kind: Service\n", "not a Pod manifest"), ("a: [unclosed\n", "not valid YAML")],
)
def test_unusable_template_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "executor.yaml"
    path.write_text(content)
    with pytest.raises(TemplateError, match=message):
        spark_conf(PodTemplates(executor=path))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"kind: Pod\nspec: x\n", "spec must be a mapping, not str"),
        (b"kind: Pod\nspec:\n  containers: [1]\n", "containers must be a list of mappings"),
        (b"kind: Pod\nspec:\n  containers: {name: x}\n", "containers must be a list, not"),
        (b"kind: Pod\nmetadata: x\n", "metadata must be a mapping"),
        (b"kind: Pod\nmetadata:\n  labels: [a]\n", "labels must be a mapping, not list"),
        (b"\x00\xff\x10binary", "cannot read pod template"),
    ],
)
def test_a_malformed_template_is_one_clear_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """Each was an AttributeError or UnicodeDecodeError traceback (also through --producer,
    from a ConfigMap edited by hand)."""
    path = tmp_path / "executor.yaml"
    path.write_bytes(content)
    with pytest.raises(TemplateError, match=message):
        spark_conf(PodTemplates(executor=path))


def test_templates_written_where_no_directory_can_be_is_one_clear_error(tmp_path: Path) -> None:
    """--output-dir naming a file was a FileExistsError traceback."""
    (tmp_path / "afile").write_text("")
    rendered = {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE}
    for directory in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(TemplateError, match=f"cannot write the pod templates into {directory}"):
            write_rendered_templates(rendered, directory)


def test_missing_template_file(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot read pod template"):
        spark_conf(PodTemplates(executor=tmp_path / "absent.yaml"))


def test_rendered_templates_are_written_and_used(tmp_path: Path) -> None:
    rendered = {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE, DRIVER_TEMPLATE_KEY: DRIVER_TEMPLATE}
    templates = write_rendered_templates(rendered, tmp_path / "templates")
    assert templates.executor.read_text() == EXECUTOR_TEMPLATE
    assert templates.driver is not None
    assert templates.driver.read_text() == DRIVER_TEMPLATE
    conf = spark_conf(templates)
    assert conf[EXECUTOR_TEMPLATE_FILE] == str(
        (tmp_path / "templates" / EXECUTOR_TEMPLATE_KEY).resolve()
    )


def test_rewriting_rendered_templates_drops_a_stale_driver_template(tmp_path: Path) -> None:
    rendered = {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE, DRIVER_TEMPLATE_KEY: DRIVER_TEMPLATE}
    write_rendered_templates(rendered, tmp_path)
    templates = write_rendered_templates({EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE}, tmp_path)
    assert templates.driver is None
    assert not (tmp_path / DRIVER_TEMPLATE_KEY).exists()


def test_rendered_templates_need_an_executor_entry(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=EXECUTOR_TEMPLATE_KEY):
        write_rendered_templates({DRIVER_TEMPLATE_KEY: DRIVER_TEMPLATE}, tmp_path)


def test_templates_directory_without_executor_template(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="mount"):
        templates_in_directory(tmp_path)


def test_apply_to_a_real_spark_builder(executor_template: Path) -> None:
    from pyspark.sql import SparkSession

    conf = spark_conf(PodTemplates(executor=executor_template))
    builder = SparkSession.builder.master("local[1]")
    assert apply_to_builder(builder, conf) is builder
    assert {key: builder._options[key] for key in conf} == conf


def test_spark_submit_args_and_properties() -> None:
    conf = {"b.key": "2", "a.key": "x y"}
    assert spark_submit_args(conf) == ["--conf", "a.key=x y", "--conf", "b.key=2"]
    assert format_properties(conf) == "a.key x y\nb.key 2\n"


def test_cli_prints_conf_flags(
    executor_template: Path, driver_template: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "conf",
            "--executor-template",
            str(executor_template),
            "--driver-template",
            str(driver_template),
        ]
    )
    assert code == 0
    args = shlex.split(capsys.readouterr().out)
    assert args[0::2] == ["--conf"] * 7
    entries = dict(arg.split("=", 1) for arg in args[1::2])
    assert entries[EXECUTOR_TEMPLATE_FILE] == str(executor_template.resolve())
    assert entries[DRIVER_CONTAINER_NAME] == "driver"


def test_cli_reads_a_mounted_templates_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rendered_templates({EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE}, tmp_path)
    assert main(["conf", "--templates-dir", str(tmp_path), "--format", "properties"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{EXECUTOR_CONTAINER_NAME} spark-kubernetes-executor" in lines
    assert len(lines) == 5


def test_cli_reports_template_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conf", "--executor-template", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read pod template" in capsys.readouterr().err


def test_module_entry_point(executor_template: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_producer.spark_integration",
            "conf",
            "--executor-template",
            str(executor_template),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{EXECUTOR_TEMPLATE_FILE}={executor_template.resolve()}" in result.stdout
