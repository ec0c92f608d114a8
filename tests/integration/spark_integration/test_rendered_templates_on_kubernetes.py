"""End to end on the real API server: operator-rendered templates -> Spark executor pods ->
webhook.

The chart's operator (`kopf run`, webhook server on) renders the DurableProducer's templates
ConfigMap; the conf CLI fetches it through the API; the real Spark driver (spark-submit,
client mode, master ``k8s://https://127.0.0.1:PORT`` with a token and the cluster's CA)
creates executor pods from it; the API server calls the webhook for each, which attaches the
agent sidecar and a volume claimed from the operator's pool.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_producer import contract
from durable_producer.contract import POOL_LABEL
from durable_producer.operator.act import spark_actions
from durable_producer.operator.decide import agent_container, pod_mutation
from support.kube_harness import (
    ChartOperator,
    KubeApi,
    chart_operators,
    kube_api,
    start_chart_operator,
)
from support.waiting import wait_for
from support.webhook_harness import AGENT_IMAGE, durable_producer

__all__ = ["chart_operators", "kube_api", "start_chart_operator"]

pytestmark = pytest.mark.integration

SPARK_START_TIMEOUT_SECONDS = 180
JOB = """\
import time
from pyspark.sql import SparkSession

SparkSession.builder.getOrCreate()
time.sleep(300)
"""


def conf_flags_from_cluster(kubeconfig: Path, namespace: str, output_dir: Path) -> list[str]:
    """The flags `python -m durable_producer.spark_integration conf --producer` prints."""
    printed = subprocess.run(
        [
            sys.executable, "-m", "durable_producer.spark_integration", "conf",
            "--producer", "orders", "--namespace", namespace,
            "--kubeconfig", str(kubeconfig), "--output-dir", str(output_dir),
        ],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr[-3000:]
    return printed.stdout.split()


def executor_pods(kube_api: KubeApi) -> list[dict[str, Any]]:
    return [
        pod
        for pod in kube_api.items(kube_api.pods_path).values()
        if (pod["metadata"].get("labels") or {}).get("spark-role") == "executor"
    ]


def spark_executor_pods(kube_api: KubeApi, flags: list[str], tmp_path: Path) -> Any:
    """Run the Spark driver until it has created executor pods; returns them."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master", f"k8s://{kube_api.client.server}",
        "--deploy-mode", "client",
        "--conf", f"spark.kubernetes.namespace={kube_api.namespace}",
        "--conf", f"spark.kubernetes.authenticate.caCertFile={kube_api.client.ca_file}",
        "--conf", f"spark.kubernetes.authenticate.oauthToken={kube_api.client.token}",
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
        pods = executor_pods(kube_api)
        while not pods and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
            pods = executor_pods(kube_api)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    assert pods, f"Spark created no executor pod: {log_path.read_text(errors='replace')[-3000:]}"
    return pods


def env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {variable["name"]: variable.get("value") for variable in container.get("env") or []}


def test_spark_executors_from_rendered_templates_get_agent_and_pool_volume(
    kube_api: KubeApi,
    start_chart_operator: Callable[..., ChartOperator],
    tmp_path: Path,
) -> None:
    kube_api.create(durable_producer("orders"))
    start_chart_operator()
    wait_for(
        lambda: ((kube_api.get("orders") or {}).get("status") or {}).get(
            spark_actions.STATUS_FIELD
        ),
        timeout=60,
        what="the operator to render the Spark templates",
    )
    kubeconfig = kube_api.cluster.plane.admin_kubeconfig(tmp_path / "spark-kubeconfig")
    flags = conf_flags_from_cluster(kubeconfig, kube_api.namespace, tmp_path / "templates")

    (pod,) = spark_executor_pods(kube_api, flags, tmp_path)

    # What the rendered template (and the conf the helper derived from it) put in the pod.
    labels = pod["metadata"]["labels"]
    assert labels[contract.PRODUCER_LABEL] == "orders"
    assert labels["spark-role"] == "executor"
    assert pod["spec"]["terminationGracePeriodSeconds"] == agent_container.MINIMUM_GRACE_SECONDS
    (spark_container,) = pod["spec"]["containers"]
    assert spark_container["name"] == "spark-kubernetes-executor"
    env = env_of(spark_container)
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == env["DURABLE_PRODUCER_BOOTSTRAP"] == "127.0.0.1:9092"
    assert env["SPARK_EXECUTOR_ID"] == "1"

    # The API server called the webhook for the pod Spark created.
    assert pod_mutation.is_injected(pod)
    agent = pod["spec"]["initContainers"][0]
    assert (agent["name"], agent["restartPolicy"], agent["image"]) == (
        contract.AGENT_CONTAINER_NAME,
        "Always",
        AGENT_IMAGE,
    )
    claim = pod_mutation.claimed_volume(pod)
    pool = kube_api.items(kube_api.pvcs_path)
    assert claim in pool
    assert pool[claim]["metadata"]["labels"][POOL_LABEL] == "orders"


def test_the_conf_helper_trusts_the_clusters_ca_from_the_kubeconfig(
    kube_api: KubeApi, start_chart_operator: Callable[..., ChartOperator], tmp_path: Path
) -> None:
    """NEW-3: the helper built its API client before loading the kubeconfig, so TLS trusted
    only the system CAs (CERTIFICATE_VERIFY_FAILED, then a traceback)."""
    kube_api.create(durable_producer("orders"))
    start_chart_operator()
    wait_for(lambda: ((kube_api.get("orders") or {}).get("status") or {}).get(
        spark_actions.STATUS_FIELD), timeout=60, what="the rendered Spark templates")
    kubeconfig = kube_api.cluster.plane.admin_kubeconfig(tmp_path / "kubeconfig")

    flags = conf_flags_from_cluster(kubeconfig, kube_api.namespace, tmp_path / "templates")

    assert any("executor" in flag for flag in flags), flags
