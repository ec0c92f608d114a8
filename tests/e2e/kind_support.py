"""A kind cluster for the end-to-end suite: create, load images, install, inspect, delete.

Everything goes through the real ``kind``, ``docker``, ``helm`` and ``kubectl`` binaries with
a kubeconfig of its own, so the developer's current context is never touched.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.prerequisites import REPO_ROOT, TOOLS_BIN
from support.waiting import wait_for

log = logging.getLogger(__name__)

MANIFESTS = Path(__file__).resolve().parent / "manifests"
IMAGES_DIR = Path(__file__).resolve().parent / "images"
CHART_DIR = REPO_ROOT / "charts" / "durable-producer"

# Pinned node image: Kubernetes 1.34 (native sidecars need >= 1.29). Override with
# DURABLE_E2E_NODE_IMAGE, e.g. kindest/node:v1.29.14 to test the oldest supported version.
NODE_IMAGE = "kindest/node:v1.34.0"
NODE_IMAGE_ENV = "DURABLE_E2E_NODE_IMAGE"
KEEP_CLUSTER_ENV = "DURABLE_E2E_KEEP_CLUSTER"

# (Dockerfile, build context, tag). The agent and operator tags are the chart's defaults
# (a CI test checks it); the Spark image is the e2e suite's own.
AGENT_IMAGE = "durable-producer/agent:0.1.0"
OPERATOR_IMAGE = "durable-producer/operator:0.1.0"
SPARK_IMAGE = "durable-producer/spark-e2e:0.1.0"
IMAGES: tuple[tuple[Path, Path, str], ...] = (
    (REPO_ROOT / "docker" / "agent.Dockerfile", REPO_ROOT, AGENT_IMAGE),
    (REPO_ROOT / "docker" / "operator.Dockerfile", REPO_ROOT, OPERATOR_IMAGE),
    (IMAGES_DIR / "spark.Dockerfile", REPO_ROOT, SPARK_IMAGE),
)

RELEASE = "durable-producer"
OPERATOR_NAMESPACE = "durable-system"
KAFKA_NAMESPACE = "kafka"
WORKLOAD_NAMESPACE = "e2e"
KAFKA_BIN = "/opt/kafka/bin"


def load_manifest(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def producer_manifests(name: str, *, topic: str, records: int, rate: float = 0,
                       replicas: int = 1, start_file: str = "") -> list[dict[str, Any]]:
    """The producer ConfigMap and a copy of its Deployment, renamed, with this scenario's env."""
    config_map, deployment = load_manifest("producer.yaml")
    deployment = copy.deepcopy(deployment)
    deployment["metadata"]["name"] = name
    deployment["spec"]["replicas"] = replicas
    deployment["spec"]["selector"]["matchLabels"]["app"] = name
    deployment["spec"]["template"]["metadata"]["labels"]["app"] = name
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    settings = {"TOPIC": topic, "RECORDS": str(records), "RATE": str(rate),
                "START_FILE": start_file}
    for variable in container["env"]:
        if variable["name"] in settings:
            variable["value"] = settings[variable["name"]]
    return [config_map, deployment]


def run(command: Sequence[str], *, timeout: float = 600, input_text: str | None = None,
        env: Mapping[str, str] | None = None, check: bool = True) -> str:
    log.info("$ %s", " ".join(command))
    result = subprocess.run(
        list(command), input=input_text, capture_output=True, text=True, timeout=timeout,
        env=dict(env) if env is not None else None, check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str,
               interval: float = 3.0) -> None:
    """``support.waiting.wait_for`` with the kind suite's slower default interval."""
    wait_for(condition, timeout=timeout, interval=interval, what=what)


