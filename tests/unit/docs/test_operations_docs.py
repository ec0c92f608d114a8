"""The operations docs cannot drift silently: their links resolve, the metric names they cite
are exported by the agent, and the commands they show exist in the agent's CLI."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.contract import DATA_DIR
from durable_producer.operator.model.model import DEFAULT_AGENT_IMAGE
from support.tools import REPO_ROOT

DOCS = REPO_ROOT / "docs"
OPERATIONS_DOCS = ("architecture.md", "failure-semantics.md", "runbook.md", "configuration.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
METRIC = re.compile(r"\bdurable_agent_[a-z_]+\b")
AGENT_COMMAND = re.compile(r"(?<![-\w])durable-agent ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
COMMAND_GROUPS = ("wal", "dead-letters")


def anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of a document's headings."""
    return {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for family in AgentMetrics().registry.collect():
        names.add(family.name)
        names |= {sample.name for sample in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


@pytest.mark.parametrize("doc", OPERATIONS_DOCS)
def test_relative_links_resolve(doc: str) -> None:
    text = re.sub(r"`[^`\n]*`", "", (DOCS / doc).read_text())  # code is not a link
    links = [link for link in LINK.findall(text) if not re.match(r"[a-z]+://", link)]
    assert links, f"{doc} links nowhere"
    for link in links:
        path, _, anchor = link.partition("#")
        target = (DOCS / path) if path else DOCS / doc
        assert target.exists(), f"{doc} links to a missing {path}"
        if anchor:
            assert anchor in anchors(target.read_text()), f"{doc}: no #{anchor} in {target.name}"


@pytest.mark.parametrize("doc", OPERATIONS_DOCS)
def test_cited_metrics_are_exported(doc: str) -> None:
    exported = exported_metric_names()
    cited = set(METRIC.findall((DOCS / doc).read_text()))
    unknown = {name for name in cited if name not in exported}
    assert not unknown, f"{doc} cites metrics the agent does not export: {unknown}"


def test_runbook_commands_exist_in_the_agent_cli() -> None:
    parser = build_parser({})
    text = (DOCS / "runbook.md").read_text()
    commands = {
        f"{first} {second}" if first in COMMAND_GROUPS else first
        for first, second in AGENT_COMMAND.findall(text)
    }
    assert {"wal inspect", "drain", "dead-letters list", "dead-letters resend"} <= commands
    for command in commands:
        words = command.split()
        arguments = {
            "wal inspect": ["/tmp/wal"],
            "drain": ["--kafka-bootstrap", "k:9092"],
            "dead-letters resend": ["--kafka-bootstrap", "k:9092"],
        }.get(" ".join(words), [])
        parser.parse_args([*words, *arguments])  # an unknown command exits


def test_failure_table_covers_every_case_the_issue_names() -> None:
    text = (DOCS / "failure-semantics.md").read_text().lower()
    for case in ("agent crash", "node loss", "broker outage", "slow broker", "full disk",
                 "corrupt file", "pod deletion", "`always`", "`interval`", "`never`"):
        assert f"| {case}" in text, f"failure-semantics.md has no table row for {case}"


def test_runbook_manifests_are_valid_kubernetes_objects() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "runbook.md").read_text(), re.S)
    objects = [obj for block in blocks for obj in yaml.safe_load_all(block) if obj]
    assert [obj["kind"] for obj in objects] == ["Job"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.35.0", strict=True)
    container = objects[0]["spec"]["template"]["spec"]["containers"][0]
    build_parser({}).parse_args(container["args"])  # the drain arguments the agent accepts
    assert container["image"] == DEFAULT_AGENT_IMAGE
    mount = container["volumeMounts"][0]["mountPath"]
    assert mount == DATA_DIR
