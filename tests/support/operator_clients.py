"""The operator's own Kubernetes API clients (act/cluster.py), run in the test's process,
reaching the test control plane as its admin; and an admin client to build them from."""

from __future__ import annotations

import kubernetes
import pytest

from durable_producer.operator.act import cluster as cluster_module
from support.kube_cluster import Cluster


def operator_clients_on(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's clients, made afresh, reach ``cluster`` as its admin."""
    # kubernetes reads $KUBECONFIG once, at import: its default location is what counts.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(cluster.kubeconfig))
    monkeypatch.setattr(cluster_module, "_clusters", {})


def admin_api_client(cluster: Cluster) -> kubernetes.client.ApiClient:
    """A kubernetes client on ``cluster``'s admin kubeconfig (to wrap in an operator
    ``Cluster`` a test scripts)."""
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig),
                                       client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)
