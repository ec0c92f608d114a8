"""docs/install.md stays true: values table, permissions table, and the example resource."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from durable_producer.operator import crd, startup
from durable_producer.operator.act import api_access
from support.tools import CHART_DIR, REPO_ROOT

INSTALL_DOC = REPO_ROOT / "docs" / "install.md"


def doc_text() -> str:
    return INSTALL_DOC.read_text()


def table_rows(heading: str) -> list[list[str]]:
    """Cells of the first Markdown table after ``heading``, header and rule excluded."""
    section = doc_text().split(heading, 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc_text(), flags=re.DOTALL)


def leaf_values(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        leaves: dict[str, Any] = {}
        for key, child in node.items():
            leaves |= leaf_values(child, f"{prefix}.{key}" if prefix else key)
        return leaves
    return {prefix: node}


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        node = node[key]
    return node


def unquote(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


def test_values_table_lists_every_value_with_its_default() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    documented = {unquote(key): json.loads(unquote(default))
                  for key, default, _ in table_rows("## 5. Values")}

    for key, default in documented.items():
        assert lookup(values, key) == default, f"docs/install.md: wrong default for {key}"
    undocumented = [
        leaf for leaf in leaf_values(values)
        if not any(leaf == key or leaf.startswith(f"{key}.") for key in documented)
    ]
    assert not undocumented, f"docs/install.md's values table lacks {undocumented}"


def test_permissions_table_matches_the_operator_declaration() -> None:
    documented = {
        (unquote(group).strip('"'), unquote(resource), tuple(verbs.split(", ")))
        for group, resource, verbs, _ in table_rows("## 6. Permissions")
    }

    assert documented == set(api_access.KUBERNETES_API_ACCESS)


def durable_producer_examples() -> list[dict[str, Any]]:
    documents = [yaml.safe_load(block) for block in code_blocks("yaml")]
    return [doc for doc in documents if doc.get("kind") == "DurableProducer"]


def chart_crd_schema() -> dict[str, Any]:
    definition = yaml.safe_load(
        (CHART_DIR / "crds" / "durableproducers.durable.dev.yaml").read_text())
    (served,) = definition["spec"]["versions"]
    return crd.strict_schema(served["schema"]["openAPIV3Schema"])


def test_docs_show_a_durable_producer_example() -> None:
    assert durable_producer_examples()


@pytest.mark.parametrize("example", durable_producer_examples(),
                         ids=lambda doc: doc["metadata"]["name"])
def test_durable_producer_examples_validate_against_the_chart_crd(
    example: dict[str, Any],
) -> None:
    jsonschema.validate(example, chart_crd_schema())
    assert example["apiVersion"] == "durable.dev/v1alpha1"


def test_the_crd_schema_rejects_a_broken_example() -> None:
    broken = yaml.safe_load(yaml.safe_dump(durable_producer_examples()[0]))
    broken["spec"]["fsync"]["policy"] = "sometimes"
    del broken["spec"]["throughput"]

    errors = sorted(
        error.message for error in jsonschema.Draft7Validator(chart_crd_schema()).iter_errors(
            broken)
    )

    assert any("'sometimes' is not one of" in message for message in errors), errors
    assert any("'throughput' is a required property" in message for message in errors), errors


def test_finalizer_named_in_the_uninstall_notes_is_the_operators() -> None:
    assert f"`{startup.FINALIZER}`" in doc_text()
