"""The Kubernetes API access of each operator feature: one place per feature.

Each entry is (apiGroup, resource, verbs). The Helm chart's RBAC rules are written from these
tuples (charts/durable-producer/templates/_rbac.tpl; tests compare the rendered rules with
them), and the integration tests record every request the running operator makes and check
it against the tuple of the feature that made it, told apart by User-Agent.
"""

from __future__ import annotations

from durable_producer.contract import GROUP, PLURAL

ApiAccess = tuple[tuple[str, str, tuple[str, ...]], ...]

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

# The webhook's volume claims, the volume pool, drain Jobs and the pod audit (pool_actions.py,
# claims.py, admission.py); the chart grants them with rbac.features.podAudit, volumePool and
# drainJobs.
POOL_USER_AGENT = "durable-producer-operator"
POOL_API_ACCESS: ApiAccess = (
    (GROUP, PLURAL, ("get",)),
    ("", "pods", ("list",)),
    ("", "persistentvolumeclaims", ("list", "create", "patch", "delete")),
    ("batch", "jobs", ("list", "create", "delete")),
)

# The Spark pod templates ConfigMap (spark_actions.py); the chart grants it with
# rbac.features.sparkPodTemplates.
SPARK_TEMPLATES_USER_AGENT = f"{POOL_USER_AGENT}/spark-templates"
SPARK_TEMPLATES_API_ACCESS: ApiAccess = (
    ("", "configmaps", ("get", "create", "patch", "delete")),
)

# Reading StorageClasses (cluster-scoped) to learn whether a pool volume that became too small
# for the spec can be grown (allowVolumeExpansion; pool_actions.py). Without this access such
# volumes are drained and retired instead of grown.
STORAGE_CLASSES_USER_AGENT = f"{POOL_USER_AGENT}/storage-classes"
STORAGE_CLASSES_API_ACCESS: ApiAccess = (("storage.k8s.io", "storageclasses", ("get",)),)
