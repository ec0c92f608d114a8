"""The DurableProducer resource: the single source of truth for its spec and status.

The CRD's openAPIV3Schema is generated from these models (see ``crd.py``), so a field,
bound, enum or default is changed here and only here. YAML uses camelCase names.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

# The resource these models describe is named in the contract; re-exported (``X as X``) for
# the CRD generator and tests.
from durable_producer.contract import API_VERSION as API_VERSION
from durable_producer.contract import (
    DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
    DEFAULT_EXECUTOR_CONTAINER,
    DEFAULT_FSYNC_POLICY,
    DEFAULT_FULL_DISK_POLICY,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    KAFKA_PORT,
    METRICS_PORT,
)
from durable_producer.contract import GROUP as GROUP
from durable_producer.contract import KIND as KIND
from durable_producer.contract import PLURAL as PLURAL
from durable_producer.contract import SHORT_NAMES as SHORT_NAMES
from durable_producer.contract import SINGULAR as SINGULAR
from durable_producer.contract import VERSION as VERSION
from durable_producer.operator.model.conditions import MAX_CONDITION_MESSAGE
from durable_producer.operator.model.quantities import QUANTITY_PATTERN, parse_quantity

# A TCP port, 1 to 65535, without leading zeros.
PORT_NUMBER_PATTERN = (
    r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
)
# host:port, where host is a DNS name, an IPv4 address or a bracketed IPv6 address.
BOOTSTRAP_SERVER_PATTERN = (
    r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):" + PORT_NUMBER_PATTERN + "$"
)
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# A container image reference: [registry[:port]/]path[:tag][@digest], no spaces.
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"

# How error messages describe each pattern to a human.
PATTERN_DESCRIPTIONS: dict[str, str] = {
    QUANTITY_PATTERN: "a Kubernetes quantity such as 20Gi or 500Mi",
    DNS_SUBDOMAIN_PATTERN: "a lowercase DNS name such as kafka-credentials",
    DNS_LABEL_PATTERN: "a container name (lowercase letters, digits, '-') such as spark-executor",
    BOOTSTRAP_SERVER_PATTERN: "host:port (port 1 to 65535) such as kafka-0.kafka.svc:9092",
    IMAGE_PATTERN: "an image reference such as registry.example/durable-agent:0.1.0 (no spaces)",
    SECRET_KEY_PATTERN: "a Secret key (letters, digits, '-', '_', '.')",
}

Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]
KubernetesName = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, min_length=1, max_length=253)]
ContainerName = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, min_length=1, max_length=63)]
SecretKey = Annotated[str, Field(pattern=SECRET_KEY_PATTERN, min_length=1, max_length=253)]
Port = Annotated[int, Field(ge=1024, le=65535)]


class CamelModel(BaseModel):
    """Base for every spec/status model: camelCase in YAML, unknown fields rejected.

    Strict types (no "5" -> 5 coercion), so the model accepts exactly what the CRD schema does.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )


class SecretKeyReference(CamelModel):
    """One key of a Secret in the DurableProducer's namespace."""

    name: KubernetesName = Field(description="Name of the Secret.")
    key: SecretKey = Field(description="Key inside the Secret.")


class TlsSettings(CamelModel):
    """TLS towards Kafka. Certificates come only from Secrets, never inline."""

    ca_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="PEM CA bundle that signs the brokers' certificates (system CAs if absent).",
    )
    client_certificate_secret_name: KubernetesName | None = Field(
        default=None,
        description="A kubernetes.io/tls Secret (tls.crt, tls.key) for mutual TLS.",
    )


class SaslSettings(CamelModel):
    """SASL authentication towards Kafka. Credentials come only from a Secret."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        description="SASL mechanism.",
    )
    secret_name: KubernetesName = Field(description="Secret holding the credentials.")
    username_key: SecretKey = Field(default="username", description="Key of the user name.")
    password_key: SecretKey = Field(default="password", description="Key of the password.")


class KafkaSettings(CamelModel):
    """Where the buffer agents forward to."""

    bootstrap_servers: list[
        Annotated[str, Field(pattern=BOOTSTRAP_SERVER_PATTERN, max_length=261)]
    ] = Field(min_length=1, max_length=32, description="host:port of one or more brokers.")
    tls: TlsSettings | None = Field(default=None, description="Enable TLS (Secret references).")
    sasl: SaslSettings | None = Field(default=None, description="Enable SASL (Secret reference).")


class ThroughputSettings(CamelModel):
    """The write rate the buffer must absorb while Kafka is unreachable."""

    peak_bytes_per_second: int = Field(
        ge=1,
        le=10 * 2**30,
        description="Expected peak produce rate of one pod, in bytes per second.",
    )


class FsyncSettings(CamelModel):
    """When the agent forces WAL writes to disk before acknowledging."""

    policy: Literal["always", "interval", "never"] = Field(
        default=DEFAULT_FSYNC_POLICY,
        description="always: ack after fsync; interval: fsync every intervalMs; never: page cache.",
    )
    interval_ms: int = Field(default=100, ge=1, le=60_000, description="For policy interval.")


class FullDiskSettings(CamelModel):
    """What the agent does when the buffer volume is full."""

    policy: Literal["reject", "block"] = Field(
        default=DEFAULT_FULL_DISK_POLICY,
        description="reject: retriable error at once; block: wait up to blockTimeoutMs first.",
    )
    block_timeout_ms: int = Field(
        default=5_000,
        ge=0,
        le=60_000,
        description=(
            "For policy block; a request never waits past its own timeout (the client's"
            " request.timeout.ms) less 1 s."
        ),
    )


class StorageSettings(CamelModel):
    """The buffer volumes the operator creates for this producer's pods."""

    storage_class_name: KubernetesName | None = Field(
        default=None,
        description="StorageClass of the buffer volumes (the cluster default if absent).",
    )
    size: Quantity | None = Field(
        default=None,
        description="Explicit volume size; overrides the computed one (warned if runway is"
        " short). It must hold two WAL segments beside the agent's reserve.",
    )
    headroom_percent: int = Field(
        default=25,
        ge=0,
        le=400,
        description="Extra space on top of the outage window, for WAL framing and bursts.",
    )


