"""docs/configuration.md: its field tables are generated from the committed CRD schema.

Regenerate after changing the model (and the CRD):
``.venv/bin/python tests/unit/docs/test_configuration_docs.py`` rewrites the generated part.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import yaml

from durable_producer.buffer_agent.settings import COMMON_OPTIONS, RUN_OPTIONS
from durable_producer.operator.decide.agent_container import agent_run_args
from durable_producer.operator.model.model import PATTERN_DESCRIPTIONS, DurableProducerSpec
from support.tools import REPO_ROOT

CRD_FILE = REPO_ROOT / "crds" / "durableproducers.durable.dev.yaml"
CONFIGURATION_DOC = REPO_ROOT / "docs" / "configuration.md"
AGENT_DOC = REPO_ROOT / "docs" / "agent.md"
GENERATED_SECTION = re.compile(
    r"(<!-- BEGIN GENERATED: [^>]*-->\n)(.*?)(<!-- END GENERATED -->)", re.S
)

Schema = dict[str, Any]


def crd_schema() -> Schema:
    crd = yaml.safe_load(CRD_FILE.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def all_fields(
    node: Schema, path: str, parent: str | None = None
) -> Iterator[tuple[str, Schema, str]]:
    """(path, schema, requirement) of every field below ``node``, parents before children.

    ``requirement`` is "(required)", "(required in `parent`)" for a required field of an
    optional object, or "".
    """
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        requirement = ""
        if name in required:
            requirement = "(required)" if parent is None else f"(required in `{parent}`)"
        yield child_path, child, requirement
        child_parent = parent if name in required else child_path
        if child.get("type") == "object":
            yield from all_fields(child, child_path, child_parent)
        elif child.get("type") == "array" and child["items"].get("type") == "object":
            yield from all_fields(child["items"], f"{child_path}[]", f"{child_path}[]")


def type_name(schema: Schema) -> str:
    if schema["type"] == "array":
        return f"list of {type_name(schema['items'])}"
    return str(schema["type"])


def constraints(schema: Schema) -> str:
    """Bounds, enums and patterns of a field (and of its list items) in words."""
    parts: list[str] = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{value}`" for value in schema["enum"]))
    if "minimum" in schema and "maximum" in schema:
        parts.append(f"{schema['minimum']} to {schema['maximum']}")
    elif "minimum" in schema:
        parts.append(f">= {schema['minimum']}")
    elif "maximum" in schema:
        parts.append(f"<= {schema['maximum']}")
    if "pattern" in schema:
        pattern = schema["pattern"]
        parts.append(PATTERN_DESCRIPTIONS.get(pattern, f"matches `{pattern}`"))
    if "minItems" in schema or "maxItems" in schema:
        parts.append(f"{schema.get('minItems', 0)} to {schema.get('maxItems', 'any')} items")
    if "maxLength" in schema and "pattern" not in schema:
        parts.append(f"at most {schema['maxLength']} characters")
    for rule in schema.get("x-kubernetes-validations", []):
        parts.append(rule["message"])
    if schema["type"] == "array" and schema["items"].get("type") != "object":
        item_parts = constraints(schema["items"])
        if item_parts:
            parts.append(f"each: {item_parts}")
    return "; ".join(parts)


def default_text(schema: Schema, requirement: str) -> str:
    if requirement:
        return requirement
    if "default" not in schema:
        return ""
    if schema["type"] == "object":
        return "its fields' defaults"
    return f"`{json.dumps(schema['default'])}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def field_table(node: Schema, root: str) -> str:
    lines = ["| field | type | default | allowed values | meaning |", "|---|---|---|---|---|"]
    for path, schema, requirement in all_fields(node, root):
        lines.append(
            f"| `{path}` | {type_name(schema)} | {cell(default_text(schema, requirement))} "
            f"| {cell(constraints(schema))} | {cell(schema.get('description', ''))} |"
        )
    return "\n".join(lines) + "\n"


def generated_reference() -> str:
    schema = crd_schema()
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    return (
        "### spec\n\n"
        + field_table(spec, "spec")
        + "\n### status (written by the operator)\n\n"
        + field_table(status, "status")
    )


def rewrite(text: str) -> str:
    return GENERATED_SECTION.sub(
        lambda match: match.group(1) + generated_reference() + match.group(3), text, count=1
    )


def test_configuration_reference_matches_the_crd_schema() -> None:
    text = CONFIGURATION_DOC.read_text()
    match = GENERATED_SECTION.search(text)
    assert match, "docs/configuration.md lost its generated section"
    assert match.group(2) == generated_reference(), (
        "docs/configuration.md is out of date: regenerate it with "
        "`.venv/bin/python tests/unit/docs/test_configuration_docs.py`"
    )


def test_every_crd_field_is_documented() -> None:
    text = CONFIGURATION_DOC.read_text()
    schema = crd_schema()
    paths = [path for path, _, _ in all_fields(schema["properties"]["spec"], "spec")]
    assert "spec.kafka.bootstrapServers" in paths
    assert "spec.agent.ports.metrics" in paths
    assert "spec.kafka.sasl.passwordKey" in paths
    assert "spec.kafka.tls" in paths
    for path in paths:
        assert f"| `{path}` |" in text, f"{path} is missing from docs/configuration.md"


def test_a_changed_schema_changes_the_reference() -> None:
    schema = crd_schema()
    fsync = schema["properties"]["spec"]["properties"]["fsync"]["properties"]["intervalMs"]
    fsync["default"] = 12345
    assert "`12345`" in field_table(schema["properties"]["spec"], "spec")
    assert "`12345`" not in generated_reference()


def test_configuration_points_at_the_agent_flag_reference() -> None:
    text = CONFIGURATION_DOC.read_text()
    assert "(agent.md#settings)" in text
    assert "## Settings" in AGENT_DOC.read_text()
    assert "<!-- BEGIN GENERATED: python -m durable_producer.buffer_agent.settings" in (
        AGENT_DOC.read_text()
    )


def mapping_section() -> str:
    text = CONFIGURATION_DOC.read_text()
    return text.split("## How a DurableProducer becomes agent settings", 1)[1].split("\n## ", 1)[0]


def test_the_field_to_flag_mapping_names_real_flags_the_operator_sets() -> None:
    known = {option.flag for option in (*COMMON_OPTIONS, *RUN_OPTIONS)}
    spec = DurableProducerSpec.model_validate(
        {"kafka": {"bootstrapServers": ["kafka:9092"]},
         "throughput": {"peakBytesPerSecond": 1000}}
    )
    injected = {argument.split("=", 1)[0] for argument in agent_run_args(spec)}
    cited = set(re.findall(r"`(--[a-z][a-z-]*)[`=]", mapping_section()))  # not --ssl-*-file
    assert "--fsync" in cited and "--max-buffer-bytes" in cited
    for flag in cited:
        assert flag in known, f"docs/configuration.md names an unknown agent flag {flag}"
    defaults_only = {"--max-batch-bytes", "--default-partitions"}
    assert cited - defaults_only - {"--security-protocol"} <= injected, (
        f"the operator does not set {cited - defaults_only - injected}"
    )


if __name__ == "__main__":
    CONFIGURATION_DOC.write_text(rewrite(CONFIGURATION_DOC.read_text()))
    sys.stdout.write(f"rewrote {CONFIGURATION_DOC}\n")
