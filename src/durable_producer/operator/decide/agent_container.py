"""The agent container: the sidecar the webhook injects and the base of every drain Job's agent.

Pure: (DurableProducer spec, agent image) -> container dicts, args, volumes and resources. The
agent's command line is built here from the spec (Kafka connection, TLS/SASL files, fsync,
sizes); pod_mutation.py places the sidecar into a pod, manifests.py puts the same base
container into drain Jobs.
"""

from __future__ import annotations

from typing import Any

from durable_producer.contract import (
    AGENT_CONTAINER_NAME,
    AGENT_HOST,
    BUFFER_VOLUME_NAME,
    DATA_DIR,
    DEFAULT_MAX_BATCH_BYTES,
    METRICS_HOST,
)
from durable_producer.operator.decide import sizing
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.model.quantities import parse_quantity

AGENT_USER_ID = 10001
METRICS_PORT_NAME = "dp-metrics"

# The agent keeps forwarding this long after SIGTERM (its --drain-timeout).
AGENT_DRAIN_TIMEOUT_SECONDS = 25
# Kubernetes' default grace period, which the app containers are assumed to need for themselves.
DEFAULT_APP_GRACE_SECONDS = 30
GRACE_MARGIN_SECONDS = 5
# Native sidecars stop after the app containers, inside the same grace period.
MINIMUM_GRACE_SECONDS = (
    DEFAULT_APP_GRACE_SECONDS + AGENT_DRAIN_TIMEOUT_SECONDS + GRACE_MARGIN_SECONDS
)

TLS_CA_VOLUME = "durable-kafka-ca"
TLS_CLIENT_VOLUME = "durable-kafka-client-tls"
SASL_VOLUME = "durable-kafka-sasl"
TLS_CA_DIR = "/etc/durable-producer/kafka-ca"
TLS_CLIENT_DIR = "/etc/durable-producer/kafka-client-tls"
SASL_DIR = "/etc/durable-producer/kafka-sasl"


def security_protocol(spec: DurableProducerSpec) -> str:
    """Kafka's security.protocol for the spec's TLS/SASL settings."""
    tls = spec.kafka.tls is not None
    sasl = spec.kafka.sasl is not None
    if tls and sasl:
        return "SASL_SSL"
    if sasl:
        return "SASL_PLAINTEXT"
    return "SSL" if tls else "PLAINTEXT"


def _connection_args(spec: DurableProducerSpec) -> list[str]:
    """Flags shared by `durable-agent run` and `durable-agent drain`."""
    args = [
        f"--data-dir={DATA_DIR}",
        f"--kafka-bootstrap={','.join(spec.kafka.bootstrap_servers)}",
        f"--security-protocol={security_protocol(spec)}",
        f"--checkpoint-interval={spec.checkpoint_interval_ms / 1000:g}",
    ]
    tls = spec.kafka.tls
    if tls is not None and tls.ca_secret_ref is not None:
        args.append(f"--ssl-ca-file={TLS_CA_DIR}/ca.crt")
    if tls is not None and tls.client_certificate_secret_name is not None:
        args += [
            f"--ssl-cert-file={TLS_CLIENT_DIR}/tls.crt",
            f"--ssl-key-file={TLS_CLIENT_DIR}/tls.key",
        ]
    if spec.kafka.sasl is not None:
        args += [
            f"--sasl-mechanism={spec.kafka.sasl.mechanism}",
            f"--sasl-username-file={SASL_DIR}/username",
            f"--sasl-password-file={SASL_DIR}/password",
        ]
    return args


def agent_run_args(spec: DurableProducerSpec, log_level: str | None = None) -> list[str]:
    """Arguments of the sidecar: `durable-agent run ...` with the spec's settings (and the
    pod's log level, when its annotation sets one: overrides.py)."""
    ports = spec.agent.ports
    return [
        "run",
        *_connection_args(spec),
        f"--listen={AGENT_HOST}:{ports.kafka}",
        f"--metrics-listen=[{METRICS_HOST}]:{ports.metrics}",
        f"--fsync={spec.fsync.policy}",
        f"--fsync-interval-ms={spec.fsync.interval_ms}",
        f"--full-disk-policy={spec.full_disk.policy}",
        f"--block-timeout={max(spec.full_disk.block_timeout_ms, 1) / 1000:g}",
        f"--segment-bytes={spec.agent.segment_size_mib * 2**20}",
        *_max_batch_args(spec),
        f"--max-buffer-bytes={sizing.max_buffer_bytes(spec)}",
        f"--drain-timeout={AGENT_DRAIN_TIMEOUT_SECONDS}",
        *([f"--log-level={log_level}"] if log_level else []),
    ]


def _max_batch_args(spec: DurableProducerSpec) -> list[str]:
    """``--max-batch-bytes`` where it is not the agent's default (1 MiB segments)."""
    largest = sizing.max_batch_bytes(spec)
    return [] if largest == DEFAULT_MAX_BATCH_BYTES else [f"--max-batch-bytes={largest}"]