class ResourceAmounts(CamelModel):
    """CPU and memory quantities of a container."""

    cpu: Quantity | None = Field(default=None, description="CPU, e.g. 100m.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. 256Mi.")


def _limit_rule(resource: str) -> JsonDict:
    """The CEL twin of ResourceRequirements' check for one resource (Kubernetes 1.29+)."""
    limit, request = f"self.limits.{resource}", f"self.requests.{resource}"
    return {
        "rule": f"!has(self.limits) || !has(self.requests) || !has({limit})"
        f" || !has({request}) || quantity({limit}).compareTo(quantity({request})) >= 0",
        "message": limit_below_request_message(resource),
        "messageExpression": f"'limits.{resource} ' + {limit} + ' is less than requests."
        f"{resource} ' + {request} + ': raise the limit or lower the request'",
        "fieldPath": f".limits.{resource}",
    }


def limit_below_request_message(resource: str) -> str:
    return f"limits.{resource} must be at least requests.{resource}"


class ResourceRequirements(CamelModel):
    """Requests and limits of the agent container (a limit below its request is refused)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_limit_rule("cpu"), _limit_rule("memory")]}
    )

    requests: ResourceAmounts = Field(
        default=ResourceAmounts(cpu="100m", memory="128Mi"), description="Requests."
    )
    limits: ResourceAmounts = Field(default=ResourceAmounts(memory="512Mi"), description="Limits.")

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> ResourceRequirements:
        for resource in ("cpu", "memory"):
            limit = getattr(self.limits, resource)
            request = getattr(self.requests, resource)
            if (
                limit is not None
                and request is not None
                and parse_quantity(limit) < parse_quantity(request)
            ):
                raise ValueError(
                    f"{limit_below_request_message(resource)} (limit {limit}, request"
                    f" {request}; the defaults are requests 100m/128Mi, limits 512Mi)"
                )
        return self


PORTS_DIFFER_MESSAGE = "kafka and metrics ports must differ"


class AgentPorts(CamelModel):
    """Ports the agent listens on (loopback for Kafka, pod IP for metrics)."""

    model_config = ConfigDict(
        # The same rule for the API server, which cannot run the validator below.
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.kafka != self.metrics", "message": PORTS_DIFFER_MESSAGE}
            ]
        }
    )

    kafka: Port = Field(default=KAFKA_PORT, description="Kafka protocol listener on 127.0.0.1.")
    metrics: Port = Field(
        default=METRICS_PORT, description="Prometheus metrics and health endpoints."
    )

    @model_validator(mode="after")
    def _ports_differ(self) -> AgentPorts:
        if self.kafka == self.metrics:
            raise ValueError(PORTS_DIFFER_MESSAGE)
        return self


# The image of injected agents when a DurableProducer names none: the operator's environment
# (settings.agent_image_from_environ into installation.AgentImage), else this default.
DEFAULT_AGENT_IMAGE = "durable-producer/agent:0.1.0"
AGENT_IMAGE_ENV = "DURABLE_PRODUCER_AGENT_IMAGE"
AGENT_IMAGE_PULL_POLICY_ENV = "DURABLE_PRODUCER_AGENT_IMAGE_PULL_POLICY"
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
PULL_POLICIES: tuple[PullPolicy, ...] = ("Always", "IfNotPresent", "Never")


class AgentSidecarSettings(CamelModel):
    """The buffer agent sidecar."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description=f"Agent image; defaults to the operator's {AGENT_IMAGE_ENV} (Helm values).",
    )
    image_pull_policy: PullPolicy | None = Field(
        default=None,
        description=f"Agent image pull policy; defaults to {AGENT_IMAGE_PULL_POLICY_ENV}.",
    )
    resources: ResourceRequirements = Field(
        default=ResourceRequirements(), description="Agent container resources."
    )
    ports: AgentPorts = Field(default=AgentPorts(), description="Agent ports.")
    segment_size_mib: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="Maximum size of one WAL segment, in MiB; below 2 the largest batch a"
        " client may send is one segment (1,048,576 bytes, not Kafka's 1,048,588).",
    )


