"""``python -m durable_producer.spark_integration conf|sparkapplication ...``.

``conf`` prints the ``--conf`` flags for spark-submit (or ``spark-defaults.conf`` lines), e.g.::

    spark-submit $(python -m durable_producer.spark_integration conf \\
        --templates-dir /etc/durable-producer/spark) job.py

    # outside the cluster: fetch the templates of DurableProducer "orders" via the API
    spark-submit $(python -m durable_producer.spark_integration conf \\
        --producer orders --namespace data) job.py

``sparkapplication`` prints a kubeflow spark-operator SparkApplication (v1beta2) that embeds
the same templates, e.g.::

    python -m durable_producer.spark_integration sparkapplication --producer orders \
        --namespace data --name orders-batch --image registry/jobs:1 \
        --main-application-file local:///opt/jobs/write_events.py | kubectl apply -f -
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from durable_producer.contract import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    SPARK_TEMPLATES_CONFIGMAP_SUFFIX,
)
from durable_producer.spark_integration.cluster import fetch_templates, templates_configmap_name
from durable_producer.spark_integration.conf import (
    PodTemplates,
    TemplateError,
    format_properties,
    format_spark_submit_flags,
    spark_conf,
    templates_in_directory,
)
from durable_producer.spark_integration.spark_application import (
    DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_SPARK_VERSION,
    ApplicationSettings,
    format_manifest,
    spark_application,
)

DEFAULT_OUTPUT_DIR = "durable-producer-spark-templates"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m durable_producer.spark_integration",
        description="Spark helpers for durable-producer.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    conf = commands.add_parser(
        "conf",
        help="print the Spark conf that makes executors use a DurableProducer's pod templates",
    )
    _add_template_source(conf)
    conf.add_argument(
        "--format",
        choices=("flags", "properties"),
        default="flags",
        help="'flags': --conf flags for spark-submit (default); "
        "'properties': spark-defaults.conf lines",
    )
    app = commands.add_parser(
        "sparkapplication",
        help="print a spark-operator SparkApplication (v1beta2) whose executors write "
        "through agents",
    )
    _add_template_source(app)
    app.add_argument(
        "--name", required=True, type=_object_name, help="name of the SparkApplication"
    )
    app.add_argument(
        "--image", required=True, type=_image, help="Spark image with durable-producer installed"
    )
    app.add_argument(
        "--main-application-file",
        required=True,
        help="the PySpark job, e.g. local:///opt/jobs/write_events.py",
    )
    app.add_argument(
        "--streaming",
        action="store_true",
        help="a Structured Streaming job: restartPolicy Always (batch: Never)",
    )
    app.add_argument("--arg", action="append", default=[], help="job argument (repeatable)")
    app.add_argument(
        "--spark-version", default=DEFAULT_SPARK_VERSION, help="Spark version of the image"
    )
    app.add_argument("--executor-instances", type=_positive, default=2)
    app.add_argument("--executor-cores", type=_positive, default=1)
    app.add_argument("--executor-memory", type=_memory, default="2g")
    app.add_argument("--driver-cores", type=_positive, default=1)
    app.add_argument("--driver-memory", type=_memory, default="1g")
    app.add_argument(
        "--service-account",
        default=DEFAULT_SERVICE_ACCOUNT,
        help=f"the driver's service account (default: {DEFAULT_SERVICE_ACCOUNT}, "
        "created by the spark-operator's Helm chart)",
    )
    app.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark conf entry (repeatable)",
    )
    return parser


def _add_template_source(command: argparse.ArgumentParser) -> None:
    """Where the DurableProducer's rendered templates come from (both subcommands)."""
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--executor-template", type=Path, help="executor pod template file rendered by the operator"
    )
    source.add_argument(
        "--templates-dir",
        type=Path,
        help="directory holding the rendered templates (the mounted ConfigMap)",
    )
    source.add_argument(
        "--producer",
        help="fetch the templates of this DurableProducer from the cluster "
        f"(ConfigMap NAME{SPARK_TEMPLATES_CONFIGMAP_SUFFIX})",
    )
    source.add_argument("--configmap", help="fetch the templates from this ConfigMap")
    command.add_argument(
        "--namespace",
        type=_namespace,
        default="default",
        help="namespace of the ConfigMap (and of the SparkApplication)",
    )
    command.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: usual lookup)")
    command.add_argument(
        "--output-dir",
        type=Path,
        default=Path(DEFAULT_OUTPUT_DIR),
        help="where fetched templates are written for spark-submit "
        f"(default: ./{DEFAULT_OUTPUT_DIR})",
    )
    command.add_argument("--driver-template", type=Path, help="driver pod template file (optional)")
    command.add_argument(
        "--executor-container", help="Spark container name in the executor template"
    )
    command.add_argument("--driver-container", help="Spark container name in the driver template")


