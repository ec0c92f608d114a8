"""The operator's declared Kubernetes API access (what the chart's RBAC grants) and finalizer."""

from __future__ import annotations

import re
from pathlib import Path

from durable_producer.operator import api_access, model, startup


def test_api_access_list_is_well_formed_and_least_privilege() -> None:
    known_verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    seen: set[tuple[str, str]] = set()
    for group, resource, verbs in api_access.KUBERNETES_API_ACCESS:
        assert (group, resource) not in seen, f"{group}/{resource} listed twice"
        seen.add((group, resource))
        assert verbs and set(verbs) <= known_verbs and "*" not in verbs
        assert len(set(verbs)) == len(verbs)
    assert (model.GROUP, model.PLURAL) in seen
    assert (model.GROUP, f"{model.PLURAL}/status") in seen
    # The operator never deletes or rewrites whole DurableProducers.
    dp_verbs = dict(((g, r), v) for g, r, v in api_access.KUBERNETES_API_ACCESS)
    assert not {"delete", "update", "create"} & set(dp_verbs[(model.GROUP, model.PLURAL)])


def test_finalizer_is_ours() -> None:
    assert startup.FINALIZER == "durable.dev/finalizer"


def test_operator_guide_lists_exactly_the_declared_api_access() -> None:
    guide = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()
    section = guide[guide.index("## Kubernetes API access") :]
    rows = re.findall(r"^\| `([^`]*)`[^|]*\| `([^`]+)` \| ([a-z, ]+) \|$", section, re.MULTILINE)
    documented = {(group.strip('"'), resource, tuple(v.strip() for v in verbs.split(",")))
                  for group, resource, verbs in rows}  # fmt: skip
    assert documented == set(api_access.KUBERNETES_API_ACCESS)
