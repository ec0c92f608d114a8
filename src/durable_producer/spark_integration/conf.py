"""Point Spark on Kubernetes at the pod templates the operator renders for a DurableProducer.

The operator renders executor (and driver) pod templates into a ConfigMap; mounted into
the pod that runs spark-submit (or written out with ``write_rendered_templates``), they
become files. ``spark_conf`` turns those files into Spark conf entries, checking first that
each template names the Spark container and carries the opt-in label, since a template
without it silently yields executors with no buffer agent.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import yaml

# The opt-in label, template keys (file names) and Spark's default container names are the
# operator's too: both sides read them from the contract.
from durable_producer.contract import (
    DEFAULT_DRIVER_CONTAINER,
    DEFAULT_EXECUTOR_CONTAINER,
    DRIVER_TEMPLATE_KEY,
    EXECUTOR_TEMPLATE_KEY,
    PRODUCER_LABEL,
)

EXECUTOR_TEMPLATE_FILE = "spark.kubernetes.executor.podTemplateFile"
EXECUTOR_CONTAINER_NAME = "spark.kubernetes.executor.podTemplateContainerName"
DRIVER_TEMPLATE_FILE = "spark.kubernetes.driver.podTemplateFile"
DRIVER_CONTAINER_NAME = "spark.kubernetes.driver.podTemplateContainerName"
EXECUTOR_GRACE_PERIOD = "spark.kubernetes.executor.terminationGracePeriodSeconds"
DYNAMIC_ALLOCATION_DELETE_GRACE = "spark.kubernetes.dynamicAllocation.deleteGracePeriod"
EXECUTOR_LABEL_PREFIX = "spark.kubernetes.executor.label."
DRIVER_LABEL_PREFIX = "spark.kubernetes.driver.label."


class TemplateError(ValueError):
    """A pod template cannot be used for durable Spark writes."""


class ConfigurableBuilder(Protocol):
    """What ``SparkSession.Builder`` offers and ``apply_to_builder`` needs."""

    def config(self, key: str, value: str) -> Any: ...


BuilderT = TypeVar("BuilderT", bound=ConfigurableBuilder)


@dataclass(frozen=True)
class PodTemplates:
    """Template files for spark-submit; container ``None`` means: find it in the template."""

    executor: Path
    driver: Path | None = None
    executor_container: str | None = None
    driver_container: str | None = None


@dataclass(frozen=True)
class TemplateInfo:
    """What matters in one pod template."""

    path: Path
    containers: tuple[str, ...]
    producer: str | None
    termination_grace_seconds: int | None = None

    @classmethod
    def load(cls, path: Path) -> Self:
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError) as error:
            raise TemplateError(f"cannot read pod template {path}: {error}") from error
        except yaml.YAMLError as error:
            raise TemplateError(f"pod template {path} is not valid YAML: {error}") from error
        if not isinstance(document, dict) or document.get("kind", "Pod") != "Pod":
            raise TemplateError(f"pod template {path} is not a Pod manifest")
        spec = _part(document, "spec", dict, path)
        labels = _part(_part(document, "metadata", dict, path), "labels", dict, path)
        listed = _part(spec, "containers", list, path)
        if not all(isinstance(container, dict) for container in listed):
            raise TemplateError(f"pod template {path}: containers must be a list of mappings")
        containers = tuple(str(container.get("name", "")) for container in listed)
        producer = labels.get(PRODUCER_LABEL)
        grace = spec.get("terminationGracePeriodSeconds")
        if grace is not None and (type(grace) is not int or grace < 0):
            raise TemplateError(
                f"pod template {path}: terminationGracePeriodSeconds must be a non-negative "
                f"integer, got {grace!r}"
            )
        return cls(
            path=path,
            containers=containers,
            producer=str(producer) if producer else None,
            termination_grace_seconds=grace,
        )

    def spark_container(self, requested: str | None, spark_default: str) -> str:
        """The container Spark must use: the requested one, Spark's default, or the only one."""
        if requested is not None:
            if requested not in self.containers:
                raise TemplateError(
                    f"pod template {self.path} has no container {requested!r} "
                    f"(containers: {list(self.containers)})"
                )
            return requested
        if spark_default in self.containers:
            return spark_default
        if len(self.containers) == 1:
            return self.containers[0]
        raise TemplateError(
            f"pod template {self.path} has containers {list(self.containers)}: "
            f"name the Spark container explicitly"
        )


def _part(parent: dict[str, Any], key: str, kind: type[Any], path: Path) -> Any:
    """``parent[key]`` of a pod template, checked to be a ``kind`` (absent: an empty one)."""
    value = parent.get(key) or kind()
    if not isinstance(value, kind):
        raise TemplateError(
            f"pod template {path}: {key} must be a {'mapping' if kind is dict else 'list'},"
            f" not {type(value).__name__}; use the template the operator renders"
        )
    return value


