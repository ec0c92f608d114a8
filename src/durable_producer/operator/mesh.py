"""Service meshes (Istio, Linkerd): the pod annotations the operator sets, defined once (D4).

- Drain Job pods are kept out of sidecar meshes (``DRAIN_POD_ANNOTATIONS``): a proxy injected
  as an ordinary container never exits, so the Job would never complete.

docs/operator.md, "Service meshes", says what this means.
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
