"""Service meshes (Istio, Linkerd): the pod annotations the operator sets, defined once (D4).

- Drain Job pods are kept out of sidecar meshes (``DRAIN_POD_ANNOTATIONS``): a proxy injected
  as an ordinary container never exits, so the Job would never complete.
- Pods with the agent get the agent's metrics port excluded from inbound interception
  (``with_inbound_port_excluded``): kubelet's probes of the agent and the operator's scrape
  come in plain HTTP from outside the mesh, which a proxy under STRICT mTLS refuses (Istio
  rewrites kubelet probes only for ``spec.containers``, not for an init-container sidecar).

Outbound traffic is left to the mesh: the agent's connections to Kafka go through the proxy
like the application's did (excluding the Kafka ports would send plain TCP to a broker the
mesh may require mTLS for). docs/operator.md, "Service meshes", says what this means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

ISTIO_INJECT_ANNOTATION: Final = "sidecar.istio.io/inject"
LINKERD_INJECT_ANNOTATION: Final = "linkerd.io/inject"
DRAIN_POD_ANNOTATIONS: Final[Mapping[str, str]] = {
    ISTIO_INJECT_ANNOTATION: "false",
    LINKERD_INJECT_ANNOTATION: "disabled",
}
"""On every drain Job's pod template: no mesh proxy in drain pods."""

ISTIO_EXCLUDE_INBOUND_PORTS_ANNOTATION: Final = "traffic.sidecar.istio.io/excludeInboundPorts"
LINKERD_SKIP_INBOUND_PORTS_ANNOTATION: Final = "config.linkerd.io/skip-inbound-ports"
INBOUND_EXCLUSION_ANNOTATIONS: Final = (
    ISTIO_EXCLUDE_INBOUND_PORTS_ANNOTATION,
    LINKERD_SKIP_INBOUND_PORTS_ANNOTATION,
)
"""Comma-separated port lists (Linkerd also takes ranges, ``4190-4191``) the mesh's traffic
redirection leaves alone; the webhook adds the agent's metrics port to each."""


def _covers(entry: str, port: int) -> bool:
    low, _, high = entry.partition("-")
    try:
        return int(low) <= port <= int(high or low)
    except ValueError:
        return False


def with_port(value: str | None, port: int) -> str:
    """A comma-separated port list with ``port`` in it: unchanged when an entry (a port or a
    range) already covers it, otherwise the port appended (blank entries dropped)."""
    entries = [entry.strip() for entry in (value or "").split(",") if entry.strip()]
    if any(_covers(entry, port) for entry in entries):
        return str(value)
    return ",".join([*entries, str(port)])


def with_inbound_port_excluded(annotations: Mapping[str, str], port: int) -> dict[str, str]:
    """The annotations with ``port`` merged into every inbound exclusion annotation."""
    result = dict(annotations)
    for key in INBOUND_EXCLUSION_ANNOTATIONS:
        result[key] = with_port(result.get(key), port)
    return result