@dataclass
class KindCluster:
    name: str
    kind: str
    kubeconfig: Path

    # ------------------------------------------------------------------ lifecycle
    def create(self, node_image: str) -> None:
        run([self.kind, "create", "cluster", "--name", self.name, "--image", node_image,
             "--kubeconfig", str(self.kubeconfig), "--wait", "180s"], timeout=600)

    def delete(self) -> None:
        run([self.kind, "delete", "cluster", "--name", self.name,
             "--kubeconfig", str(self.kubeconfig)], timeout=300, check=False)

    def build_and_load_images(self) -> None:
        for dockerfile, context, tag in IMAGES:
            run(["docker", "build", "--file", str(dockerfile), "--tag", tag, str(context)],
                timeout=1800)
            run([self.kind, "load", "docker-image", tag, "--name", self.name], timeout=600)

    def install_chart(self) -> None:
        self.helm("install", RELEASE, str(CHART_DIR), "--namespace", OPERATOR_NAMESPACE,
                  "--create-namespace", "--values", str(MANIFESTS / "chart-values.yaml"),
                  "--wait", "--timeout", "5m")

    # ------------------------------------------------------------------ tools
    def kubectl(self, *args: str, input_text: str | None = None, timeout: float = 300,
                check: bool = True) -> str:
        return run([str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                   input_text=input_text, timeout=timeout, check=check)

    def helm(self, *args: str, timeout: float = 600) -> str:
        return run([str(TOOLS_BIN / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
                   timeout=timeout)

    def apply(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-",
                     input_text=yaml.safe_dump_all(list(objects)))

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "--output", "json"))

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.get_json("pods", "--namespace", namespace, "--selector", selector)["items"]

    def logs(self, namespace: str, pod: str, container: str) -> str:
        return self.kubectl("logs", "--namespace", namespace, pod, "--container", container,
                            check=False)

    def diagnostics(self) -> str:
        """What a failed run needs for a post-mortem: every pod, event and operator log."""
        parts = [
            self.kubectl("get", "pods,pvc,jobs,durableproducers", "--all-namespaces",
                         "--output", "wide", check=False),
            self.kubectl("get", "events", "--all-namespaces", "--sort-by=.lastTimestamp",
                         check=False),
            self.kubectl("logs", "--namespace", OPERATOR_NAMESPACE, "--selector",
                         f"app.kubernetes.io/instance={RELEASE}", "--tail", "300", check=False),
        ]
        return "\n".join(parts)

    # ------------------------------------------------------------------ Kafka in the cluster
    def kafka_exec(self, *command: str, timeout: float = 120, check: bool = True) -> str:
        return self.kubectl("exec", "--namespace", KAFKA_NAMESPACE, "kafka-0", "--",
                            *command, timeout=timeout, check=check)

    def wait_for_kafka(self, timeout: float = 300) -> None:
        self.kubectl("rollout", "status", "statefulset/kafka", "--namespace", KAFKA_NAMESPACE,
                     f"--timeout={int(timeout)}s", timeout=timeout + 30)
        wait_until(self.kafka_answers, timeout=timeout, what="Kafka to answer")

    def kafka_answers(self) -> bool:
        result = subprocess.run(
            [str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "exec",
             "--namespace", KAFKA_NAMESPACE, "kafka-0", "--", f"{KAFKA_BIN}/kafka-topics.sh",
             "--bootstrap-server", "localhost:9092", "--list"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        return result.returncode == 0

    def scale_kafka(self, replicas: int) -> None:
        self.kubectl("scale", "statefulset/kafka", "--namespace", KAFKA_NAMESPACE,
                     f"--replicas={replicas}")
        if replicas == 0:
            wait_until(lambda: not self.pods(KAFKA_NAMESPACE, "app=kafka"), timeout=180,
                       what="Kafka to stop")
        else:
            self.wait_for_kafka()

    def create_topic(self, topic: str, partitions: int = 3) -> None:
        self.kafka_exec(f"{KAFKA_BIN}/kafka-topics.sh", "--bootstrap-server", "localhost:9092",
                        "--create", "--if-not-exists", "--topic", topic,
                        "--partitions", str(partitions), "--replication-factor", "1")

    def topic_values(self, topic: str) -> list[str]:
        """Every record value in ``topic``, read from the beginning (duplicates included)."""
        output = self.kafka_exec(
            f"{KAFKA_BIN}/kafka-console-consumer.sh", "--bootstrap-server", "localhost:9092",
            "--topic", topic, "--from-beginning", "--timeout-ms", "20000",
            timeout=300, check=False,  # it ends by timing out, which some versions report as 1
        )
        return [line for line in output.splitlines() if line and not line.startswith("Processed")]
