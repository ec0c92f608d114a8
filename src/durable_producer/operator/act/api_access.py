"""The Kubernetes API access of each operator feature: one place per feature.

Each entry is (apiGroup, resource, verbs). The Helm chart's RBAC rules are written from these
tuples (charts/durable-producer/templates/_rbac.tpl; tests compare the rendered rules with
them), and the integration tests record every request the running operator makes and check
it against the tuple of the feature that made it, told apart by User-Agent.
"""

from __future__ import annotations

from durable_producer.contract import GROUP, PLURAL
from durable_producer.operator.settings import (
    DRAIN_JOBS,
    POD_AUDIT,
    SPARK_POD_TEMPLATES,
    VOLUME_POOL,
)

ApiAccess = tuple[tuple[str, str, tuple[str, ...]], ...]


def merged(*accesses: ApiAccess) -> ApiAccess:
    """One entry per (group, resource), with the verbs of every entry for it, in order."""
    verbs: dict[tuple[str, str], list[str]] = {}
    for access in accesses:
        for group, resource, entry_verbs in access:
            known = verbs.setdefault((group, resource), [])
            known.extend(verb for verb in entry_verbs if verb not in known)
    return tuple((group, resource, tuple(v)) for (group, resource), v in verbs.items())


# kopf itself (its own client and User-Agent): the always-on base rules of the chart.
KUBERNETES_API_ACCESS: ApiAccess = (
    # Watching DurableProducers, and kopf's finalizer and progress annotations on them.
    (GROUP, PLURAL, ("list", "watch", "patch")),
    # Writing conditions, sizes and figures.
    (GROUP, f"{PLURAL}/status", ("patch",)),
    # kopf: Warning events for invalid specs and handler failures.
    ("", "events", ("create",)),
    # kopf: noticing when the CRD is installed or removed while the operator runs.
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
)

# kopf's peering (the chart runs `kopf run --peering=NAME`): every replica lists and watches
# the peering object and patches its keep-alive into it. A cluster-wide operator uses a
# ClusterKopfPeering, one watching namespaces a KopfPeering in each (the chart grants one).
PEERING_GROUP = "kopf.dev"
CLUSTER_PEERING_API_ACCESS: ApiAccess = (
    (PEERING_GROUP, "clusterkopfpeerings", ("list", "watch", "patch")),
)
NAMESPACED_PEERING_API_ACCESS: ApiAccess = (
    (PEERING_GROUP, "kopfpeerings", ("list", "watch", "patch")),
)

# kopf run --namespace=...: kopf lists and watches Namespaces to learn which of the given ones
# exist. Refused (403), it retries with backoff for about a minute before it falls back to the
# names as given, and handles nothing meanwhile, at every start and fail-over (NEW-2). Names
# only, cluster-wide (a Role cannot grant it); the chart grants it with watchNamespaces.
NAMESPACE_SCAN_API_ACCESS: ApiAccess = (("", "namespaces", ("list", "watch")),)

# Creating an object whose owner reference to its DurableProducer sets blockOwnerDeletion (PVCs,
# drain Jobs, the Spark templates ConfigMap: manifests.owner_reference) needs `update` on the
# owner's finalizers subresource where the OwnerReferencesPermissionEnforcement admission
# plugin runs (OpenShift, hardened clusters): only that, not update on the DurableProducer.
OWNER_FINALIZERS_ACCESS = (GROUP, f"{PLURAL}/finalizers", ("update",))

