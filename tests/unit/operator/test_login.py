"""The operator's login failure in one line (login.py)."""

from __future__ import annotations

from pathlib import Path

import kopf
from kubernetes.config import ConfigException

from durable_producer.operator.login import login_problem


def test_kopfs_login_error_is_told_by_the_kubeconfig_loaders_own_words(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("apiVersion: v1\n")
    try:
        try:
            raise ConfigException("Invalid kube-config file.\n  No configuration found.")
        except ConfigException:
            raise kopf.LoginError("Cannot authenticate the client library") from None
    except kopf.LoginError as error:
        login_error = error

    line = login_problem(login_error, {"KUBECONFIG": str(kubeconfig)})

    assert "\n" not in line
    assert f"the kubeconfig {kubeconfig} cannot be used: Invalid kube-config file. No" in line
    assert "Cannot authenticate" not in line


def test_every_file_of_kubeconfig_is_named_and_a_missing_one_said_so(tmp_path: Path) -> None:
    missing = [tmp_path / "a", tmp_path / "b"]

    line = login_problem(ValueError("x"), {"KUBECONFIG": f"{missing[0]}:{missing[1]}"})

    assert f"{missing[0]}, {missing[1]} cannot be used: no such file" in line


def test_without_kubeconfig_the_default_file_is_named() -> None:
    line = login_problem(ValueError("bad"), {})

    assert str(Path("~/.kube/config").expanduser()) in line
