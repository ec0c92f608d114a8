"""The Kubernetes API calls the operator makes itself (kopf has its own client), on raw JSON.

Objects are read and written as plain dicts, so no field the kubernetes client's models do
not know is ever dropped. ``cluster(user_agent)`` is the one place an API client is made: one
per User-Agent (one per feature, see api_access.py), created on first use and kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import GROUP, PLURAL, PRODUCER_LABEL, VERSION
from durable_producer.operator.kube_objects import JsonObject
from durable_producer.operator.volume_pool import POOL_LABEL

MERGE_PATCH = "application/merge-patch+json"


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


def ignore_statuses(action: Callable[[], object], *statuses: int) -> None:
    """Run an API call; the listed HTTP statuses mean it is already done (or moot)."""
    try:
        action()
    except ApiException as error:
        if error.status not in statuses:
            raise


def _as_body(manifest: JsonObject) -> Any:
    """A manifest for the client's ``body``: it sends plain dicts as they are (no field
    dropped), though its annotations name its model classes."""
    return manifest


def _json(response: Any) -> Any:
    return json.loads(response.data or b"null")


def _labelled(response: Any, label: str, value: str) -> list[JsonObject]:
    # Filter again here: selectors are a server feature some test servers lack.
    items = (_json(response) or {}).get("items") or []
    return [
        item
        for item in items
        if ((item.get("metadata") or {}).get("labels") or {}).get(label) == value
    ]


class Cluster:
    """The operator's own API calls: DurableProducers, pods, PVCs, Jobs and ConfigMaps."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    # ------------------------------------------------------------------ DurableProducers

    def get_producer(self, namespace: str, name: str) -> JsonObject | None:
        try:
            found: JsonObject = _json(
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    # ------------------------------------------------------------------ a producer's objects

    def pool_volumes(self, namespace: str, producer: str) -> list[JsonObject]:
        """The PVCs of the producer's volume pool."""
        return _labelled(
            self.core.list_namespaced_persistent_volume_claim(
                namespace, label_selector=f"{POOL_LABEL}={producer}", _preload_content=False
            ),
            POOL_LABEL,
            producer,
        )

    def producer_pods(self, namespace: str, producer: str) -> list[JsonObject]:
        """The pods that opt in to the producer."""
        return _labelled(
            self.core.list_namespaced_pod(
                namespace, label_selector=f"{PRODUCER_LABEL}={producer}", _preload_content=False
            ),
            PRODUCER_LABEL,
            producer,
        )

    def drain_jobs(self, namespace: str, producer: str) -> list[JsonObject]:
        """The drain Jobs working on the producer's pool."""
        return _labelled(
            self.batch.list_namespaced_job(
                namespace, label_selector=f"{POOL_LABEL}={producer}", _preload_content=False
            ),
            POOL_LABEL,
            producer,
        )

    # ------------------------------------------------------------------ PVCs and Jobs

    def patch_volume(self, namespace: str, name: str, patch: JsonObject) -> JsonObject:
        patched: JsonObject = _json(
            self.core.patch_namespaced_persistent_volume_claim(
                name, namespace, patch, _content_type=MERGE_PATCH, _preload_content=False
            )
        )
        return patched

    def create_volume(self, namespace: str, manifest: JsonObject) -> None:
        self.core.create_namespaced_persistent_volume_claim(
            namespace, _as_body(manifest), _preload_content=False
        )

    def delete_volume(self, namespace: str, name: str, resource_version: str | None) -> None:
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version=resource_version)
        )
        self.core.delete_namespaced_persistent_volume_claim(
            name, namespace, body=options, _preload_content=False
        )

    def create_job(self, namespace: str, manifest: JsonObject) -> None:
        self.batch.create_namespaced_job(namespace, _as_body(manifest), _preload_content=False)

    def delete_job(self, namespace: str, name: str) -> None:
        self.batch.delete_namespaced_job(
            name, namespace, propagation_policy="Background", _preload_content=False
        )

    # ------------------------------------------------------------------ StorageClasses

    def get_storage_class(self, name: str) -> JsonObject | None:
        """A StorageClass (cluster-scoped), or None when there is none of that name."""
        storage = kubernetes.client.StorageV1Api(self.core.api_client)
        try:
            response = storage.read_storage_class(name, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        found: JsonObject = _json(response)
        return found

    # ------------------------------------------------------------------ ConfigMaps

    def read_configmap(self, namespace: str, name: str) -> JsonObject | None:
        try:
            response = self.core.read_namespaced_config_map(
                name, namespace, _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        found: JsonObject = _json(response)
        return found

    def create_configmap(self, namespace: str, manifest: JsonObject) -> None:
        self.core.create_namespaced_config_map(
            namespace, _as_body(manifest), _preload_content=False
        )

    def patch_configmap(self, namespace: str, name: str, patch: JsonObject) -> None:
        self.core.patch_namespaced_config_map(
            name, namespace, patch, _content_type=MERGE_PATCH, _preload_content=False
        )

    def delete_configmap(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_config_map(name, namespace, _preload_content=False)


_clusters: dict[str, Cluster] = {}
_clusters_lock = threading.Lock()


def cluster(user_agent: str) -> Cluster:
    """The operator's API access under ``user_agent``: made on first use, then shared."""
    with _clusters_lock:
        if user_agent not in _clusters:
            _clusters[user_agent] = Cluster(api_client(user_agent))
        return _clusters[user_agent]
