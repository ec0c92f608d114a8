"""What the kind end-to-end suite needs, and a plain-words list of what is missing.

The suite needs a running Docker engine (not only the ``docker`` client: ``docker info``
must answer), the ``kind`` binary, and the helm and kubectl binaries that
``make tools`` installs into ``.tools/bin``. Where any is missing, every e2e test is
skipped with :func:`skip_reason` as the message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
KIND_ENV = "KIND"  # path of a kind binary that is not on PATH

# Answers "does this command succeed?"; injectable so the decision can be tested anywhere.
CommandProbe = Callable[[Sequence[str]], bool]
BinaryLookup = Callable[[str], str | None]


def command_succeeds(command: Sequence[str]) -> bool:
    try:
        result = subprocess.run(command, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def kind_binary(which: BinaryLookup = shutil.which) -> str | None:
    return os.environ.get(KIND_ENV) or which("kind")


def missing_prerequisites(
    *,
    which: BinaryLookup = shutil.which,
    succeeds: CommandProbe = command_succeeds,
    tools_bin: Path = TOOLS_BIN,
) -> list[str]:
    """Each missing prerequisite, described with how to get it; empty when all are there."""
    missing: list[str] = []
    docker = which("docker")
    if docker is None:
        missing.append("docker (the client binary is not on PATH)")
    elif not succeeds([docker, "info"]):
        missing.append(
            "a Docker engine (`docker info` fails: the docker client exists but no daemon"
            " answers; start dockerd or point DOCKER_HOST at one)"
        )
    kind = kind_binary(which)
    if kind is None:
        missing.append(f"kind (not on PATH and ${KIND_ENV} is not set; see https://kind.sigs.k8s.io)")
    elif not succeeds([kind, "version"]):
        missing.append(f"kind ({kind} version fails)")
    for tool in ("helm", "kubectl"):
        if not (tools_bin / tool).is_file():
            missing.append(f"{tool} (run `make tools` to install it into .tools/bin)")
    return missing


def skip_reason(missing: Sequence[str]) -> str:
    return "kind e2e suite needs " + "; ".join(missing)
