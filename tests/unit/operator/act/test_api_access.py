"""The operator's declared Kubernetes API access (what the chart's RBAC grants) and finalizer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from durable_producer.operator import startup
from durable_producer.operator.act import api_access
from durable_producer.operator.model import model


def test_api_access_list_is_well_formed_and_least_privilege() -> None:
    known_verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    seen: set[tuple[str, str]] = set()
    for group, resource, verbs in api_access.KUBERNETES_API_ACCESS:
        assert (group, resource) not in seen, f"{group}/{resource} listed twice"
        seen.add((group, resource))
        assert verbs and set(verbs) <= known_verbs and "*" not in verbs
        assert len(set(verbs)) == len(verbs)
    assert (model.GROUP, model.PLURAL) in seen
    assert (model.GROUP, f"{model.PLURAL}/status") in seen
    # The operator never deletes or rewrites whole DurableProducers.
    dp_verbs = dict(((g, r), v) for g, r, v in api_access.KUBERNETES_API_ACCESS)
    assert not {"delete", "update", "create"} & set(dp_verbs[(model.GROUP, model.PLURAL)])


def test_finalizer_is_ours() -> None:
    assert startup.FINALIZER == "durable.dev/finalizer"


def test_operator_guide_lists_exactly_the_declared_api_access() -> None:
    guide = (Path(__file__).resolve().parents[4] / "docs" / "operator.md").read_text()
    section = guide[guide.index("## Kubernetes API access") :]
    rows = re.findall(r"^\| `([^`]*)`[^|]*\| `([^`]+)` \| ([a-z, ]+) \|$", section, re.MULTILINE)
    documented = {(group.strip('"'), resource, tuple(v.strip() for v in verbs.split(",")))
                  for group, resource, verbs in rows}  # fmt: skip
    assert documented == set(api_access.KUBERNETES_API_ACCESS)


def blocking_owner(manifest: dict[str, Any]) -> bool:
    references = (manifest.get("metadata") or {}).get("ownerReferences") or []
    return any(reference.get("blockOwnerDeletion") for reference in references)


def test_features_creating_blocking_owner_references_may_update_the_owners_finalizers() -> None:
    """With OwnerReferencesPermissionEnforcement (OpenShift), creating an object whose owner
    reference sets blockOwnerDeletion takes `update` on the owner's finalizers subresource."""
    from datetime import UTC, datetime

    from durable_producer.operator.decide import manifests, spark_templates
    from durable_producer.operator.model.installation import AgentImage, PoolPolicy
    from durable_producer.operator.model.model import DurableProducerSpec

    producer = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    spec = DurableProducerSpec.model_validate({
        "kafka": {"bootstrapServers": ["k:9092"]}, "throughput": {"peakBytesPerSecond": 1000}})
    created = {
        "volumePool": manifests.new_volume_manifest(producer, spec, "v", "t", datetime.now(UTC)),
        "drainJobs": manifests.drain_job_manifest(producer, spec, "v", PoolPolicy(),
                                                  AgentImage()),
        "sparkPodTemplates": spark_templates.templates_configmap(producer, spec),
    }
    finalizers = (model.GROUP, f"{model.PLURAL}/finalizers", ("update",))

    # Pool volumes carry no owner reference and drain Jobs a non-blocking one (D2): a
    # foreground deletion must not delete or wait for them before their drain.
    assert not blocking_owner(created.pop("volumePool"))
    assert not blocking_owner(created.pop("drainJobs"))
    for feature, manifest in created.items():
        assert manifest is not None and blocking_owner(manifest), feature
        assert finalizers in api_access.FEATURE_API_ACCESS[feature], feature
    assert finalizers in api_access.POOL_API_ACCESS
    assert finalizers in api_access.SPARK_TEMPLATES_API_ACCESS
    # Exactly that: never update on the DurableProducer itself.
    for access in api_access.FEATURE_API_ACCESS.values():
        for _, resource, verbs in access:
            assert not (resource == model.PLURAL and "update" in verbs)


def test_the_pool_access_is_the_union_of_its_three_flags() -> None:
    def grants(access: api_access.ApiAccess) -> set[tuple[str, str, str]]:
        return {(g, r, v) for g, r, verbs in access for v in verbs}

    assert grants(api_access.POOL_API_ACCESS) == (
        grants(api_access.POD_AUDIT_API_ACCESS) | grants(api_access.VOLUME_POOL_API_ACCESS)
        | grants(api_access.DRAIN_JOBS_API_ACCESS))


_CLIENT_GROUPS = {"core": "", "batch": "batch", "storage": "storage.k8s.io"}
_CLIENT_VERBS = {"read": "get", "get": "get", "list": "list", "create": "create",
                 "patch": "patch", "delete": "delete", "replace": "update"}


def _client_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes client call in act/cluster.py, read off the
    client's method names (``read_namespaced_persistent_volume_claim``: get PVCs)."""
    import ast

    from durable_producer.operator.act import cluster

    calls: set[tuple[str, str, str]] = set()
    for node in ast.walk(ast.parse(Path(cluster.__file__).read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        client = (owner.attr if isinstance(owner, ast.Attribute) else
                  owner.id if isinstance(owner, ast.Name) else "")  # fmt: skip
        if client not in (*_CLIENT_GROUPS, "custom"):
            continue
        verb, _, rest = node.func.attr.partition("_")
        rest = rest.removeprefix("namespaced_")
        if client == "custom":
            assert rest in ("custom_object", "custom_object_status"), node.func.attr
            resource = model.PLURAL + ("/status" if rest.endswith("_status") else "")
            calls.add((model.GROUP, resource, _CLIENT_VERBS[verb]))
            continue
        name = rest.replace("_", "")
        calls.add((_CLIENT_GROUPS[client], name + ("es" if name.endswith("s") else "s"),
                   _CLIENT_VERBS[verb]))
    return calls



def test_every_api_call_the_operator_makes_is_granted() -> None:
    """A call the chart's RBAC does not grant fails only when it is made: the PVC read after a
    refused release (409) was a 403 that stalled the pool timer for kopf's 60 s backoff."""
    granted = {
        (group, resource, verb)
        for access in (
            api_access.KUBERNETES_API_ACCESS,
            api_access.STATUS_API_ACCESS,
            *api_access.FEATURE_API_ACCESS.values(),
            *api_access.CLUSTER_FEATURE_API_ACCESS.values(),
        )
        for group, resource, verbs in access
        for verb in verbs
    }
    calls = _client_calls()
    assert ("", "persistentvolumeclaims", "create") in calls  # the reading works
    assert calls - granted == set()
