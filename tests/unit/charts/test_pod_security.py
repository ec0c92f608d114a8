"""Every pod the project makes meets Pod Security "restricted": the operator (rendered chart),
an app pod after the webhook, and a drain Job; and the checker itself catches each control."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from durable_producer.operator.decide import agent_container, manifests, pod_mutation
from durable_producer.operator.model.installation import AgentImage, PoolPolicy
from durable_producer.operator.model.model import DurableProducerSpec
from support.pod_security import BASELINE, pod_of, violations
from support.tools import render_chart, single_object

AGENT_IMAGE = AgentImage(image="registry.example/agent:1", pull_secrets=("regcred",))
PRODUCER = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
SPEC = DurableProducerSpec.model_validate({
    "kafka": {"bootstrapServers": ["kafka:9093"],
              "tls": {"caSecretRef": {"name": "kafka-ca", "key": "ca.crt"},
                      "clientCertificateSecretName": "client-tls"},
              "sasl": {"mechanism": "SCRAM-SHA-512", "secretName": "kafka-user"}},
    "throughput": {"peakBytesPerSecond": 2**20},
})  # fmt: skip

RESTRICTED_CONTAINER_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def restricted_app_pod(*, pod_level: bool) -> dict[str, Any]:
    """An app pod that is itself restricted-compliant: with the pod-level settings, or with
    everything on its container (then nothing at pod level covers a container added later)."""
    container_context = dict(RESTRICTED_CONTAINER_CONTEXT)
    pod_context: dict[str, Any] = {}
    non_root = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if pod_level:
        pod_context = non_root
    else:
        container_context |= non_root
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": "shop",
                     "labels": {"durable.dev/producer": "orders"}},
        "spec": {
            "securityContext": pod_context,
            "containers": [{"name": "app", "image": "shop/app:1",
                            "securityContext": container_context}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
        },
    }  # fmt: skip


def mutated(pod: dict[str, Any]) -> dict[str, Any]:
    ops = pod_mutation.mutation_patch(pod, "orders", SPEC, "orders-buffer-1", AGENT_IMAGE)
    return jsonpatch.apply_patch(pod, ops, in_place=False)


@pytest.mark.parametrize("pod_level", [True, False], ids=["pod-level", "container-level"])
def test_a_restricted_app_pod_stays_restricted_after_the_webhook(pod_level: bool) -> None:
    pod = restricted_app_pod(pod_level=pod_level)
    assert violations(pod) == []

    result = mutated(pod)

    assert pod_mutation.is_injected(result)
    assert violations(result) == []


def test_the_agent_sidecar_is_restricted_on_its_own() -> None:
    """Whatever the app pod sets at pod level, the sidecar carries every setting itself."""
    sidecar = agent_container.agent_sidecar(SPEC, AGENT_IMAGE)
    lone = {"spec": {"initContainers": [sidecar], "containers": []}}

    assert violations(lone) == []
    assert sidecar["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_drain_job_pod_is_restricted_and_has_no_api_token() -> None:
    job = manifests.drain_job_manifest(PRODUCER, SPEC, "orders-buffer-1", PoolPolicy(),
                                       AGENT_IMAGE)
    pod = pod_of(job)

    assert violations(pod) == []
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


@pytest.mark.parametrize("values", [None, {"operator": {"watchNamespaces": ["team-a"]},
                                           "webhook": {"certManager": {"enabled": True}}}],
                         ids=["default", "non-default"])
def test_the_operator_pod_is_restricted(values: dict[str, Any] | None) -> None:
    deployment = single_object(render_chart(values), "Deployment")

    assert violations(pod_of(deployment)) == []


@pytest.mark.parametrize("kubernetes_version", ["1.29.0", "1.30.0", "1.35.0"])
def test_the_objects_the_operator_makes_validate_against_kubernetes_schemas(
    kubernetes_version: str,
) -> None:
    """What the operator sends the API server: the mutated pod, a pool PVC, a drain Job, the
    Spark templates ConfigMap (strict: an unknown or misplaced field is an error)."""
    from datetime import UTC, datetime

    from durable_producer.operator.decide import spark_templates

    objects = [
        mutated(restricted_app_pod(pod_level=False)),
        manifests.new_volume_manifest(PRODUCER, SPEC, "orders-buffer-1", "token",
                                      datetime.now(UTC)),
        manifests.drain_job_manifest(PRODUCER, SPEC, "orders-buffer-1", PoolPolicy(),
                                     AGENT_IMAGE),
        spark_templates.templates_configmap(PRODUCER, SPEC),
    ]
    for obj in objects:
        assert obj is not None
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


# ------------------------------------------------------------------ the checker, control by control


def compliant() -> dict[str, Any]:
    return mutated(restricted_app_pod(pod_level=True))


def app(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def agent(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["initContainers"][0]
    return container


Breaker = Callable[[dict[str, Any]], None]
BREAKERS: list[tuple[str, str, Breaker]] = [
    ("HostProcess", BASELINE, lambda p: app(p)["securityContext"].update(
        windowsOptions={"hostProcess": True})),
    ("Host Namespaces", BASELINE, lambda p: p["spec"].update(hostPID=True)),
    ("Host Namespaces", BASELINE, lambda p: p["spec"].update(hostNetwork=True)),
    ("Privileged Containers", BASELINE, lambda p: agent(p)["securityContext"].update(
        privileged=True)),
    ("Capabilities", BASELINE, lambda p: app(p)["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN"])),
    ("HostPath Volumes", BASELINE, lambda p: p["spec"]["volumes"].append(
        {"name": "host", "hostPath": {"path": "/"}})),
    ("Host Ports", BASELINE, lambda p: app(p).update(ports=[{"containerPort": 80,
                                                             "hostPort": 80}])),
    ("Host Probes", BASELINE, lambda p: agent(p)["livenessProbe"]["httpGet"].update(
        host="10.0.0.1")),
    ("AppArmor", BASELINE, lambda p: p["spec"]["securityContext"].update(
        appArmorProfile={"type": "Unconfined"})),
    ("AppArmor", BASELINE, lambda p: p["metadata"].setdefault("annotations", {}).update(
        {"container.apparmor.security.beta.kubernetes.io/app": "unconfined"})),
    ("SELinux", BASELINE, lambda p: app(p)["securityContext"].update(
        seLinuxOptions={"type": "spc_t"})),
    ("SELinux", BASELINE, lambda p: p["spec"]["securityContext"].update(
        seLinuxOptions={"user": "root"})),
    ("/proc Mount Type", BASELINE, lambda p: app(p)["securityContext"].update(
        procMount="Unmasked")),
    ("Seccomp", BASELINE, lambda p: agent(p)["securityContext"].update(
        seccompProfile={"type": "Unconfined"})),
    ("Sysctls", BASELINE, lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}])),
    ("Volume Types", "restricted", lambda p: p["spec"]["volumes"].append(
        {"name": "nfs", "nfs": {"server": "nfs", "path": "/"}})),
    ("Privilege Escalation", "restricted", lambda p: app(p)["securityContext"].pop(
        "allowPrivilegeEscalation")),
    ("Running as Non-root", "restricted", lambda p: p["spec"]["securityContext"].pop(
        "runAsNonRoot")),
    ("Running as Non-root", "restricted", lambda p: agent(p)["securityContext"].update(
        runAsNonRoot=False)),
    ("Running as Non-root user", "restricted", lambda p: app(p)["securityContext"].update(
        runAsUser=0)),
    ("Seccomp", "restricted", lambda p: p["spec"]["securityContext"].pop("seccompProfile")),
    ("Capabilities", "restricted", lambda p: agent(p)["securityContext"]["capabilities"].update(
        drop=["NET_RAW"])),
    ("Capabilities", "restricted", lambda p: app(p)["securityContext"]["capabilities"].update(
        add=["CHOWN"])),
]  # fmt: skip


@pytest.mark.parametrize(("control", "level", "breaker"), BREAKERS,
                         ids=[f"{level}-{control}-{i}" for i, (control, level, _) in
                              enumerate(BREAKERS)])
def test_the_checker_catches_each_control(control: str, level: str, breaker: Breaker) -> None:
    pod = compliant()
    assert violations(pod) == []
    broken = copy.deepcopy(pod)

    breaker(broken)

    found = violations(broken, level)
    assert found and all(line.startswith(control) for line in found), found
    # Restricted includes baseline; a restricted-only control leaves baseline satisfied.
    assert set(found) <= set(violations(broken))
    if level != BASELINE:
        assert violations(broken, BASELINE) == []
