"""The kind suite's manifests, chart values, images and skip logic, checked where no kind runs.

Not e2e-marked: CI runs these, so the e2e suite cannot rot silently on machines without
Docker. Kubernetes objects are validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict), the DurableProducer against the CRD schema and the model, the
chart with the e2e values through the real ``helm template``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from durable_producer.contract import PRODUCER_LABEL
from durable_producer.operator import crd
from durable_producer.operator.model import model
from durable_producer.spark_integration.conf import PodTemplates, spark_conf
from e2e import kind_support
from e2e.prerequisites import missing_prerequisites, skip_reason
from support.tools import render_chart, single_object

# The oldest Kubernetes the chart supports and the newest kubectl we ship.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
MANIFEST_FILES = sorted(path.name for path in kind_support.MANIFESTS.glob("*.yaml")
                        if path.name != "chart-values.yaml")
E2E_DIR = Path(__file__).resolve().parent


def kubernetes_objects() -> list[tuple[str, dict[str, Any]]]:
    objects = [(name, obj) for name in MANIFEST_FILES for obj in kind_support.load_manifest(name)]
    scenario = kind_support.producer_manifests(
        "scenario", topic="t", records=5, rate=10, replicas=2, start_file="/signals/start"
    )
    return objects + [("producer_manifests()", obj) for obj in scenario]


def config_map_data(manifest: str, name: str) -> dict[str, str]:
    return next(
        obj["data"] for obj in kind_support.load_manifest(manifest)
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == name
    )


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(kubernetes_version: str) -> None:
    checked = 0
    for source, obj in kubernetes_objects():
        if obj["apiVersion"] == model.API_VERSION:
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            name = obj["metadata"]["name"]
            raise AssertionError(f"{source}: {obj['kind']} {name}: {error}") from error
        checked += 1
    assert checked >= 12


def test_durable_producer_manifest_is_valid_for_the_crd_and_the_model() -> None:
    (producer,) = [obj for obj in kind_support.load_manifest("durableproducer.yaml")
                   if obj["kind"] == model.KIND]
    jsonschema.validate(producer, crd.strict_schema(crd.resource_schema()))
    spec = model.DurableProducerSpec.model_validate(producer["spec"])
    assert spec.fsync.policy == "always"


def test_workloads_opt_in_to_the_durable_producer() -> None:
    (producer,) = [obj for obj in kind_support.load_manifest("durableproducer.yaml")
                   if obj["kind"] == model.KIND]
    name, namespace = producer["metadata"]["name"], producer["metadata"]["namespace"]
    deployment = kind_support.load_manifest("producer.yaml")[1]
    executor = yaml.safe_load(
        config_map_data("spark.yaml", "e2e-spark")["executor-pod-template.yaml"]
    )
    for labels in (deployment["spec"]["template"]["metadata"]["labels"],
                   executor["metadata"]["labels"]):
        assert labels[PRODUCER_LABEL] == name
    assert deployment["metadata"]["namespace"] == namespace == kind_support.WORKLOAD_NAMESPACE
    kafka = next(obj for obj in kind_support.load_manifest("kafka.yaml")
                 if obj["kind"] == "StatefulSet")
    advertised = next(
        env["value"] for env in kafka["spec"]["template"]["spec"]["containers"][0]["env"]
        if env["name"] == "KAFKA_ADVERTISED_LISTENERS"
    )
    assert advertised == f"PLAINTEXT://{producer['spec']['kafka']['bootstrapServers'][0]}"


def test_producer_scenarios_set_their_environment() -> None:
    _, deployment = kind_support.producer_manifests("x", topic="t1", records=7, rate=2.5)
    env = {e["name"]: e.get("value")
           for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["TOPIC"], env["RECORDS"], env["RATE"], env["START_FILE"]) == ("t1", "7", "2.5", "")
    assert deployment["spec"]["selector"]["matchLabels"] == {"app": "x"}
    assert kind_support.load_manifest("producer.yaml")[1]["metadata"]["name"] == "e2e-producer"


def test_embedded_scripts_compile() -> None:
    scripts = {
        "producer.py": config_map_data("producer.yaml", "e2e-producer")["producer.py"],
        "job.py": config_map_data("spark.yaml", "e2e-spark")["job.py"],
    }
    for name, source in scripts.items():
        compile(source, name, "exec")


def test_spark_executor_template_is_a_pod_the_conf_helper_accepts(tmp_path: Path) -> None:
    template = tmp_path / "executor-pod-template.yaml"
    template.write_text(config_map_data("spark.yaml", "e2e-spark")["executor-pod-template.yaml"])
    kubernetes_validate.validate(yaml.safe_load(template.read_text()), "1.35.0", strict=True)

    conf = spark_conf(PodTemplates(executor=template))

    assert conf["spark.kubernetes.executor.label.durable.dev/producer"] == "e2e"
    assert conf["spark.kubernetes.executor.terminationGracePeriodSeconds"] == "60"


@pytest.fixture(scope="module")
def e2e_chart_values() -> dict[str, Any]:
    return yaml.safe_load((kind_support.MANIFESTS / "chart-values.yaml").read_text())


def chart_crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, kind) -> the openAPIV3Schema of every CRD in the chart's crds/ directory."""
    schemas = {}
    for path in sorted((kind_support.CHART_DIR / "crds").glob("*.yaml")):
        for definition in yaml.safe_load_all(path.read_text()):
            spec = definition["spec"]
            version = next(v for v in spec["versions"] if v.get("storage"))
            schemas[(spec["group"], spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_chart_renders_with_the_e2e_values(
    e2e_chart_values: dict[str, Any], kubernetes_version: str
) -> None:
    objects = render_chart(e2e_chart_values, release=kind_support.RELEASE,
                           namespace=kind_support.OPERATOR_NAMESPACE)
    shipped = chart_crd_schemas()
    for obj in objects:
        group_kind = (obj["apiVersion"].split("/")[0], obj["kind"])
        if group_kind in shipped:  # a kind of the chart's own crds/, e.g. kopf's peering
            jsonschema.validate({k: v for k, v in obj.items() if k != "metadata"},
                                shipped[group_kind])
        else:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    operator = single_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in operator.get("env", [])}
    # The images the suite builds and loads are the ones the chart deploys by default.
    assert operator["image"] == kind_support.OPERATOR_IMAGE
    assert env[model.AGENT_IMAGE_ENV] == kind_support.AGENT_IMAGE
    assert env["DURABLE_PRODUCER_POOL_DRAIN_GRACE_SECONDS"] == "15"


def test_the_suite_builds_every_image_its_manifests_use() -> None:
    built = {tag for _, _, tag in kind_support.IMAGES}
    used = set()
    for _, obj in kubernetes_objects():
        pod_spec = obj.get("spec", {}).get("template", {}).get("spec") or obj.get("spec", {})
        used |= {container["image"] for container in pod_spec.get("containers", [])}
    used = {image for image in used if not image.startswith("apache/kafka:")}
    assert used <= built, f"images used but not built: {used - built}"
    for dockerfile, context, _ in kind_support.IMAGES:
        assert dockerfile.is_file()
        for source in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), re.M):
            for path in source.split():
                assert (context / path).exists(), f"{dockerfile.name} copies a missing {path}"


