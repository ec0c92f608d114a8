"""The real Spark driver (spark-submit, client mode) against the real API server.

spark-submit gets exactly the flags printed by ``python -m durable_producer.spark_integration
conf``; the executor pods it creates must pass the API server's validation and carry what the
template says (opt-in label, agent sidecar, env, grace period). No operator runs here: the
template's own agent is checked as stored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from durable_producer.contract import EXECUTOR_TEMPLATE_KEY
from durable_producer.spark_integration.conf import write_rendered_templates
from support.kube_harness import KubeApi, kube_api
from support.spark_templates import executor_template

__all__ = ["kube_api"]

pytestmark = pytest.mark.integration

GRACE_SECONDS = 180
EXECUTOR_TEMPLATE = executor_template(GRACE_SECONDS, with_agent=True)

JOB = """\
import time
from pyspark.sql import SparkSession

SparkSession.builder.getOrCreate()
time.sleep(120)
"""


def conf_flags(templates_dir: Path) -> list[str]:
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_producer.spark_integration",
            "conf",
            "--templates-dir",
            str(templates_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return printed.split()


def executor_pods(kube_api: KubeApi) -> list[dict[str, Any]]:
    return [pod for pod in kube_api.items(kube_api.pods_path).values()
            if (pod["metadata"].get("labels") or {}).get("spark-role") == "executor"]


def test_executor_pods_from_spark_carry_the_template(kube_api: KubeApi, tmp_path: Path) -> None:
    templates = write_rendered_templates(
        {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE}, tmp_path / "templates"
    )
    job = tmp_path / "job.py"
    job.write_text(JOB)
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        f"k8s://{kube_api.client.server}",
        "--deploy-mode",
        "client",
        "--conf",
        f"spark.kubernetes.namespace={kube_api.namespace}",
        "--conf",
        f"spark.kubernetes.authenticate.caCertFile={kube_api.client.ca_file}",
        "--conf",
        f"spark.kubernetes.authenticate.oauthToken={kube_api.client.token}",
        "--conf",
        "spark.kubernetes.container.image=spark:test",
        "--conf",
        "spark.executor.instances=1",
        "--conf",
        "spark.scheduler.minRegisteredResourcesRatio=0",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        *conf_flags(templates.executor.parent),
        str(job),
    ]
    environment = dict(
        os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable
    )
    log_path = tmp_path / "spark-submit.log"
    with log_path.open("wb") as log:
        driver = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        pods = executor_pods(kube_api)
        while not pods and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
            pods = executor_pods(kube_api)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    assert pods, f"Spark created no executor pod: {log_path.read_text(errors='replace')[-3000:]}"

    pod = pods[0]
    assert pod["metadata"]["labels"]["durable.dev/producer"] == "orders"
    assert pod["metadata"]["labels"]["spark-role"] == "executor"
    spec = pod["spec"]
    assert spec["terminationGracePeriodSeconds"] == GRACE_SECONDS
    assert [(c["name"], c.get("restartPolicy")) for c in spec["initContainers"]] == [
        ("durable-agent", "Always")
    ]
    (container,) = spec["containers"]
    assert container["name"] == "spark-kubernetes-executor"
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["DURABLE_PRODUCER_BOOTSTRAP"] == "127.0.0.1:9092"
    assert env["SPARK_EXECUTOR_ID"] == "1"
