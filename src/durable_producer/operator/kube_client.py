"""The Kubernetes API client the operator's own calls use (kopf has its own)."""

from __future__ import annotations

import kubernetes


def api_client(user_agent: str) -> kubernetes.client.ApiClient:
    """In-cluster configuration, else the kubeconfig; ``user_agent`` tells the callers apart."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = user_agent
    return client
