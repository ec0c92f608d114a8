"""Pure: the hash of what the webhook injected into a pod, to tell outdated agents apart.

The webhook writes ``sidecar_hash`` of the agent container it added (image, pull policy,
command, args, resources, probes, security context, mounts) into the pod's
``durable.dev/agent-hash`` annotation. The pool timer computes the hash the webhook would
inject into the same pod now (agent_versions.py); a pod whose annotation differs runs an
agent from an older operator setting (a new agent image after ``helm upgrade``) or an older
DurableProducer spec, and is counted in ``status.outdatedAgents`` until it is recreated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

HASH_LENGTH = 16  # hex digits: 64 bits, plenty to tell configurations apart


def sidecar_hash(container: Mapping[str, Any]) -> str:
    """A short, stable hash of a container as JSON (keys sorted, no whitespace)."""
    canonical = json.dumps(container, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]