def spark_conf(templates: PodTemplates) -> dict[str, str]:
    """Spark conf entries that make Spark build its pods from ``templates``.

    Besides the template files and container names:

    - the opt-in label is repeated as a Spark pod label: Spark merges it into the pods it
      creates, so they opt in even if a later template edit drops it;
    - the template's termination grace period is repeated as Spark conf, because Spark
      overwrites the template's value with its own setting (default 30 s), which would cut
      the agent's drain short; dynamic allocation's forced-kill delay gets the same value.
    """
    executor = TemplateInfo.load(templates.executor)
    if executor.producer is None:
        raise TemplateError(
            f"executor pod template {executor.path} has no {PRODUCER_LABEL!r} label: "
            f"executors built from it get no buffer agent; use the template the operator "
            f"renders for your DurableProducer"
        )
    conf = {
        EXECUTOR_TEMPLATE_FILE: str(executor.path.resolve()),
        EXECUTOR_CONTAINER_NAME: executor.spark_container(
            templates.executor_container, DEFAULT_EXECUTOR_CONTAINER
        ),
        EXECUTOR_LABEL_PREFIX + PRODUCER_LABEL: executor.producer,
    }
    if executor.termination_grace_seconds is not None:
        conf[EXECUTOR_GRACE_PERIOD] = str(executor.termination_grace_seconds)
        conf[DYNAMIC_ALLOCATION_DELETE_GRACE] = f"{executor.termination_grace_seconds}s"
    if templates.driver is not None:
        driver = TemplateInfo.load(templates.driver)
        conf[DRIVER_TEMPLATE_FILE] = str(driver.path.resolve())
        conf[DRIVER_CONTAINER_NAME] = driver.spark_container(
            templates.driver_container, DEFAULT_DRIVER_CONTAINER
        )
        if driver.producer is not None:
            conf[DRIVER_LABEL_PREFIX + PRODUCER_LABEL] = driver.producer
    return conf


def templates_in_directory(
    directory: Path,
    *,
    executor_container: str | None = None,
    driver_container: str | None = None,
) -> PodTemplates:
    """The templates in a mounted ConfigMap directory (the driver template is optional)."""
    executor = directory / EXECUTOR_TEMPLATE_KEY
    if not executor.is_file():
        raise TemplateError(
            f"no {EXECUTOR_TEMPLATE_KEY} in {directory}; mount the DurableProducer's "
            f"Spark templates ConfigMap there"
        )
    driver = directory / DRIVER_TEMPLATE_KEY
    return PodTemplates(
        executor=executor,
        driver=driver if driver.is_file() else None,
        executor_container=executor_container,
        driver_container=driver_container,
    )


def write_rendered_templates(rendered: Mapping[str, str], directory: Path) -> PodTemplates:
    """Write a rendered-templates mapping (a ConfigMap's ``data``) as files Spark can read.

    A driver template left in ``directory`` by an earlier call is removed when
    ``rendered`` has none, so it cannot be picked up by mistake.
    """
    if EXECUTOR_TEMPLATE_KEY not in rendered:
        raise TemplateError(
            f"rendered templates have no {EXECUTOR_TEMPLATE_KEY!r} entry "
            f"(entries: {sorted(rendered)})"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for key in (EXECUTOR_TEMPLATE_KEY, DRIVER_TEMPLATE_KEY):
            if key in rendered:
                (directory / key).write_text(rendered[key])
            else:
                (directory / key).unlink(missing_ok=True)
    except OSError as error:
        raise TemplateError(
            f"cannot write the pod templates into {directory}: {error.strerror or error};"
            " give a directory this user can write"
        ) from error
    return templates_in_directory(directory)


def apply_to_builder(builder: BuilderT, conf: Mapping[str, str]) -> BuilderT:
    """Set every entry of ``conf`` on a ``SparkSession.Builder``; returns the builder."""
    for key, value in conf.items():
        builder.config(key, value)
    return builder


def spark_submit_args(conf: Mapping[str, str]) -> list[str]:
    """``["--conf", "key=value", ...]`` for spark-submit."""
    args: list[str] = []
    for key, value in sorted(conf.items()):
        args += ["--conf", f"{key}={value}"]
    return args


def format_spark_submit_flags(conf: Mapping[str, str]) -> str:
    """One shell-quoted line of ``--conf`` flags, for ``spark-submit $(...)`` or copy-paste."""
    return shlex.join(spark_submit_args(conf))


def format_properties(conf: Mapping[str, str]) -> str:
    """The entries in ``spark-defaults.conf`` form (``key value``, one per line)."""
    return "".join(f"{key} {value}\n" for key, value in sorted(conf.items()))