def agent_drain_args(spec: DurableProducerSpec, timeout_seconds: int) -> list[str]:
    """Arguments of a drain Job: forward everything on the volume, exit 0 when it is empty."""
    return [
        "drain",
        *_connection_args(spec),
        f"--fsync={spec.fsync.policy}",  # how recovery reads the tail (what was acknowledged)
        f"--timeout={timeout_seconds}",
    ]


def secret_volumes(spec: DurableProducerSpec) -> list[dict[str, Any]]:
    """Volumes for the Secrets the spec references (TLS CA, client certificate, SASL)."""
    volumes: list[dict[str, Any]] = []
    tls = spec.kafka.tls
    if tls is not None and tls.ca_secret_ref is not None:
        volumes.append(
            {
                "name": TLS_CA_VOLUME,
                "secret": {
                    "secretName": tls.ca_secret_ref.name,
                    "items": [{"key": tls.ca_secret_ref.key, "path": "ca.crt"}],
                },
            }
        )
    if tls is not None and tls.client_certificate_secret_name is not None:
        volumes.append(
            {
                "name": TLS_CLIENT_VOLUME,
                "secret": {"secretName": tls.client_certificate_secret_name},
            }
        )
    sasl = spec.kafka.sasl
    if sasl is not None:
        volumes.append(
            {
                "name": SASL_VOLUME,
                "secret": {
                    "secretName": sasl.secret_name,
                    "items": [
                        {"key": sasl.username_key, "path": "username"},
                        {"key": sasl.password_key, "path": "password"},
                    ],
                },
            }
        )
    return volumes


def _secret_mounts(spec: DurableProducerSpec) -> list[dict[str, Any]]:
    paths = {TLS_CA_VOLUME: TLS_CA_DIR, TLS_CLIENT_VOLUME: TLS_CLIENT_DIR, SASL_VOLUME: SASL_DIR}
    return [
        {"name": volume["name"], "mountPath": paths[volume["name"]], "readOnly": True}
        for volume in secret_volumes(spec)
    ]


def agent_security_context() -> dict[str, Any]:
    """Pod Security "restricted" on the container itself, whatever the pod sets: non-root,
    no privilege escalation, no capabilities, the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": AGENT_USER_ID,
        "runAsGroup": AGENT_USER_ID,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def image_pull_secrets(existing: list[Any] | None, agent_image: AgentImage) -> list[Any] | None:
    """The pod's imagePullSecrets with the agent image's ones added (None: none at all)."""
    secrets: list[Any] = list(existing or [])
    names = {item.get("name") for item in secrets if isinstance(item, dict)}
    secrets += [{"name": name} for name in agent_image.pull_secrets if name not in names]
    return secrets or None


DEFAULT_AGENT_LIMITS = {"cpu": "1", "memory": "512Mi"}
"""Limits the agent gets when ``spec.agent.resources.limits`` leaves one out (never below the
request): a namespace ResourceQuota on ``limits.cpu``/``limits.memory`` refuses a pod whose
containers lack that limit, and LimitRange defaults never reach a container a webhook adds
(LimitRanger runs before the mutating webhooks)."""


def agent_resources(spec: DurableProducerSpec) -> dict[str, Any]:
    resources = spec.agent.resources.model_dump(by_alias=True, exclude_none=True)
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    for resource, default in DEFAULT_AGENT_LIMITS.items():
        if resource in limits:
            continue
        request = requests.get(resource)
        limits[resource] = (
            request
            if request is not None and parse_quantity(request) > parse_quantity(default)
            else default
        )
    resources["limits"] = limits
    return {kind: amounts for kind, amounts in resources.items() if amounts}


def agent_base_container(
    spec: DurableProducerSpec, args: list[str], agent_image: AgentImage
) -> dict[str, Any]:
    """The agent container shared by the sidecar and drain Jobs: image, volumes, security."""
    return {
        "name": AGENT_CONTAINER_NAME,
        "image": agent_image.image_for(spec.agent),
        "imagePullPolicy": agent_image.pull_policy_for(spec.agent),
        "command": ["durable-agent"],
        "args": args,
        "resources": agent_resources(spec),
        "securityContext": agent_security_context(),
        "volumeMounts": [
            {"name": BUFFER_VOLUME_NAME, "mountPath": DATA_DIR},
            *_secret_mounts(spec),
        ],
    }


def agent_sidecar(
    spec: DurableProducerSpec, agent_image: AgentImage, log_level: str | None = None
) -> dict[str, Any]:
    """The agent as a native sidecar: an initContainer that keeps running (restartPolicy)."""
    container = agent_base_container(spec, agent_run_args(spec, log_level), agent_image)
    metrics_port = spec.agent.ports.metrics

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": metrics_port},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": 2,
        }

    container.update(
        restartPolicy="Always",
        ports=[{"name": METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"}],
        # Up to 2 minutes for the process to answer /healthz (before its WAL opens: recovery
        # of a large backlog may take longer, and /readyz waits for it).
        startupProbe=probe("/healthz", 1, 120),
        readinessProbe=probe("/readyz", 5, 3),
        livenessProbe=probe("/healthz", 10, 6),
    )
    return container
