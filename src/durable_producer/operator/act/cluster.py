"""The Kubernetes API calls the operator makes itself (kopf has its own client), on raw JSON.

Objects are read and written as plain dicts, so no field the kubernetes client's models do
not know is ever dropped. ``cluster(user_agent)`` is the one place an API client is made: one
per User-Agent (one per feature, see api_access.py), created on first use and kept.

Every call has a timeout. Inside ``api_deadline(seconds)`` (the admission webhook, which the
API server gives up on after its own timeout) each call gets only the time left, and a client
that never retries on its own; once the time is up a call raises ``ApiDeadlineExceeded``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from durable_producer.contract import GROUP, KIND, PLURAL, POOL_LABEL, PRODUCER_LABEL, VERSION
from durable_producer.operator.decide.kube_objects import JsonObject

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (JSON is valid YAML)
# Outside a deadline (the timers and handlers): a hung connection must not stall them for ever.
DEFAULT_REQUEST_TIMEOUT_SECONDS = 60.0

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "durable_producer_api_deadline", default=None
)


class ApiDeadlineExceeded(TimeoutError):
    """The time given to ``api_deadline`` ran out before an API call could be made."""


API_FAILURES = (ApiException, ApiDeadlineExceeded, urllib3.exceptions.HTTPError)
"""What an API call made here may raise: an answer, the deadline, the connection."""


@contextlib.contextmanager
def api_deadline(seconds: float, *, started: float | None = None) -> Iterator[None]:
    """Bound every API call made inside (in this context) to ``seconds`` in all, counted from
    ``started`` (``time.monotonic()``; the admission review's arrival), else from now."""
    token = _deadline.set((time.monotonic() if started is None else started) + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> float | None:
    """What is left of the deadline (None outside one); ApiDeadlineExceeded once it is up.

    Every wait inside a deadline (an API call, a lock) is bounded by this."""
    deadline = _deadline.get()
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ApiDeadlineExceeded("no time left for the Kubernetes API call")
    return left


def _request_timeout() -> float:
    """The timeout of the next call: what is left of the deadline, or the default."""
    left = time_left()
    return DEFAULT_REQUEST_TIMEOUT_SECONDS if left is None else left


def _call_options() -> dict[str, Any]:
    """Raw JSON answers (no model classes), within the timeout."""
    return {"_preload_content": False, "_request_timeout": _request_timeout()}


def api_client(user_agent: str, *, retries: bool = True) -> kubernetes.client.ApiClient:
    """In-cluster configuration, else the kubeconfig; ``user_agent`` tells the callers apart.

    ``retries=False``: urllib3 does not retry on its own (each retry would get the whole
    timeout again, past a deadline).
    """
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    if not retries:
        configuration.retries = False
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


def _read_or_none(read: Callable[[], Any]) -> JsonObject | None:
    """One object as raw JSON, or None when there is none of that name (404)."""
    try:
        response = read()
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    found: JsonObject = _json(response)
    return found


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
                    GROUP, VERSION, namespace, PLURAL, name, **_call_options()
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def patch_producer_status_if_unchanged(
        self, namespace: str, name: str, resource_version: str, status: JsonObject
    ) -> bool:
        """Merge-patch the status only if the object is still at ``resource_version`` (the
        API server answers 409 otherwise); False when it changed meanwhile or is gone."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, patch,
                _content_type=MERGE_PATCH, **_call_options(),
            )  # fmt: skip
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def apply_producer_conditions(
        self,
        namespace: str,
        name: str,
        conditions: list[JsonObject],
        field_manager: str,
        resource_version: str | None = None,
    ) -> str | None:
        """Server-side apply ``conditions`` to the status as ``field_manager`` (forced: they
        are its own). The list is a map keyed by type: conditions of other managers stay, and
        one this manager applied before but not now is removed. With ``resource_version``
        only onto that version. The new resourceVersion; None when the object changed
        meanwhile (409) or is gone (404)."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace}
            | ({"resourceVersion": resource_version} if resource_version else {}),
            "status": {"conditions": conditions},
        }
        try:
            answer = _json(
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, body, field_manager=field_manager,
                    force=True, _content_type=APPLY_PATCH, **_call_options(),
                )
            )  # fmt: skip
        except ApiException as error:
            if error.status in (404, 409):
                return None
            raise
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "") or None

    # ------------------------------------------------------------------ a producer's objects

    def pool_volumes(self, namespace: str, producer: str) -> list[JsonObject]:
        """The PVCs of the producer's volume pool."""
        return _labelled(
            self.core.list_namespaced_persistent_volume_claim(
                namespace, label_selector=f"{POOL_LABEL}={producer}", **_call_options()
            ),
            POOL_LABEL,
            producer,
        )

    def producer_pods(self, namespace: str, producer: str) -> list[JsonObject]:
        """The pods that opt in to the producer."""
        return _labelled(
            self.core.list_namespaced_pod(
                namespace, label_selector=f"{PRODUCER_LABEL}={producer}", **_call_options()
            ),
            PRODUCER_LABEL,
            producer,
        )

    def drain_pods(self, namespace: str, producer: str) -> list[JsonObject]:
        """The pods of the drain Jobs working on the producer's pool."""
        return _labelled(
            self.core.list_namespaced_pod(
                namespace, label_selector=f"{POOL_LABEL}={producer}", **_call_options()
            ),
            POOL_LABEL,
            producer,
        )

    def drain_jobs(self, namespace: str, producer: str) -> list[JsonObject]:
        """The drain Jobs working on the producer's pool."""
        return _labelled(
            self.batch.list_namespaced_job(
                namespace, label_selector=f"{POOL_LABEL}={producer}", **_call_options()
            ),
            POOL_LABEL,
            producer,
        )

    # ------------------------------------------------------------------ PVCs and Jobs

    def patch_volume(self, namespace: str, name: str, patch: JsonObject) -> JsonObject:
        patched: JsonObject = _json(
            self.core.patch_namespaced_persistent_volume_claim(
                name, namespace, patch, _content_type=MERGE_PATCH, **_call_options()
            )
        )
        return patched

    def create_volume(self, namespace: str, manifest: JsonObject) -> None:
        self.core.create_namespaced_persistent_volume_claim(
            namespace, _as_body(manifest), **_call_options()
        )

    def read_volume(self, namespace: str, name: str) -> JsonObject | None:
        return _read_or_none(
            lambda: self.core.read_namespaced_persistent_volume_claim(
                name, namespace, **_call_options()
            )
        )

    def delete_volume(
        self, namespace: str, name: str, resource_version: str | None
    ) -> JsonObject | None:
        """Delete the PVC if it is still at ``resource_version``; the object as the API server
        answered (marked deleted while a finalizer holds it), or None."""
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version=resource_version)
        )
        answer = _json(
            self.core.delete_namespaced_persistent_volume_claim(
                name, namespace, body=options, **_call_options()
            )
        )
        return answer if isinstance(answer, dict) and answer.get("kind") != "Status" else None

    def create_job(self, namespace: str, manifest: JsonObject) -> None:
        self.batch.create_namespaced_job(namespace, _as_body(manifest), **_call_options())

    def delete_job(self, namespace: str, name: str) -> None:
        self.batch.delete_namespaced_job(
            name, namespace, propagation_policy="Background", **_call_options()
        )

    # ------------------------------------------------------------------ StorageClasses

    def get_storage_class(self, name: str) -> JsonObject | None:
        """A StorageClass (cluster-scoped), or None when there is none of that name."""
        storage = kubernetes.client.StorageV1Api(self.core.api_client)
        return _read_or_none(lambda: storage.read_storage_class(name, **_call_options()))

    # ------------------------------------------------------------------ PVs and Nodes

    def get_persistent_volume(self, name: str) -> JsonObject | None:
        """A PersistentVolume (cluster-scoped), or None when there is none of that name."""
        return _read_or_none(lambda: self.core.read_persistent_volume(name, **_call_options()))

    def get_node(self, name: str) -> JsonObject | None:
        """A Node, or None when there is none of that name."""
        return _read_or_none(lambda: self.core.read_node(name, **_call_options()))

    # ------------------------------------------------------------------ ConfigMaps

    def read_configmap(self, namespace: str, name: str) -> JsonObject | None:
        return _read_or_none(
            lambda: self.core.read_namespaced_config_map(name, namespace, **_call_options())
        )

    def create_configmap(self, namespace: str, manifest: JsonObject) -> None:
        self.core.create_namespaced_config_map(namespace, _as_body(manifest), **_call_options())

    def patch_configmap(self, namespace: str, name: str, patch: JsonObject) -> None:
        self.core.patch_namespaced_config_map(
            name, namespace, patch, _content_type=MERGE_PATCH, **_call_options()
        )

    def delete_configmap(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_config_map(name, namespace, **_call_options())


_clusters: dict[tuple[str, bool], Cluster] = {}
_clusters_lock = threading.Lock()


def prepare_clients(user_agent: str) -> None:
    """Make both clients of ``user_agent`` now (at startup), so that the first admission does
    not spend its deadline on loading the configuration."""
    cluster(user_agent)
    with api_deadline(DEFAULT_REQUEST_TIMEOUT_SECONDS):
        cluster(user_agent)


def cluster(user_agent: str) -> Cluster:
    """The operator's API access under ``user_agent``: made on first use, then shared.

    Inside ``api_deadline`` a client that does not retry on its own, with the same User-Agent.
    """
    key = (user_agent, _deadline.get() is None)
    with _clusters_lock:
        if key not in _clusters:
            _clusters[key] = Cluster(api_client(user_agent, retries=key[1]))
        return _clusters[key]
