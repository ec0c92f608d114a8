"""``conf --producer NAME``: templates fetched from the DurableProducer's ConfigMap through the
real API server, trusted through the kubeconfig's certificate authority alone."""

from __future__ import annotations

import base64
import http.server
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from durable_producer.contract import DRIVER_TEMPLATE_KEY, EXECUTOR_TEMPLATE_KEY
from durable_producer.spark_integration.cli import main
from durable_producer.spark_integration.cluster import templates_configmap_name
from durable_producer.spark_integration.conf import EXECUTOR_CONTAINER_NAME, EXECUTOR_TEMPLATE_FILE
from support.kube_harness import KubeApi, kube_api
from support.spark_templates import executor_template

__all__ = ["kube_api"]

pytestmark = pytest.mark.integration

EXECUTOR_TEMPLATE = executor_template(grace_seconds=90)


def foreign_ca() -> str:
    """A self-signed CA certificate that signed nothing of the test cluster's, base64."""
    pem = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "/dev/null", "-subj", "/CN=foreign-ca", "-days", "1"],
        capture_output=True, check=True, timeout=30).stdout
    return base64.b64encode(pem).decode()



@pytest.fixture()
def kubeconfig(kube_api: KubeApi, tmp_path: Path) -> Path:
    """The admin's kubeconfig, in the test's namespace."""
    return kube_api.cluster.plane.admin_kubeconfig(tmp_path / "kubeconfig", kube_api.namespace)


def test_cli_fetches_templates_of_a_producer(
    kube_api: KubeApi, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, answer = kube_api.call("POST", kube_api.configmaps_path, {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": templates_configmap_name("orders")},
        "data": {EXECUTOR_TEMPLATE_KEY: EXECUTOR_TEMPLATE},
    })
    assert status == 201, answer
    output = tmp_path / "templates"
    code = main(
        [
            "conf",
            "--producer",
            "orders",
            "--namespace",
            kube_api.namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--output-dir",
            str(output),
        ]
    )
    assert code == 0, capsys.readouterr().err
    args = shlex.split(capsys.readouterr().out)
    entries = dict(arg.split("=", 1) for arg in args[1::2])
    assert entries[EXECUTOR_TEMPLATE_FILE] == str((output / EXECUTOR_TEMPLATE_KEY).resolve())
    assert entries[EXECUTOR_CONTAINER_NAME] == "spark-kubernetes-executor"
    assert (output / EXECUTOR_TEMPLATE_KEY).read_text() == EXECUTOR_TEMPLATE
    assert not (output / DRIVER_TEMPLATE_KEY).exists()


def test_missing_configmap_is_a_clear_error(
    kube_api: KubeApi, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "conf",
            "--configmap",
            "absent",
            "--namespace",
            kube_api.namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--output-dir",
            str(tmp_path / "templates"),
        ]
    )
    assert code == 2
    expected = f"cannot read ConfigMap {kube_api.namespace}/absent with the Spark pod templates"
    assert f"{expected} (404" in capsys.readouterr().err


def conf_with(kubeconfig: Path, namespace: str, output: Path) -> int:
    return main(["conf", "--producer", "orders", "--namespace", namespace,
                 "--kubeconfig", str(kubeconfig), "--output-dir", str(output)])


@pytest.mark.parametrize(("broken", "expected"), [
    # Nothing listens on port 1: refused at once.
    ("server", "cannot reach the Kubernetes API at https://127.0.0.1:1"),
    # The right server with a CA that did not sign its certificate.
    ("certificate-authority", "check the kubeconfig's server and certificate authority"),
])  # fmt: skip
def test_an_unreachable_or_untrusted_api_server_is_one_clear_line(
    kube_api: KubeApi, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    broken: str, expected: str,
) -> None:
    config = yaml.safe_load(kubeconfig.read_text())  # JSON is YAML
    (cluster,) = config["clusters"]
    if broken == "server":
        cluster["cluster"]["server"] = "https://127.0.0.1:1"
    else:
        cluster["cluster"].pop("certificate-authority", None)
        cluster["cluster"]["certificate-authority-data"] = foreign_ca()
    kubeconfig.write_text(yaml.safe_dump(config))

    code = conf_with(kubeconfig, kube_api.namespace, tmp_path / "templates")

    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in err


