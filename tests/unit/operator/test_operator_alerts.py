"""monitoring/operator-rules.yaml: every alert parses, uses metrics that exist, and has a
runbook section. The operator's metric names are read from its live registry."""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest
import yaml

from durable_producer.operator import metrics
from support.tools import REPO_ROOT

RULES = REPO_ROOT / "monitoring" / "operator-rules.yaml"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
# Series from elsewhere: Prometheus itself, and the API server's admission metrics.
EXTERNAL_SERIES = frozenset({"up", "apiserver_admission_webhook_rejection_count"})
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
REQUIRED = {"DurableOperatorWebhookFailing", "DurableOperatorDrainsFailing",
            "DurableOperatorPoolExhausted"}


def exported() -> set[str]:
    metrics.register_defaults([])
    return {family.name + suffix for family in metrics.REGISTRY.collect()
            for suffix in SUFFIXES[family.type]}


def selected(expression: str) -> set[str]:
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["spec"]["groups"] for rule in group["rules"]]


def test_the_required_alerts_exist() -> None:
    assert {rule["alert"] for rule in rules()} >= REQUIRED


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_each_alert_parses_and_selects_exported_metrics(rule: dict[str, Any]) -> None:
    names = selected(rule["expr"])

    assert names
    assert names - EXTERNAL_SERIES <= exported(), rule["alert"]
    assert rule["labels"]["severity"] in ("info", "warning", "critical")


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_each_alert_has_its_runbook_section(rule: dict[str, Any]) -> None:
    anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]

    assert anchor == rule["alert"].lower()
    assert f"### {rule['alert']}\n" in RUNBOOK.read_text()


def test_operator_series_are_scoped_to_the_pod_monitors_job() -> None:
    for rule in rules():
        if "durable_operator_" in rule["expr"]:
            assert 'job="durable-operator"' in rule["expr"], rule["alert"]
