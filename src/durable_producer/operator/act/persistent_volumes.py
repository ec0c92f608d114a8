"""Which free pool volumes can be attached where a pod being admitted may run (review D3).

handout.free_volumes ranks the free volumes; the webhook takes the first one that is not yet
bound (its PV will be provisioned where the pod is scheduled) or whose PersistentVolume's
node affinity may meet the pod's own placement (volume_topology.may_fit). Reading a PV needs
``get persistentvolumes`` (api_access.VOLUME_PLACEMENT_API_ACCESS). The reads share at most
``PV_READ_SHARE`` of the admission deadline's time left, so the claim keeps the rest; a read
that fails (refused, timed out, out of time) never refuses the pod: that volume is taken as it
was before this check, blind to topology. A node-local PV whose nodes are all gone (``get
nodes`` by name answers 404 for each) cannot be mounted by any pod: that volume is skipped too,
and waits for its drain (whose pod cannot be scheduled either).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable_producer.operator.act.api_access import VOLUME_PLACEMENT_USER_AGENT
from durable_producer.operator.act.cluster import (
    API_FAILURES,
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    api_deadline,
    cluster,
    time_left,
)
from durable_producer.operator.decide import volume_topology
from durable_producer.operator.decide.kube_objects import JsonObject, Object

PV_READ_SHARE = 0.5
"""The part of the admission deadline's time left that PV reads may use, all together."""
READ_FAILURES = (*API_FAILURES, OSError)


class PlacementCheck:
    """One admission's view of the PVs of its candidate volumes (each read at most once)."""

    def __init__(self, pod: Mapping[str, Any] | None) -> None:
        self.pod = pod
        self.read: dict[str, JsonObject | None] = {}
        """PVs read, by name; None: gone or unreadable (the volume is taken as before)."""
        self.nodes_gone: dict[str, bool] = {}
        """Node names looked up: True when the API server says there is none (404)."""
        self.unplaceable: set[str] = set()
        """Volumes skipped because their PV cannot be attached where the pod may run."""

    def first(self, candidates: Iterable[Object]) -> Object | None:
        """The first candidate that may be attached where the pod may run, or None."""
        left = time_left()
        budget = PV_READ_SHARE * (DEFAULT_REQUEST_TIMEOUT_SECONDS if left is None else left)
        with api_deadline(budget):
            for pvc in candidates:
                if self._may_fit(pvc):
                    return pvc
        return None

    def _may_fit(self, pvc: Object) -> bool:
        pv_name = volume_topology.bound_volume(pvc)
        if self.pod is None or pv_name is None:
            return True
        if pv_name not in self.read:
            try:
                self.read[pv_name] = cluster(VOLUME_PLACEMENT_USER_AGENT).get_persistent_volume(
                    pv_name
                )
            except READ_FAILURES:
                self.read[pv_name] = None
        pv = self.read[pv_name]
        if pv is None or (volume_topology.may_fit(pv, self.pod) and not self._on_gone_nodes(pv)):
            return True
        self.unplaceable.add(str((pvc.get("metadata") or {}).get("name") or ""))
        return False

    def _on_gone_nodes(self, pv: JsonObject) -> bool:
        """Whether a node-local PV names only nodes that no longer exist."""
        nodes = volume_topology.pinned_nodes(pv)
        return bool(nodes) and all(self._gone(node) for node in sorted(nodes or ()))

    def _gone(self, node: str) -> bool:
        if node not in self.nodes_gone:
            try:
                found = cluster(VOLUME_PLACEMENT_USER_AGENT).get_node(node)
            except READ_FAILURES:
                found = {}  # unknown: taken as there, as before this check
            self.nodes_gone[node] = found is None
        return self.nodes_gone[node]
