"""Where the local control plane's binaries are: built by scripts/install-kube.sh (`make tools`).

The versions live in the wrapper modules' go.mod files under scripts/kube/ (the one place they
are defined); the binaries go to ``<repo>/.tools/kube/<kubernetes version>/bin``. The
environment variable ``DURABLE_PRODUCER_KUBE_BIN_DIR`` names another directory instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

KUBE_BIN_DIR_ENV = "DURABLE_PRODUCER_KUBE_BIN_DIR"
REPO_ROOT = Path(__file__).resolve().parents[3]
KUBE_MODULES_DIR = REPO_ROOT / "scripts" / "kube"
KUBE_TOOLS_DIR = REPO_ROOT / ".tools" / "kube"
INSTALL_HINT = "run `make tools` (bash scripts/install-kube.sh) to build it"

ETCD = "etcd"
KUBE_APISERVER = "kube-apiserver"
KUBE_CONTROLLER_MANAGER = "kube-controller-manager"
KUBE_SCHEDULER = "kube-scheduler"
KWOK = "kwok"
ALL_BINARIES = (ETCD, KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, KWOK)


class KubeBinariesMissing(RuntimeError):
    """A control-plane binary is not installed; the message says how to install it."""


def required_version(wrapper: str, module: str) -> str:
    """The version of ``module`` that scripts/kube/<wrapper>/go.mod requires."""
    go_mod = KUBE_MODULES_DIR / wrapper / "go.mod"
    try:
        text = go_mod.read_text()
    except OSError as error:
        raise KubeBinariesMissing(f"cannot read {go_mod}: {error.strerror}") from None
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise KubeBinariesMissing(f"{go_mod} requires no {module}")
    return match.group(1)


def kubernetes_version() -> str:
    """The Kubernetes version the control plane is built from, e.g. ``v1.35.4``."""
    return required_version("kubernetes", "k8s.io/kubernetes")


def default_bin_dir() -> Path:
    override = os.environ.get(KUBE_BIN_DIR_ENV)
    if override:
        return Path(override)
    return KUBE_TOOLS_DIR / kubernetes_version() / "bin"


@dataclass(frozen=True)
class KubeBinaries:
    """The directory holding etcd, the Kubernetes control-plane binaries and kwok."""

    bin_dir: Path

    @classmethod
    def locate(cls) -> KubeBinaries:
        """The installed binaries; ``KubeBinariesMissing`` (one line) if any is absent."""
        binaries = cls(default_bin_dir())
        missing = [name for name in ALL_BINARIES if not os.access(binaries.path(name), os.X_OK)]
        if missing:
            raise KubeBinariesMissing(
                f"{', '.join(missing)} not found in {binaries.bin_dir}: {INSTALL_HINT}"
                f" (or set {KUBE_BIN_DIR_ENV})"
            )
        return binaries

    def path(self, name: str) -> Path:
        return self.bin_dir / name
