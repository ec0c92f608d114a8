"""A small HTTPS client for the local API server (bearer token, the cluster's CA), and
kubeconfig files for it: what the control plane's readiness checks and the tests use."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_SECONDS = 15.0
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CLUSTER_NAME = "durable-local"


class KubeApiError(RuntimeError):
    """An API answer other than 2xx where one was required."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class KubeClient:
    """Requests to ``server`` (https://127.0.0.1:PORT) as the holder of ``token``."""

    server: str
    ca_file: Path
    token: str

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str | None = None,
                timeout: float = REQUEST_TIMEOUT_SECONDS) -> tuple[int, Any]:
        """(HTTP status, decoded JSON or text). A PATCH is a merge patch unless told."""
        status, answer, _ = self.exchange(method, path, body, content_type=content_type,
                                          timeout=timeout)
        return status, answer

    def exchange(self, method: str, path: str, body: Any = None, *,
                 content_type: str | None = None, timeout: float = REQUEST_TIMEOUT_SECONDS
                 ) -> tuple[int, Any, list[str]]:
        """``request``, and the answer's Warning headers (admission warnings among them)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type or (
                MERGE_PATCH if method == "PATCH" else "application/json")
        request = urllib.request.Request(self.server + path, data=data, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout,
                                        context=self._context()) as response:
                return (response.status, _decode(response.read()),
                        response.headers.get_all("Warning") or [])
        except urllib.error.HTTPError as error:
            return error.code, _decode(error.read()), error.headers.get_all("Warning") or []

    def call(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        """The decoded answer of a request that must succeed (else ``KubeApiError``)."""
        status, answer = self.request(method, path, body, **options)
        if not 200 <= status < 300:
            raise KubeApiError(method, path, status, answer)
        return answer

    def exists(self, path: str) -> bool:
        status, answer = self.request("GET", path)
        if status == 404:
            return False
        if status != 200:
            raise KubeApiError("GET", path, status, answer)
        return True

    def with_token(self, token: str) -> KubeClient:
        return KubeClient(self.server, self.ca_file, token)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def write_kubeconfig(path: Path, client: KubeClient, *, user: str,
                     namespace: str | None = None) -> Path:
    """A kubeconfig for ``client``'s server, CA and token (kubectl, helm, kopf read it)."""
    context: dict[str, str] = {"cluster": CLUSTER_NAME, "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {
            "server": client.server,
            "certificate-authority-data": base64.b64encode(client.ca_file.read_bytes()).decode(),
        }}],
        "users": [{"name": user, "user": {"token": client.token}}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path