def _kubernetes_name(pattern: str, most: int, what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if len(text) > most or not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"{text!r} is no {what}, at most {most}")
        return text

    return parse


_object_name = _kubernetes_name(
    DNS_SUBDOMAIN_PATTERN, 253, "Kubernetes name: lowercase letters, digits, '-' and '.'"
)
_namespace = _kubernetes_name(DNS_LABEL_PATTERN, 63, "namespace: lowercase letters, digits and '-'")


def _image(text: str) -> str:
    if not text or any(character.isspace() for character in text):
        raise argparse.ArgumentTypeError(f"{text!r} is no image reference")
    return text


def _memory(text: str) -> str:
    """Spark's memory setting: a whole number with an optional unit (512m, 2g, 1024b, 1024)."""
    if not re.fullmatch(r"[0-9]+([kmgtp]?b|[kmgtp])?", text, re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"{text!r} is no Spark memory size such as 512m or 2g")
    return text


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _conf_entries(entries: list[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for entry in entries:
        key, separator, value = entry.partition("=")
        if not separator or not key.strip():
            raise TemplateError(f"--conf {entry!r} is not of the form KEY=VALUE")
        conf[key.strip()] = value
    return conf


def _settings(args: argparse.Namespace) -> ApplicationSettings:
    return ApplicationSettings(
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        main_application_file=args.main_application_file,
        spark_version=args.spark_version,
        streaming=args.streaming,
        arguments=tuple(args.arg),
        executor_instances=args.executor_instances,
        executor_cores=args.executor_cores,
        executor_memory=args.executor_memory,
        driver_cores=args.driver_cores,
        driver_memory=args.driver_memory,
        service_account=args.service_account,
        extra_conf=_conf_entries(args.conf),
    )


def _templates(args: argparse.Namespace) -> PodTemplates:
    configmap = args.configmap
    if args.producer is not None:
        configmap = templates_configmap_name(args.producer)
    directory = args.templates_dir
    if configmap is not None:
        directory = fetch_templates(
            configmap, args.namespace, args.output_dir, kubeconfig=args.kubeconfig
        ).executor.parent
    if directory is not None:
        found = templates_in_directory(
            directory,
            executor_container=args.executor_container,
            driver_container=args.driver_container,
        )
        if args.driver_template is None:
            return found
        return PodTemplates(
            executor=found.executor,
            driver=args.driver_template,
            executor_container=found.executor_container,
            driver_container=found.driver_container,
        )
    return PodTemplates(
        executor=args.executor_template,
        driver=args.driver_template,
        executor_container=args.executor_container,
        driver_container=args.driver_container,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "sparkapplication":
            manifest = spark_application(_settings(args), _templates(args))
        else:
            conf = spark_conf(_templates(args))
    except TemplateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "sparkapplication":
        sys.stdout.write(format_manifest(manifest))
    elif args.format == "properties":
        sys.stdout.write(format_properties(conf))
    else:
        print(format_spark_submit_flags(conf))
    return 0
