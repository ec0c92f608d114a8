"""End to end on the emulator: operator-rendered templates -> Spark executor pods -> webhook.

The real operator (`kopf run`, webhook server on) renders the DurableProducer's templates
ConfigMap; the conf CLI fetches it through the API; the real Spark driver (spark-submit,
client mode, master ``k8s://http://127.0.0.1:PORT``) creates executor pods from it; each
pod is then sent to the running webhook as the API server would, and the patch it answers
attaches the agent sidecar and a volume claimed from the operator's pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kmock
import pytest

from durable_producer import contract
from durable_producer.operator import pod_mutation, spark_actions, volume_pool
from integration.operator import operator_harness
from integration.operator.operator_harness import NAMESPACE, KubernetesApi, kubernetes_api
from integration.operator.test_webhook_harness import (
    AGENT_IMAGE,
    PODS_PATH,
    PVCS_PATH,
    WebhookOperator,
    durable_producer,
    items,
    patched,
    pool_resources,
    start_webhook_operator,
)
from support.waiting import wait_for

__all__ = ["kubernetes_api", "pool_resources", "start_webhook_operator"]

pytestmark = pytest.mark.integration

SPARK_START_TIMEOUT_SECONDS = 180
JOB = """\
import time
from pyspark.sql import SparkSession

SparkSession.builder.getOrCreate()
time.sleep(300)
"""


@pytest.fixture(autouse=True)
def spark_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Spark driver may touch besides pods, PVCs and ConfigMaps (before start)."""
    monkeypatch.setitem(
        operator_harness.DECLARED_RESOURCES,
        "v1/services",
        kmock.ResourceInfo(kind="Service", namespaced=True),
    )


def write_kubeconfig(path: Path, server_url: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": server_url}}],
                "users": [{"name": "tester", "user": {"token": "any-token"}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
                ],
                "current-context": "emulator",
            }
        )
    )
    return path


def conf_flags_from_cluster(kubeconfig: Path, output_dir: Path) -> list[str]:
    """The flags `python -m durable_producer.spark_integration conf --producer` prints."""
    printed = subprocess.run(
        [
            sys.executable, "-m", "durable_producer.spark_integration", "conf",
            "--producer", "orders", "--namespace", NAMESPACE,
            "--kubeconfig", str(kubeconfig), "--output-dir", str(output_dir),
        ],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return printed.split()


def executor_pods(kubernetes_api: KubernetesApi) -> list[dict[str, Any]]:
    return [
        pod
        for pod in items(kubernetes_api, PODS_PATH).values()
        if (pod["metadata"].get("labels") or {}).get("spark-role") == "executor"
    ]


def spark_executor_pods(kubernetes_api: KubernetesApi, flags: list[str], tmp_path: Path) -> Any:
    """Run the Spark driver until it has created executor pods; returns them."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master", f"k8s://{kubernetes_api.base_url}",
        "--deploy-mode", "client",
        "--conf", f"spark.kubernetes.namespace={NAMESPACE}",
        "--conf", "spark.kubernetes.container.image=spark:test",
        "--conf", "spark.executor.instances=1",
        "--conf", "spark.scheduler.minRegisteredResourcesRatio=0",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.ui.enabled=false",
        *flags,
        str(job),
    ]  # fmt: skip
    environment = dict(
        os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable
    )
    log_path = tmp_path / "spark-submit.log"
    with log_path.open("wb") as log:
        driver = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SPARK_START_TIMEOUT_SECONDS
        pods = executor_pods(kubernetes_api)
        while not pods and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
            pods = executor_pods(kubernetes_api)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    assert pods, f"Spark created no executor pod: {log_path.read_text(errors='replace')[-3000:]}"
    return pods


def env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {variable["name"]: variable.get("value") for variable in container.get("env") or []}


def test_spark_executors_from_rendered_templates_get_agent_and_pool_volume(
    kubernetes_api: KubernetesApi,
    start_webhook_operator: Any,
    tmp_path: Path,
) -> None:
    kubernetes_api.create(durable_producer("orders"))
    webhook: WebhookOperator = start_webhook_operator()
    wait_for(
        lambda: ((kubernetes_api.get("orders") or {}).get("status") or {}).get(
            spark_actions.STATUS_FIELD
        ),
        what="the operator to render the Spark templates",
    )
    kubeconfig = write_kubeconfig(tmp_path / "spark-kubeconfig", kubernetes_api.base_url)
    flags = conf_flags_from_cluster(kubeconfig, tmp_path / "templates")

    (pod,) = spark_executor_pods(kubernetes_api, flags, tmp_path)

    # What the rendered template (and the conf the helper derived from it) put in the pod.
    labels = pod["metadata"]["labels"]
    assert labels[contract.PRODUCER_LABEL] == "orders"
    assert labels["spark-role"] == "executor"
    assert pod["spec"]["terminationGracePeriodSeconds"] == pod_mutation.MINIMUM_GRACE_SECONDS
    (spark_container,) = pod["spec"]["containers"]
    assert spark_container["name"] == "spark-kubernetes-executor"
    env = env_of(spark_container)
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == env["DURABLE_PRODUCER_BOOTSTRAP"] == "127.0.0.1:9092"
    assert env["SPARK_EXECUTOR_ID"] == "1"
    assert not pod_mutation.is_injected(pod)

    # The API server would now call the webhook; play its part.
    pod["metadata"].setdefault("namespace", NAMESPACE)
    response = webhook.review(pod)
    admitted = patched(pod, response)

    assert response["allowed"] is True
    assert pod_mutation.is_injected(admitted)
    agent = admitted["spec"]["initContainers"][0]
    assert (agent["name"], agent["restartPolicy"], agent["image"]) == (
        contract.AGENT_CONTAINER_NAME,
        "Always",
        AGENT_IMAGE,
    )
    claim = pod_mutation.claimed_volume(admitted)
    pool = items(kubernetes_api, PVCS_PATH)
    assert claim in pool
    assert pool[claim]["metadata"]["labels"][volume_pool.POOL_LABEL] == "orders"
    (executor,) = admitted["spec"]["containers"]
    assert env_of(executor) == env  # Spark's env kept, the bootstrap not duplicated
    assert admitted["spec"]["terminationGracePeriodSeconds"] == (pod_mutation.MINIMUM_GRACE_SECONDS)