# The chart's rbac.features.* flags, each with the access it grants (settings.ALL_FEATURES).
# podAudit, volumePool and drainJobs together are the volume pool: the webhook's volume claims,
# the pool timer, drain Jobs and the pod audit (pool_actions.py, claims.py, admission.py).
POD_AUDIT_API_ACCESS: ApiAccess = (("", "pods", ("list",)),)
VOLUME_POOL_API_ACCESS: ApiAccess = (
    # The webhook reads the DurableProducer a pod names.
    (GROUP, PLURAL, ("get",)),
    # The pool timer publishes its figures onto the version it read (a conditional patch).
    (GROUP, f"{PLURAL}/status", ("patch",)),
    # get: a volume read again when releasing its finalizer was refused (409, pool_actions).
    ("", "persistentvolumeclaims", ("list", "get", "create", "patch", "delete")),
    # kopf watches opted-in pods for their last status: an agent that stopped with its
    # volume empty (clean_shutdowns.py).
    ("", "pods", ("list", "watch")),
    OWNER_FINALIZERS_ACCESS,
)
DRAIN_JOBS_API_ACCESS: ApiAccess = (
    ("batch", "jobs", ("list", "create", "delete")),
    OWNER_FINALIZERS_ACCESS,
)

# Everything the pool's own API calls may use (they carry this User-Agent).
POOL_USER_AGENT = "durable-producer-operator"
POOL_API_ACCESS: ApiAccess = merged(
    POD_AUDIT_API_ACCESS, VOLUME_POOL_API_ACCESS, DRAIN_JOBS_API_ACCESS
)

# The Spark pod templates ConfigMap (spark_actions.py); the chart grants it with
# rbac.features.sparkPodTemplates.
SPARK_TEMPLATES_USER_AGENT = f"{POOL_USER_AGENT}/spark-templates"
SPARK_TEMPLATES_API_ACCESS: ApiAccess = (
    ("", "configmaps", ("get", "create", "patch", "delete")),
    OWNER_FINALIZERS_ACCESS,
)

# The reconcile handler's conditions (server-side apply; act/status_writes.py): kopf's own
# client has no apply, so the operator writes them itself, with the base rules' status access.
STATUS_USER_AGENT = f"{POOL_USER_AGENT}/status"
STATUS_API_ACCESS: ApiAccess = ((GROUP, f"{PLURAL}/status", ("patch",)),)

# Reading StorageClasses (cluster-scoped) to learn whether a pool volume that became too small
# for the spec can be grown (allowVolumeExpansion; pool_actions.py), and whether the class the
# spec names exists (reconcile, with the pool on: Ready=False StorageClassNotFound). Without
# this access such volumes are drained and retired instead of grown, and the class is not
# checked.
STORAGE_CLASSES_USER_AGENT = f"{POOL_USER_AGENT}/storage-classes"
STORAGE_CLASSES_API_ACCESS: ApiAccess = (("storage.k8s.io", "storageclasses", ("get",)),)

# Reading the PersistentVolume (cluster-scoped) a free pool volume is bound to, in the webhook:
# a volume whose PV's nodeAffinity excludes every node the pod may run on is not handed to it,
# nor one whose node-local PV names only nodes that are gone (get nodes, by name)
# (persistent_volumes.py, review D3). Without this access (or when a read fails) volumes are
# handed out as before, blind to topology.
VOLUME_PLACEMENT_USER_AGENT = f"{POOL_USER_AGENT}/volume-placement"
VOLUME_PLACEMENT_API_ACCESS: ApiAccess = (
    ("", "persistentvolumes", ("get",)),
    ("", "nodes", ("get",)),
)

# Feature flag name (settings.py) -> the access the chart grants for it.
FEATURE_API_ACCESS: dict[str, ApiAccess] = {
    POD_AUDIT: POD_AUDIT_API_ACCESS,
    VOLUME_POOL: VOLUME_POOL_API_ACCESS,
    DRAIN_JOBS: DRAIN_JOBS_API_ACCESS,
    SPARK_POD_TEMPLATES: SPARK_TEMPLATES_API_ACCESS,
}

# Feature flag name -> the cluster-scoped access it also needs (the chart grants it in the
# ClusterRole, even when the operator watches only some namespaces: a Role cannot grant it).
CLUSTER_FEATURE_API_ACCESS: dict[str, ApiAccess] = {
    VOLUME_POOL: merged(STORAGE_CLASSES_API_ACCESS, VOLUME_PLACEMENT_API_ACCESS),
}
