"""The real ``kopf run`` of the operator with credentials it cannot use (login.py): one line
and exit code 2, never kopf's tracebacks. (A kubeconfig that works is what every other test of
this folder logs in with, through the same handler.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_producer.local.ports import free_port
from durable_producer.operator.login import LOGIN_FAILED_EXIT
from durable_producer.operator.settings import METRICS_PORT_ENV

pytestmark = pytest.mark.integration


def run_operator(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")},
        "KUBECONFIG": str(kubeconfig),
        METRICS_PORT_ENV: str(free_port()),  # its endpoint's thread must not hold the exit
    }
    command = [sys.executable, "-m", "kopf", "run", "-m", "durable_producer.operator.handlers",
               "--standalone", "--all-namespaces"]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "[ERROR" in line]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("this: is: not: yaml: [", "mapping values are not allowed here"),
        ("apiVersion: v1\nkind: Config\ncurrent-context: gone\n", "gone"),
        (None, "no such file"),
    ],
    ids=["not-yaml", "no-such-context", "missing"],
)
def test_a_kubeconfig_that_cannot_be_used_stops_the_operator_with_one_line(
    tmp_path: Path, content: str | None, said: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)

    result = run_operator(kubeconfig)

    output = result.stdout + result.stderr
    assert result.returncode == LOGIN_FAILED_EXIT, output
    assert "Traceback" not in output, output
    [line] = error_lines(output)
    assert "cannot log in to the Kubernetes API" in line
    assert str(kubeconfig) in line and said in line
    assert "point KUBECONFIG at a working one" in line
