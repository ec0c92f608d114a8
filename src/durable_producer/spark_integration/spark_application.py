"""A kubeflow spark-operator ``SparkApplication`` (v1beta2) whose executors write through agents.

Most Spark-on-Kubernetes jobs are submitted as ``SparkApplication`` resources rather than with
spark-submit. The operator of this project renders the executor (and driver) pod templates of a
DurableProducer; ``spark_application`` puts them where the spark-operator takes pod templates
(``spec.executor.template``, Spark >= 3.0) and adds what Spark would otherwise drop:

- the opt-in label as a pod label (``executor.labels``) and as Spark conf, so the executors get
  an agent from the webhook even if the template loses it;
- the template's termination grace period as ``executor.terminationGracePeriodSeconds`` and as
  Spark conf (``spark_conf``): Spark overwrites the template's value with its own (30 s),
  which would cut the agent's drain short;
- the agent's address stays in the template's container env (``DURABLE_PRODUCER_BOOTSTRAP``).

The template file settings of ``spark_conf`` are left out: the spark-operator writes
``template`` to a file and points Spark at it itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from durable_producer.contract import PRODUCER_LABEL
from durable_producer.spark_integration.conf import (
    DRIVER_TEMPLATE_FILE,
    EXECUTOR_TEMPLATE_FILE,
    PodTemplates,
    TemplateError,
    TemplateInfo,
    spark_conf,
)

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "SparkApplication"
DEFAULT_SPARK_VERSION = "4.0.1"
DEFAULT_SERVICE_ACCOUNT = "spark-operator-spark"  # created by the spark-operator's Helm chart

# A streaming query must keep running: restart it after a failure (it resumes from its
# checkpoint). A batch job is not restarted by default: a rerun writes every row again.
_STREAMING_RESTART = {
    "type": "Always",
    "onFailureRetryInterval": 10,
    "onSubmissionFailureRetryInterval": 20,
}
_BATCH_RESTART = {"type": "Never"}


@dataclass(frozen=True)
class ApplicationSettings:
    """What the SparkApplication needs besides the pod templates."""

    name: str
    namespace: str
    image: str
    main_application_file: str
    spark_version: str = DEFAULT_SPARK_VERSION
    streaming: bool = False
    arguments: Sequence[str] = ()
    executor_instances: int = 2
    executor_cores: int = 1
    executor_memory: str = "2g"
    driver_cores: int = 1
    driver_memory: str = "1g"
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    image_pull_policy: str = "IfNotPresent"
    extra_conf: Mapping[str, str] = field(default_factory=dict)


def spark_application(settings: ApplicationSettings, templates: PodTemplates) -> dict[str, Any]:
    """The SparkApplication manifest; ``TemplateError`` if a template cannot be used."""
    conf = {
        key: value
        for key, value in spark_conf(templates).items()
        if key not in (EXECUTOR_TEMPLATE_FILE, DRIVER_TEMPLATE_FILE)
    }
    conf.update(settings.extra_conf)
    executor_info = TemplateInfo.load(templates.executor)
    assert executor_info.producer is not None  # spark_conf refused a template without it
    executor: dict[str, Any] = {
        "instances": settings.executor_instances,
        "cores": settings.executor_cores,
        "memory": settings.executor_memory,
        "labels": {PRODUCER_LABEL: executor_info.producer},
        "template": pod_template_spec(templates.executor),
    }
    if executor_info.termination_grace_seconds is not None:
        executor["terminationGracePeriodSeconds"] = executor_info.termination_grace_seconds
    driver: dict[str, Any] = {
        "cores": settings.driver_cores,
        "memory": settings.driver_memory,
        "serviceAccount": settings.service_account,
    }
    if templates.driver is not None:
        driver_info = TemplateInfo.load(templates.driver)
        driver["template"] = pod_template_spec(templates.driver)
        if driver_info.producer is not None:
            driver["labels"] = {PRODUCER_LABEL: driver_info.producer}
        if driver_info.termination_grace_seconds is not None:
            driver["terminationGracePeriodSeconds"] = driver_info.termination_grace_seconds
    spec: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "mainApplicationFile": settings.main_application_file,
        "sparkVersion": settings.spark_version,
        "sparkConf": dict(sorted(conf.items())),
        "restartPolicy": dict(_STREAMING_RESTART if settings.streaming else _BATCH_RESTART),
        "driver": driver,
        "executor": executor,
    }
    if settings.arguments:
        spec["arguments"] = list(settings.arguments)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": settings.name, "namespace": settings.namespace},
        "spec": spec,
    }


def pod_template_spec(path: Path) -> dict[str, Any]:
    """A rendered pod template (a Pod manifest) as the PodTemplateSpec the operator takes."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise TemplateError(f"cannot read pod template {path}: {error}") from error
    if not isinstance(document, dict):
        raise TemplateError(f"pod template {path} is not a Pod manifest")
    return {key: document[key] for key in ("metadata", "spec") if key in document}


def format_manifest(manifest: Mapping[str, Any]) -> str:
    """YAML for ``kubectl apply -f -``, keys in the order built."""
    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)
