"""Whether a bound volume's PV can be attached where a pod may run (review D3).

Defect: the webhook handed a free volume bound to a zone-a disk to a pod pinned to zone b; the
scheduler left it Pending for ever ("volume node affinity conflict"). The real-API-server test
is tests/integration/operator/test_volume_topology_process.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from durable_producer.operator.decide import volume_topology

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


def pv(*terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None
       ) -> dict[str, Any]:
    selector_terms: list[dict[str, Any]] = [{"matchExpressions": term} for term in terms]
    if fields:
        selector_terms.append({"matchFields": fields})
    return {"metadata": {"name": "pv-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": selector_terms}}}}


def pod(node_selector: dict[str, str] | None = None, *terms: list[dict[str, Any]],
        node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]}}}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": "p"}, "spec": spec}


ZONE_A = pv([expression(ZONE, "In", "a")])


@pytest.mark.parametrize(("volume", "placement", "fits"), [
    # The defect: a zone-a disk, a pod pinned to zone b by its nodeSelector.
    (ZONE_A, pod({ZONE: "b"}), False),
    (ZONE_A, pod({ZONE: "a"}), True),
    # Unconstrained pods and unconstrained PVs: the scheduler places them where they meet.
    (ZONE_A, pod(), True),
    ({"spec": {}}, pod({ZONE: "b"}), True),
    # Other keys say nothing about the zone.
    (ZONE_A, pod({"pool": "spot"}), True),
    # Required node affinity: each of its terms is a way out (ORed).
    (ZONE_A, pod(None, [expression(ZONE, "In", "b", "c")]), False),
    (ZONE_A, pod(None, [expression(ZONE, "In", "b")], [expression(ZONE, "In", "a")]), True),
    (ZONE_A, pod(None, [expression(ZONE, "NotIn", "a")]), False),
    (ZONE_A, pod(None, [expression(ZONE, "NotIn", "b")]), True),
    (ZONE_A, pod(None, [expression(ZONE, "DoesNotExist")]), False),
    (ZONE_A, pod(None, [expression(ZONE, "Exists")]), True),
    # nodeSelector ANDed with the affinity terms.
    (ZONE_A, pod({"pool": "spot"}, [expression(ZONE, "In", "b")]), False),
    # A PV of several zones (several terms, or one In list).
    (pv([expression(ZONE, "In", "a")], [expression(ZONE, "In", "b")]), pod({ZONE: "b"}), True),
    (pv([expression(ZONE, "In", "a", "b")]), pod({ZONE: "c"}), False),
    # A node-local PV and a pod pinned to another node, by label or by nodeName.
    (pv([expression(HOST, "In", "node-1")]), pod({HOST: "node-2"}), False),
    (pv([expression(HOST, "In", "node-1")]), pod({HOST: "node-1"}), True),
    (pv(fields=[expression("metadata.name", "In", "node-1")]), pod(node_name="node-2"), False),
    (pv(fields=[expression("metadata.name", "In", "node-1")]), pod(node_name="node-1"), True),
    # What is not judged is taken as fitting.
    (pv([expression("cores", "Gt", "8")]), pod(None, [expression("cores", "Lt", "4")]), True),
    (pv([]), pod({ZONE: "b"}), True),
])
def test_a_volume_fits_unless_no_node_can_meet_both(
    volume: dict[str, Any], placement: dict[str, Any], fits: bool
) -> None:
    assert volume_topology.may_fit(volume, placement) is fits


@pytest.mark.parametrize(("volume", "nodes"), [
    (pv([expression(HOST, "In", "node-1")]), {"node-1"}),
    (pv(fields=[expression("metadata.name", "In", "node-1", "node-2")]), {"node-1", "node-2"}),
    (pv([expression(HOST, "In", "node-1")], [expression(HOST, "In", "node-2")]),
     {"node-1", "node-2"}),
    (pv([expression(HOST, "In", "node-1"), expression(ZONE, "In", "a")]), {"node-1"}),
    # Not node-local: a zone, or one term that names no node.
    (ZONE_A, None),
    (pv([expression(HOST, "In", "node-1")], [expression(ZONE, "In", "a")]), None),
    (pv([expression(HOST, "NotIn", "node-1")]), None),
    ({"spec": {}}, None),
])
def test_a_node_local_pv_names_its_nodes(volume: dict[str, Any], nodes: set[str] | None) -> None:
    assert volume_topology.pinned_nodes(volume) == (None if nodes is None else frozenset(nodes))


def test_only_a_bound_volume_names_its_pv() -> None:
    assert volume_topology.bound_volume({"spec": {"volumeName": "pv-1"}}) == "pv-1"
    assert volume_topology.bound_volume({"spec": {}}) is None