class SparkSettings(CamelModel):
    """Spark-on-Kubernetes pod templates rendered for this producer."""

    executor_template: bool = Field(default=True, description="Render an executor pod template.")
    driver_template: bool = Field(default=False, description="Render a driver pod template.")
    container_name: ContainerName = Field(
        default=DEFAULT_EXECUTOR_CONTAINER,
        description="Spark container that gets the bootstrap environment variables.",
    )


class DurableProducerSpec(CamelModel):
    """Desired state of a DurableProducer."""

    kafka: KafkaSettings = Field(description="Kafka connection.")
    throughput: ThroughputSettings = Field(description="Expected peak throughput.")
    outage_seconds: int = Field(
        default=3600,
        ge=1,
        le=30 * 24 * 3600,
        description="How long a Kafka outage the buffer must ride out at peak rate.",
    )
    checkpoint_interval_ms: int = Field(
        default=round(DEFAULT_CHECKPOINT_INTERVAL_SECONDS * 1000),
        ge=100,
        le=600_000,
        description="How often the agent records what Kafka has acknowledged.",
    )
    fsync: FsyncSettings = Field(default=FsyncSettings(), description="WAL fsync policy.")
    full_disk: FullDiskSettings = Field(
        default=FullDiskSettings(), description="Behaviour on a full buffer volume."
    )
    storage: StorageSettings = Field(default=StorageSettings(), description="Buffer volumes.")
    agent: AgentSidecarSettings = Field(
        default=AgentSidecarSettings(), description="Buffer agent sidecar."
    )
    spark: SparkSettings = Field(default=SparkSettings(), description="Spark pod templates.")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(CamelModel):
    """A Kubernetes-style condition."""

    type: str = Field(min_length=1, max_length=316, description="Condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="CamelCase machine-readable reason.",
    )
    message: str = Field(
        default="", max_length=MAX_CONDITION_MESSAGE, description="Human-readable detail."
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed from."
    )


class VolumeCounts(CamelModel):
    """Buffer volumes of the pool by state (see docs/volume-lifecycle.md)."""

    in_use: int = Field(default=0, ge=0, description="Mounted by a running pod.")
    claimed: int = Field(default=0, ge=0, description="Handed to a pod that is not running yet.")
    free: int = Field(default=0, ge=0, description="No pod; empty, or waiting for a drain.")
    draining: int = Field(default=0, ge=0, description="A drain Job is forwarding its backlog.")


class VolumeGroup(CamelModel):
    """Pool volumes of one size and storage class, counted by state."""

    size: Quantity = Field(
        description="Size of these volumes: their status.capacity (the request while unbound);"
        " an expansion counts once done."
    )
    storage_class_name: str | None = Field(
        default=None, max_length=253, description="Their StorageClass (absent: cluster default)."
    )
    fits_spec: bool = Field(
        description="Whether they fit the spec's size and class; only those go to new pods,"
        " smaller ones are expanded (if the class allows it) or drained and deleted."
    )
    in_use: int = Field(default=0, ge=0, description="Mounted by a running pod.")
    claimed: int = Field(default=0, ge=0, description="Handed to a pod that is not running yet.")
    free: int = Field(default=0, ge=0, description="No pod; empty, or waiting for a drain.")
    draining: int = Field(default=0, ge=0, description="A drain Job is forwarding its backlog.")


class DurableProducerStatus(CamelModel):
    """Observed state of a DurableProducer, written by the operator."""

    conditions: list[Condition] = Field(
        default_factory=list,
        description="Current conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation last reconciled."
    )
    buffer_size: Quantity | None = Field(
        default=None, description="Size of new buffer volumes (computed or spec.storage.size)."
    )
    runway_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Outage at peak rate that the smallest buffer volume in use survives"
        " (bufferSize's while none is in use).",
    )
    attached_pods: int | None = Field(default=None, ge=0, description="Pods running an agent.")
    backlog_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes not yet acknowledged by Kafka, summed over the agents that answered;"
        " absent when none answered (free volumes may still hold backlog).",
    )
    volumes: VolumeCounts | None = Field(
        default=None, description="Buffer volumes of the pool by state."
    )
    deployed_volumes: list[VolumeGroup] | None = Field(
        default=None,
        description="Buffer volumes by size and storage class, and by state: what is deployed.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    outdated_agents: int | None = Field(
        default=None,
        ge=0,
        description="Pods whose agent differs from what the webhook would inject now (a new"
        " agent image or spec): recreate them, e.g. kubectl rollout restart.",
    )
    spark_templates_config_map: KubernetesName | None = Field(
        default=None,
        description="ConfigMap holding the rendered Spark pod templates (spec.spark).",
    )