def test_node_image_is_pinned_to_a_supported_kubernetes() -> None:
    match = re.fullmatch(r"kindest/node:v(\d+)\.(\d+)\.(\d+)(@sha256:[0-9a-f]{64})?",
                         kind_support.NODE_IMAGE)
    assert match, f"{kind_support.NODE_IMAGE} is not a pinned kindest/node version"
    assert (int(match.group(1)), int(match.group(2))) >= (1, 29)


def test_missing_prerequisites_names_each_missing_tool(tmp_path: Path) -> None:
    def nothing_installed(name: str) -> str | None:
        return None

    missing = missing_prerequisites(which=nothing_installed, succeeds=lambda _: True,
                                    tools_bin=tmp_path)
    assert [item.split(" ")[0] for item in missing] == ["docker", "kind", "helm", "kubectl"]

    def client_only(name: str) -> str | None:
        return f"/usr/bin/{name}"

    def engine_down(command: Any) -> bool:
        return list(command) != ["/usr/bin/docker", "info"]

    (tmp_path / "helm").touch()
    (tmp_path / "kubectl").touch()
    missing = missing_prerequisites(which=client_only, succeeds=engine_down, tools_bin=tmp_path)
    assert len(missing) == 1 and "Docker engine" in missing[0]
    assert skip_reason(missing).startswith("kind e2e suite needs a Docker engine")
    assert missing_prerequisites(which=client_only, succeeds=lambda _: True,
                                 tools_bin=tmp_path) == []


def test_e2e_suite_is_collected_and_skipped_with_the_reason() -> None:
    missing = missing_prerequisites()
    if not missing:
        pytest.skip("Docker and kind are present here: `make e2e` runs the suite itself")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "e2e", str(E2E_DIR), "-rs", "-q",
         "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300, check=False,
        cwd=kind_support.REPO_ROOT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b4 skipped\b", result.stdout), result.stdout
    assert skip_reason(missing) in result.stdout, result.stdout


def test_spark_entrypoint_starts_the_executor_backend_spark_asks_for(tmp_path: Path) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\nfor arg in "$@"; do echo "$arg"; done\n')
    java.chmod(0o755)
    local_dir = tmp_path / "spark-local"
    local_dir.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "JAVA_HOME": str(tmp_path / "jdk"),
        "SPARK_HOME": "/spark",
        "SPARK_LOCAL_DIRS": f"{local_dir},/elsewhere",
        "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.5:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "job-exec-3",
    }
    entrypoint = kind_support.IMAGES_DIR / "spark-entrypoint.sh"

    result = subprocess.run(["bash", str(entrypoint), "executor"], env=env, capture_output=True,
                            text=True, timeout=30, check=True)

    args = result.stdout.splitlines()
    assert args[0] == "-Dspark.driver.port=7078"
    assert args[1:3] == ["-Xms512m", "-Xmx512m"]
    assert args[4] == f"/spark/jars/*:{local_dir}:"
    assert args[5] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    options = dict(zip(args[6::2], args[7::2], strict=True))
    assert options == {
        "--driver-url": env["SPARK_DRIVER_URL"], "--executor-id": "3", "--cores": "1",
        "--app-id": "spark-app-1", "--hostname": "10.0.0.9", "--resourceProfileId": "0",
        "--podName": "job-exec-3",
    }
    passthrough = subprocess.run(["bash", str(entrypoint), "echo", "driver", "args"], env=env,
                                 capture_output=True, text=True, timeout=30, check=True)
    assert passthrough.stdout == "driver args\n"
