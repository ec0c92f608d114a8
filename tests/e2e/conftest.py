"""Session fixtures of the kind end-to-end suite.

Where Docker, kind, helm or kubectl are missing, every test here is skipped at collection
with a message naming what is missing. Otherwise one kind cluster is created for the session
(pinned node image), the agent, operator and Spark images are built and loaded, the chart is
installed, and a single-node Kafka and the DurableProducer "e2e" are applied. The cluster is
deleted at the end even when something failed (set DURABLE_E2E_KEEP_CLUSTER=1 to keep it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest

from e2e.kind_support import (
    KEEP_CLUSTER_ENV,
    NODE_IMAGE,
    NODE_IMAGE_ENV,
    WORKLOAD_NAMESPACE,
    KindCluster,
    load_manifest,
    wait_until,
)
from e2e.prerequisites import kind_binary, missing_prerequisites, skip_reason
from support.outcome import call_failed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e_items = [item for item in items if item.get_closest_marker("e2e")]
    if not e2e_items:
        return
    missing = missing_prerequisites()
    if missing:
        skip = pytest.mark.skip(reason=skip_reason(missing))
        for item in e2e_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def diagnostics_on_failure(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """After a failed e2e test, save the cluster's pods, events and operator log to a file."""
    yield
    if call_failed(request) and "kind_cluster" in request.fixturenames:
        path = tmp_path_factory.getbasetemp() / f"diagnostics-{request.node.name}.txt"
        path.write_text(request.getfixturevalue("kind_cluster").diagnostics())
        warnings.warn(f"{request.node.nodeid} failed: cluster diagnostics in {path}", stacklevel=1)


@pytest.fixture(scope="session")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    kind = kind_binary()
    assert kind is not None  # collection skipped the suite otherwise
    cluster = KindCluster(
        name=f"durable-e2e-{os.getpid()}",
        kind=kind,
        kubeconfig=tmp_path_factory.mktemp("kind") / "kubeconfig",
    )
    try:
        cluster.create(os.environ.get(NODE_IMAGE_ENV, NODE_IMAGE))
        cluster.build_and_load_images()
        cluster.install_chart()
        cluster.apply(load_manifest("kafka.yaml"))
        cluster.wait_for_kafka()
        cluster.apply(load_manifest("durableproducer.yaml"))
        wait_until(
            lambda: _ready(cluster), timeout=120, what="the DurableProducer e2e to be Ready"
        )
        yield cluster
    except BaseException:
        print(cluster.diagnostics())  # shown by pytest for the failing test
        raise
    finally:
        if os.environ.get(KEEP_CLUSTER_ENV) != "1":
            cluster.delete()


def _ready(cluster: KindCluster) -> bool:
    producer = cluster.get_json("durableproducer", "e2e", "--namespace", WORKLOAD_NAMESPACE)
    conditions = producer.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
