"""Names shared by the operator, the buffer agent and the Spark helpers: defined once, here.

Everything a Kubernetes object, a pod template, an environment variable or a command line
spells the same way on both sides of the project lives in this module, so there is nothing
to keep equal: the operator renders what the agent and Spark read by importing the same
constant. Nothing here imports from the rest of the package (import-linter checks that).
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------- the API group
GROUP: Final = "durable.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DurableProducer"
PLURAL: Final = "durableproducers"
SINGULAR: Final = "durableproducer"
SHORT_NAMES: Final = ("dp",)

# --------------------------------------------------------------------- Kubernetes names
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A DNS-1123 subdomain, at most 253: most objects' names (Secrets, StorageClasses, apps)."""
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1123 label (no dots), at most 63: containers' and namespaces' names."""

# --------------------------------------------------------------------- labels and annotations
PRODUCER_LABEL: Final = f"{GROUP}/producer"
"""Pods opt in with ``durable.dev/producer: <DurableProducer name>``."""
POOL_LABEL: Final = f"{GROUP}/buffer-for"
"""On a buffer volume (PVC) and its drain Jobs: the DurableProducer whose pool it is in."""
INJECTED_ANNOTATION: Final = f"{GROUP}/injected"
"""Set by the webhook on every pod it attached an agent to."""
BUFFER_VOLUME_ANNOTATION: Final = f"{GROUP}/buffer-volume"
"""The PVC the webhook gave a pod."""
CLAIM_TOKEN_ANNOTATION: Final = f"{GROUP}/claim-token"
"""On a pool volume and on the pod the webhook handed it to: that handout's token."""
AGENT_HASH_ANNOTATION: Final = f"{GROUP}/agent-hash"
"""Set by the webhook: a hash of the agent sidecar it injected (image, args, resources, ...).
A pod whose hash differs from what the webhook would inject now runs an outdated agent."""
PAUSE_ANNOTATION: Final = f"operator.{GROUP}/pause-reconciliation"
"""On a DurableProducer, ``"true"``: the operator leaves it alone (no reconcile, no pool work,
no drain on deletion) until the annotation is removed; reported as a condition. Not under
``durable.dev/``: kopf keeps its own bookkeeping there and ignores changes to it."""

# Per-pod annotations, read by the webhook when the pod is created (validated: a pod with a
# bad value is refused, with the reason). Any other annotation with this prefix is refused too.
POD_OVERRIDE_PREFIX: Final = f"agent.{GROUP}/"
INJECT_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}inject"
"""``"false"``: a pod with the opt-in label gets no agent, no volume and no env (an explicit
opt-out); ``"true"`` (or absent): the default."""
CPU_REQUEST_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}cpu-request"
CPU_LIMIT_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}cpu-limit"
MEMORY_REQUEST_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}memory-request"
MEMORY_LIMIT_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}memory-limit"
"""The agent container's resources for this pod, instead of spec.agent.resources."""
FSYNC_POLICY_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}fsync-policy"
"""The agent's fsync policy for this pod (one of FSYNC_POLICIES), instead of spec.fsync.policy."""
LOG_LEVEL_ANNOTATION: Final = f"{POD_OVERRIDE_PREFIX}log-level"
"""The agent's log level for this pod (one of AGENT_LOG_LEVELS)."""

# --------------------------------------------------------------------- the agent in a pod
AGENT_CONTAINER_NAME: Final = "durable-agent"
BUFFER_VOLUME_NAME: Final = "durable-buffer"
DATA_DIR: Final = "/var/lib/durable-producer"
"""Where the buffer volume is mounted in the agent; the WAL is ``DATA_DIR/wal``."""
DRAIN_KEPT_DEAD_LETTERS_EXIT: Final = 4
"""``durable-agent drain``'s exit code when the WAL reached Kafka but dead letters are still on
the volume: it is not empty (the drain Job fails at once on it: manifests.py)."""
AGENT_HOST: Final = "127.0.0.1"
KAFKA_PORT: Final = 9092
"""The agent's Kafka-protocol listener (applications produce to ``127.0.0.1:9092``)."""
METRICS_PORT: Final = 9644
"""The agent's /metrics, /healthz and /readyz."""
METRICS_HOST: Final = "::"
"""Where the agent's metrics listener binds: every address, IPv6 and IPv4 (one dual-stack
socket; IPv4 only on a kernel without IPv6), so probes at the pod IP of either family reach it."""
AGENT_BOOTSTRAP: Final = f"{AGENT_HOST}:{KAFKA_PORT}"
BACKLOG_METRIC: Final = "durable_agent_backlog_bytes"
"""The agent's Prometheus gauge of bytes not yet acknowledged by Kafka (the operator scrapes it)."""
CANNOT_DRAIN_METRIC: Final = "durable_agent_backlog_cannot_drain"
"""1 while ingest exceeds the forward rate the agent sustains under load (the operator scrapes
it, and the two rates below, for the BacklogCannotDrain condition)."""
INGEST_RATE_METRICS: Final = (
    "durable_agent_ingest_rate_records_per_second",
    "durable_agent_ingest_rate_bytes_per_second",
)
FORWARD_RATE_METRICS: Final = (
    "durable_agent_forward_rate_records_per_second",
    "durable_agent_forward_rate_bytes_per_second",
)

BOOTSTRAP_ENV: Final = "KAFKA_BOOTSTRAP_SERVERS"
"""Set in application containers to the agent's address."""
BOOTSTRAP_TWIN_ENV: Final = "DURABLE_PRODUCER_BOOTSTRAP"
"""The same address under our own name (for apps that use KAFKA_BOOTSTRAP_SERVERS otherwise)."""
AGENT_ENV_PREFIX: Final = "DURABLE_AGENT_"
"""Every agent setting is also an environment variable ``DURABLE_AGENT_<SETTING>``."""

# --------------------------------------------------------------------- defaults both sides use
FSYNC_POLICIES: Final = ("always", "interval", "never")
DEFAULT_FSYNC_POLICY: Final = "interval"
FULL_DISK_POLICIES: Final = ("reject", "block")
DEFAULT_FULL_DISK_POLICY: Final = "reject"
DEFAULT_CHECKPOINT_INTERVAL_SECONDS: Final = 5.0
AGENT_LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The agent's ``--log-level`` values."""
DEFAULT_MAX_BATCH_BYTES: Final = 1_048_588
"""The agent's ``--max-batch-bytes`` default (Kafka's ``message.max.bytes``); the operator
budgets a volume's reserve with it (volume_budget.reserve_bytes)."""

# --------------------------------------------------------------------- Spark pod templates
SPARK_TEMPLATES_CONFIGMAP_SUFFIX: Final = "-spark-templates"
"""The operator renders a DurableProducer's templates into ConfigMap ``<name><suffix>``."""
EXECUTOR_TEMPLATE_KEY: Final = "executor-pod-template.yaml"
DRIVER_TEMPLATE_KEY: Final = "driver-pod-template.yaml"
DEFAULT_EXECUTOR_CONTAINER: Final = "spark-kubernetes-executor"
DEFAULT_DRIVER_CONTAINER: Final = "spark-kubernetes-driver"
