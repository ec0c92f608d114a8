"""Writing a DurableProducer's conditions: each writer its own types, by server-side apply.

Three writers set conditions: the reconcile handler (and the resync timer, which reconciles),
the pool timer and the delete handler. Each owns its condition types (model/conditions.py)
and applies all of them, and only them, under its own field manager. The CRD declares
``status.conditions`` a map keyed by ``type``, so the API server merges each apply into the
list by type: a writer working from an older view can neither remove nor revert another's
conditions (review D7; a merge patch replaces the whole list). Other status fields are
merge-patched as before (kopf's patch for reconcile's, the pool timer's guarded patch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from durable_producer.operator.act.cluster import Cluster
from durable_producer.operator.model.conditions import owned, owned_differ

RECONCILE_FIELD_MANAGER = "durable-producer-reconcile"
POOL_FIELD_MANAGER = "durable-producer-pool"
DELETION_FIELD_MANAGER = "durable-producer-deletion"


def apply_conditions(
    api: Cluster,
    producer: Mapping[str, Any],
    desired: Sequence[Mapping[str, Any]],
    types: Iterable[str],
    field_manager: str,
    *,
    guarded: bool = False,
) -> str | None:
    """Apply the conditions of ``types`` in ``desired`` when they differ from the producer's.

    ``guarded``: only onto the resourceVersion read. The resourceVersion after the write (the
    one read when nothing changed); None when a guarded write was refused or the object is
    gone."""
    metadata = producer.get("metadata") or {}
    version = metadata.get("resourceVersion")
    types = frozenset(types)
    current = (producer.get("status") or {}).get("conditions") or []
    if not owned_differ(current, desired, types):
        return str(version) if version else None
    return api.apply_producer_conditions(
        str(metadata.get("namespace")),
        str(metadata.get("name")),
        owned(desired, types),
        field_manager,
        str(version) if guarded and version else None,
    )