def test_a_missing_kubeconfig_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = conf_with(tmp_path / "absent", "default", tmp_path / "templates")

    err = capsys.readouterr().err
    assert code == 2, err
    assert "no usable Kubernetes configuration (kubeconfig " in err, err


@pytest.mark.parametrize(
    "content", [b"just a string", b"clusters: [unclosed", b"\x00\xff\x10binary"]
)
def test_a_file_that_is_no_kubeconfig_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    """A string was "'str' object does not support item assignment"; invalid YAML, the
    parser's message over five lines."""
    garbage = tmp_path / "kubeconfig"
    garbage.write_bytes(content)
    code = conf_with(garbage, "default", tmp_path / "templates")

    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "not a kubeconfig" in err or "Invalid kube-config" in err, err


def test_an_api_server_that_never_answers_is_given_up_on_after_one_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """urllib3 tried four times: two minutes for a server that accepts and never answers."""
    silent = socket.create_server(("127.0.0.1", 0))
    kubeconfig = tmp_path / "kubeconfig"
    server = f"https://127.0.0.1:{silent.getsockname()[1]}"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {"server": server}}],
        "users": [{"name": "silent", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "silent"}}],
    }))
    started = time.monotonic()
    try:
        code = conf_with(kubeconfig, "default", tmp_path / "templates")
    finally:
        silent.close()
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot reach the Kubernetes API" in err, err
    assert took < 60, f"{took:.0f} s"


def test_a_kubeconfig_that_is_a_directory_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was an IsADirectoryError traceback of 31 lines."""
    code = conf_with(tmp_path, "default", tmp_path / "templates")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"error: no usable Kubernetes configuration (kubeconfig {tmp_path}): [Errno 21] Is a"
        f" directory: '{tmp_path}'; pass --kubeconfig or set KUBECONFIG to a working one"
    ]


def test_a_broken_kubeconfig_variable_is_named_not_the_in_cluster_account(
    tmp_path: Path,
) -> None:
    """A KUBECONFIG that named a broken file fell through to the in-cluster account, and the
    line said "Service host/port is not set ... set KUBECONFIG": the variable already set."""
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [unclosed")
    done = subprocess.run(
        [sys.executable, "-m", "durable_producer.spark_integration", "conf", "--producer",
         "orders", "--output-dir", str(tmp_path / "templates")],
        env={**os.environ, "KUBECONFIG": str(broken), "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: no usable Kubernetes configuration (kubeconfig {broken}): not a kubeconfig"
        " (YAML with clusters, contexts and users); pass --kubeconfig or set KUBECONFIG to a"
        " working one"
    ]


def test_a_server_that_answers_no_kubernetes_json_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proxy's HTML page with status 200 was a JSONDecodeError traceback of 48 lines. A
    local HTTP server stands in for the proxy: a real API server never answers so."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>a proxy's login page</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    server = f"http://127.0.0.1:{page.server_address[1]}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "page",
        "clusters": [{"name": "page", "cluster": {"server": server}}],
        "users": [{"name": "page", "user": {"token": "t"}}],
        "contexts": [{"name": "page", "context": {"cluster": "page", "user": "page"}}],
    }))  # fmt: skip
    try:
        code = conf_with(kubeconfig, "default", tmp_path / "templates")
    finally:
        page.shutdown()
        page.server_close()
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"error: {server} answered with no ConfigMap: is it a Kubernetes API server? check"
        " the kubeconfig's server"
    ]


def test_an_empty_kubeconfig_variable_counts_as_unset(tmp_path: Path) -> None:
    """As kubectl takes it: the in-cluster account is tried next (here: not in a pod)."""
    done = subprocess.run(
        [sys.executable, "-m", "durable_producer.spark_integration", "conf", "--producer",
         "orders", "--output-dir", str(tmp_path / "templates")],
        env={**os.environ, "KUBECONFIG": "", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no usable Kubernetes configuration (no kubeconfig, not in a pod)" in done.stderr
