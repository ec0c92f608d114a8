"""The real helm and kubectl binaries installed by scripts/install-tools.sh, and chart rendering.

Tests that need a binary call ``helm_binary()`` / ``kubectl_binary()``: when the binary is
missing the test is skipped with a reason that says how to install it (CI runs `make tools`
first, so there they always run).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
CHART_DIR = REPO_ROOT / "charts" / "durable-producer"
INSTALL_HINT = "run `make tools` (bash scripts/install-tools.sh) to install it"


def _tool_binary(name: str) -> Path:
    path = TOOLS_BIN / name
    if not path.is_file():
        pytest.skip(f"{name} is not installed at {path}: {INSTALL_HINT}")
    return path


def helm_binary() -> Path:
    """The helm v4 binary in .tools/bin, or skip the calling test."""
    return _tool_binary("helm")


def kubectl_binary() -> Path:
    """The kubectl v1.35 binary in .tools/bin, or skip the calling test."""
    return _tool_binary("kubectl")


def run_helm(
    args: Sequence[str], *, values: Mapping[str, Any] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; ``values`` (if given) are passed as a values file on stdin."""
    command = [str(helm_binary()), *args]
    stdin_text = None
    if values is not None:
        command += ["--values", "-"]
        stdin_text = json.dumps(values)
    return subprocess.run(
        command, input=stdin_text, capture_output=True, text=True, timeout=timeout, check=False
    )


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "dp",
    namespace: str = "durable-system",
    extra_args: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``helm template`` the chart and return the rendered objects (CRDs included)."""
    result = run_helm(
        [
            "template",
            release,
            str(CHART_DIR),
            "--namespace",
            namespace,
            "--include-crds",
            *extra_args,
        ],
        values=values,
    )
    if result.returncode != 0:
        raise AssertionError(f"helm template failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def objects_of_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj.get("kind") == kind]


def single_object(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    matching = objects_of_kind(objects, kind)
    assert len(matching) == 1, f"expected exactly one {kind}, got {len(matching)}"
    return matching[0]
