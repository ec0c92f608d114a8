"""The Grafana dashboard, the PrometheusRule and the PodMonitor in monitoring/.

No Prometheus or promtool runs here, so every PromQL expression is parsed with
promql-parser (a port of Prometheus' own parser) and every metric it selects must be one the
agent exports: the names are read from a live ``AgentMetrics`` registry, not from a list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.metrics_core import Metric

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.contract import PRODUCER_LABEL
from durable_producer.operator.decide.agent_container import METRICS_PORT_NAME
from support.tools import REPO_ROOT

MONITORING = REPO_ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RULES = MONITORING / "prometheus-rules.yaml"
POD_MONITOR = MONITORING / "podmonitor.yaml"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"

# Series Prometheus itself attaches to every scrape target.
PROMETHEUS_BUILTIN_SERIES = frozenset({"up"})
# Samples a metric family of each type exposes (OpenMetrics suffixes).
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
REQUIRED_ALERTS = {
    "DurableAgentBacklogOld",
    "DurableAgentRunwayLow",
    "DurableAgentDeadLetters",
    "DurableAgentQuarantinedSegments",
    "DurableAgentDown",
    "DurableAgentForwardingStalled",
}
GRAFANA_VARIABLE = re.compile(r"\$(\{[^}]+\}|\w+)")


def family_sample_names(family: Metric) -> set[str]:
    return {family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type]}


@pytest.fixture(scope="module")
def exported_series() -> set[str]:
    """Every sample name a running agent exposes on /metrics."""
    registry = AgentMetrics().registry
    return {name for family in registry.collect() for name in family_sample_names(family)}


def selected_metric_names(expression: str) -> set[str]:
    """Metric names of every vector selector in a PromQL expression (a parse error raises)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expression!r}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def without_grafana_variables(expression: str) -> str:
    """Replace Grafana's $variables by values that make the expression plain PromQL."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        return "5m" if name in ("__rate_interval", "__interval", "__range") else "x"

    return GRAFANA_VARIABLE.sub(value, expression)


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def all_rules(rule_resource: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rule_resource["spec"]["groups"] for rule in group["rules"]]


def test_the_parser_rejects_broken_promql_and_finds_selectors() -> None:
    with pytest.raises(ValueError):
        selected_metric_names("sum(rate(durable_agent_ingest_records_total[5m])")
    assert selected_metric_names(
        "histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) > on() group_left b"
    ) == {"a_bucket", "b"}


def test_exported_series_are_read_from_the_registry(exported_series: set[str]) -> None:
    assert "durable_agent_fsync_seconds_bucket" in exported_series
    assert "durable_agent_dead_letters_total" in exported_series
    assert "durable_agent_dead_letters" not in exported_series


def test_dashboard_queries_parse_and_use_only_exported_metrics(
    dashboard: dict[str, Any], exported_series: set[str]
) -> None:
    expressions = [
        target["expr"]
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    assert len(expressions) >= 15
    used: set[str] = set()
    for expression in expressions:
        names = selected_metric_names(without_grafana_variables(expression))
        unknown = names - exported_series - PROMETHEUS_BUILTIN_SERIES
        assert not unknown, f"{expression!r} uses metrics the agent does not export: {unknown}"
        used |= names
    wanted = {
        "durable_agent_backlog_bytes",
        "durable_agent_oldest_unsent_age_seconds",
        "durable_agent_runway_seconds",
        "durable_agent_ingest_records_total",
        "durable_agent_forwarded_records_total",
        "durable_agent_fsync_seconds_bucket",
        "durable_agent_possible_duplicates_total",
        "durable_agent_dead_letters_total",
        "durable_agent_quarantined_segments",
    }
    assert wanted <= used, f"the dashboard lacks panels for {wanted - used}"


def test_dashboard_is_importable_grafana_json(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    for panel in dashboard_panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            referenced = {
                match.strip("{}") for match in GRAFANA_VARIABLE.findall(target["expr"])
            }
            assert referenced - {"__rate_interval"} <= variables, target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = without_grafana_variables(variable["query"]["query"])
            metric = re.fullmatch(r"label_values\((.*), *\w+\)", query)
            assert metric, query
            assert selected_metric_names(metric.group(1)) == {"durable_agent_backlog_bytes"}


def test_prometheus_rule_is_a_well_formed_resource(rules: dict[str, Any]) -> None:
    assert rules["apiVersion"] == "monitoring.coreos.com/v1"
    assert rules["kind"] == "PrometheusRule"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rules["metadata"]["name"])
    for group in rules["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
            if "for" in rule:
                assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
    alerts = {rule["alert"] for rule in all_rules(rules)}
    assert alerts >= REQUIRED_ALERTS, f"missing alerts: {REQUIRED_ALERTS - alerts}"


def test_alert_expressions_parse_and_use_only_exported_metrics(
    rules: dict[str, Any], exported_series: set[str]
) -> None:
    for rule in all_rules(rules):
        names = selected_metric_names(rule["expr"])
        assert names, rule["alert"]
        unknown = names - exported_series - PROMETHEUS_BUILTIN_SERIES
        assert not unknown, f"{rule['alert']} uses metrics the agent does not export: {unknown}"


def test_every_alert_links_to_its_runbook_section(rules: dict[str, Any]) -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in all_rules(rules):
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert path == "docs/runbook.md"
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in headings, f"docs/runbook.md has no section for {rule['alert']}"


def test_pod_monitor_scrapes_the_port_the_operator_injects(rules: dict[str, Any]) -> None:
    monitor = yaml.safe_load(POD_MONITOR.read_text())
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchExpressions"][0]["key"] == PRODUCER_LABEL
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == METRICS_PORT_NAME
    job = next(r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job")
    assert all(f'job="{job}"' in rule["expr"] for rule in all_rules(rules))
