"""``python -m durable_producer.spark_integration conf ...``: Spark conf for the pod templates.

Prints the ``--conf`` flags for spark-submit (or ``spark-defaults.conf`` lines), e.g.::

    spark-submit $(python -m durable_producer.spark_integration conf \\
        --templates-dir /etc/durable-producer/spark) job.py

    # outside the cluster: fetch the templates of DurableProducer "orders" via the API
    spark-submit $(python -m durable_producer.spark_integration conf \\
        --producer orders --namespace data) job.py
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from durable_producer.contract import SPARK_TEMPLATES_CONFIGMAP_SUFFIX
from durable_producer.spark_integration.cluster import fetch_templates, templates_configmap_name
from durable_producer.spark_integration.conf import (
    PodTemplates,
    TemplateError,
    format_properties,
    format_spark_submit_flags,
    spark_conf,
    templates_in_directory,
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
    source = conf.add_mutually_exclusive_group(required=True)
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
    conf.add_argument("--namespace", default="default", help="namespace of the ConfigMap")
    conf.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: usual lookup)")
    conf.add_argument(
        "--output-dir",
        type=Path,
        default=Path(DEFAULT_OUTPUT_DIR),
        help="where fetched templates are written for spark-submit "
        f"(default: ./{DEFAULT_OUTPUT_DIR})",
    )
    conf.add_argument("--driver-template", type=Path, help="driver pod template file (optional)")
    conf.add_argument("--executor-container", help="Spark container name in the executor template")
    conf.add_argument("--driver-container", help="Spark container name in the driver template")
    conf.add_argument(
        "--format",
        choices=("flags", "properties"),
        default="flags",
        help="'flags': --conf flags for spark-submit (default); "
        "'properties': spark-defaults.conf lines",
    )
    return parser


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
        conf = spark_conf(_templates(args))
    except TemplateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.format == "properties":
        sys.stdout.write(format_properties(conf))
    else:
        print(format_spark_submit_flags(conf))
    return 0
