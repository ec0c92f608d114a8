"""Where the control plane's binaries are, and the one-line error when they are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_producer.local import kube_binaries
from durable_producer.local.kube_binaries import (
    KUBE_BIN_DIR_ENV,
    KubeBinaries,
    KubeBinariesMissing,
    kubernetes_version,
    required_version,
)


def test_the_versions_are_the_wrapper_modules_requirements() -> None:
    assert kubernetes_version() == "v1.35.4"
    assert required_version("etcd", "go.etcd.io/etcd/server/v3").startswith("v3.6.")
    assert required_version("kwok", "sigs.k8s.io/kwok") == "v0.8.0"


def test_the_default_directory_is_named_after_the_kubernetes_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KUBE_BIN_DIR_ENV, raising=False)

    assert kube_binaries.default_bin_dir() == (
        kube_binaries.REPO_ROOT / ".tools" / "kube" / "v1.35.4" / "bin")


def test_missing_binaries_are_one_line_naming_make_tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "etcd").write_text("")
    (tmp_path / "etcd").chmod(0o755)
    monkeypatch.setenv(KUBE_BIN_DIR_ENV, str(tmp_path))

    with pytest.raises(KubeBinariesMissing) as raised:
        KubeBinaries.locate()

    message = str(raised.value)
    assert "\n" not in message
    assert "kube-apiserver, kube-controller-manager, kube-scheduler, kwok not found" in message
    assert "etcd," not in message
    assert "make tools" in message and KUBE_BIN_DIR_ENV in message


def test_a_module_the_wrapper_does_not_require_is_a_clear_error() -> None:
    with pytest.raises(KubeBinariesMissing, match=r"requires no example\.com/absent"):
        required_version("kubernetes", "example.com/absent")
