"""SparkApplication manifests (kubeflow spark-operator v1beta2) whose executors write via agents.

Validated against the spark-operator's own CRD schema (vendored excerpt, see
tests/support/spark_operator_crd/README.md); the embedded pod templates as Pods.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from durable_producer.contract import BOOTSTRAP_TWIN_ENV, PRODUCER_LABEL
from durable_producer.operator.decide.spark_templates import rendered_templates
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.spark_integration.cli import main
from durable_producer.spark_integration.conf import (
    DRIVER_TEMPLATE_KEY,
    EXECUTOR_GRACE_PERIOD,
    EXECUTOR_TEMPLATE_FILE,
    PodTemplates,
    TemplateError,
    write_rendered_templates,
)
from durable_producer.spark_integration.spark_application import (
    ApplicationSettings,
    spark_application,
)
from support.spark_operator import spark_application_problems
from support.spark_templates import executor_template

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
IMAGE = "registry.example.com/shop/spark-jobs:1.0"

# The commands printed at the top of the example manifests (templates from --templates-dir
# here instead of --producer: the same rendered ConfigMap data, without a cluster).
EXAMPLE_COMMANDS = {
    "sparkapplication-batch.yaml": [
        "--name=orders-batch",
        "--main-application-file=local:///opt/jobs/write_events.py",
        "--arg=orders",
    ],
    "sparkapplication-streaming.yaml": [
        "--name=orders-stream",
        "--streaming",
        "--main-application-file=local:///opt/jobs/stream_events.py",
        "--arg=orders",
        "--arg=s3a://shop-spark/checkpoints/orders-stream",
    ],
}


def orders_templates(tmp_path: Path, **spark: Any) -> Path:
    """The templates the operator renders for examples/durableproducer-minimal.yaml."""
    manifest = yaml.safe_load((EXAMPLES / "durableproducer-minimal.yaml").read_text())
    spec = copy.deepcopy(manifest["spec"])
    spec.setdefault("spark", {}).update(spark)
    rendered = rendered_templates(
        manifest["metadata"]["name"], DurableProducerSpec.model_validate(spec)
    )
    directory = tmp_path / "templates"
    write_rendered_templates(rendered, directory)
    return directory


def generate(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    templates = orders_templates(tmp_path)
    assert (
        main(
            [
                "sparkapplication",
                f"--templates-dir={templates}",
                "--namespace=shop",
                f"--image={IMAGE}",
                *args,
            ]
        )
        == 0
    )
    manifest: dict[str, Any] = yaml.safe_load(capsys.readouterr().out)
    return manifest


def assert_pod_template_is_a_valid_pod(template: dict[str, Any]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", **template}
    pod["metadata"] = {"name": "executor", **pod.get("metadata", {})}
    pod["spec"]["containers"] = [{"image": "spark", **c} for c in pod["spec"]["containers"]]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize("example", sorted(EXAMPLE_COMMANDS))
def test_examples_are_what_the_generator_prints_and_valid(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generated = generate(tmp_path, capsys, *EXAMPLE_COMMANDS[example])
    committed = yaml.safe_load((EXAMPLES / example).read_text())
    assert committed == generated
    assert spark_application_problems(committed) == []
    assert_pod_template_is_a_valid_pod(committed["spec"]["executor"]["template"])


def test_executors_opt_in_get_the_agent_address_and_a_drain_grace_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = generate(tmp_path, capsys, "--name=job", "--main-application-file=local:///j.py")
    executor = manifest["spec"]["executor"]
    assert executor["labels"] == {PRODUCER_LABEL: "orders"}
    assert executor["template"]["metadata"]["labels"] == {PRODUCER_LABEL: "orders"}
    env = {e["name"]: e["value"] for e in executor["template"]["spec"]["containers"][0]["env"]}
    assert env[BOOTSTRAP_TWIN_ENV] == "127.0.0.1:9092"
    assert executor["terminationGracePeriodSeconds"] == 60
    conf = manifest["spec"]["sparkConf"]
    assert conf[EXECUTOR_GRACE_PERIOD] == "60"  # Spark would otherwise override it with 30 s
    assert conf[f"spark.kubernetes.executor.label.{PRODUCER_LABEL}"] == "orders"
    assert EXECUTOR_TEMPLATE_FILE not in conf  # the spark-operator writes the template file
    assert manifest["spec"]["restartPolicy"] == {"type": "Never"}
    assert "apiVersion" not in executor["template"]  # a PodTemplateSpec, not a Pod


def test_driver_template_options_and_extra_conf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    templates = orders_templates(tmp_path, driverTemplate=True)
    assert (templates / DRIVER_TEMPLATE_KEY).is_file()
    argv = [
        "sparkapplication",
        f"--templates-dir={templates}",
        "--namespace=shop",
        f"--image={IMAGE}",
        "--name=job",
        "--main-application-file=local:///j.py",
        "--executor-instances=5",
        "--executor-memory=8g",
        "--spark-version=3.5.3",
        "--conf=spark.task.maxFailures=8",
    ]
    assert main(argv) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    assert spark_application_problems(manifest) == []
    spec = manifest["spec"]
    assert spec["driver"]["labels"] == {PRODUCER_LABEL: "orders"}
    assert spec["driver"]["terminationGracePeriodSeconds"] == 60
    assert_pod_template_is_a_valid_pod(spec["driver"]["template"])
    assert (spec["executor"]["instances"], spec["executor"]["memory"]) == (5, "8g")
    assert spec["sparkVersion"] == "3.5.3"
    assert spec["sparkConf"]["spark.task.maxFailures"] == "8"


def test_the_schema_check_catches_what_the_api_server_would_refuse_or_prune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = generate(tmp_path, capsys, "--name=job", "--main-application-file=local:///j.py")
    assert spark_application_problems(manifest) == []
    broken = copy.deepcopy(manifest)
    broken["spec"]["mode"] = "in-cluster"
    broken["spec"]["executor"]["instance"] = 3
    broken["spec"]["executor"]["cores"] = 0
    del broken["spec"]["sparkVersion"]
    problems = "\n".join(spark_application_problems(broken))
    assert "spec.mode: 'in-cluster' is not one of ['cluster', 'client']" in problems
    assert ".spec.executor.instance: not declared in the CRD" in problems
    assert "spec.executor.cores: 0 is less than the minimum of 1" in problems
    assert "'sparkVersion' is a required property" in problems


def test_template_without_the_opt_in_label_is_refused(tmp_path: Path) -> None:
    template = tmp_path / "executor.yaml"
    template.write_text(executor_template().replace(f"{PRODUCER_LABEL}: orders", "app: x"))
    settings = ApplicationSettings(
        name="job", namespace="shop", image=IMAGE, main_application_file="local:///j.py"
    )
    with pytest.raises(TemplateError, match=r"no 'durable\.dev/producer' label"):
        spark_application(settings, PodTemplates(executor=template))


def test_cli_reports_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    templates = orders_templates(tmp_path)
    code = main(
        [
            "sparkapplication",
            f"--templates-dir={templates}",
            f"--image={IMAGE}",
            "--name=job",
            "--main-application-file=local:///j.py",
            "--conf=no-equals-sign",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "error: --conf 'no-equals-sign' is not of the form KEY=VALUE\n"
    )


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--name", "Bad Name", "is no Kubernetes name"),
        ("--image", "", "is no image reference"),
        ("--namespace", "", "is no namespace"),
        ("--namespace", "a.b", "is no namespace"),
        ("--executor-memory", "garbage", "is no Spark memory size"),
        ("--driver-memory", "2 g", "is no Spark memory size"),
    ],
)
def test_a_value_kubernetes_or_spark_would_refuse_is_refused_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str
) -> None:
    """Each printed a manifest and exited 0; kubectl apply or Spark refused it later."""
    argv = ["sparkapplication", "--executor-template", str(tmp_path / "t.yaml"), "--name",
            "orders", "--image", "spark:3", "--main-application-file", "local:///a.py",
            flag, value]  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert f"argument {flag}: {value!r} {said}" in capsys.readouterr().err
