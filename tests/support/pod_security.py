"""The Kubernetes Pod Security Standards, "baseline" and "restricted", as a checker of pod specs.

Written from the Pod Security Standards document (kubernetes.io, concepts/security/
pod-security-standards), control by control, so that tests can show that every pod this
project makes (the operator, an app pod after the webhook, a drain Job) would be admitted in
a namespace labelled ``pod-security.kubernetes.io/enforce: restricted``. No API server runs
here, so the Pod Security admission controller itself cannot be asked.

``violations(pod)`` takes a Pod manifest (or ``{"metadata": ..., "spec": ...}`` of a pod
template) and returns one line per violated control, ``"<control>: <what>"``; empty: the pod
meets the profile. "Containers" means containers, initContainers and ephemeralContainers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE = "baseline"
RESTRICTED = "restricted"

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
})  # fmt: skip
SELINUX_TYPES = frozenset({
    "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
RESTRICTED_VOLUME_TYPES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
})  # fmt: skip
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HOOKS = ("postStart", "preStop")

Violations = Iterator[str]


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        (f"{kind}[{container.get('name')}]", container)
        for kind in CONTAINER_LISTS
        for container in spec.get(kind) or []
    ]


def _context(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


# ------------------------------------------------------------------------------ baseline


def _host_process(spec: Mapping[str, Any]) -> Violations:
    owners = [("spec", spec.get("securityContext") or {})]
    owners += [(name, _context(c)) for name, c in _containers(spec)]
    for where, context in owners:
        if (context.get("windowsOptions") or {}).get("hostProcess") not in (None, False):
            yield f"HostProcess: {where} sets windowsOptions.hostProcess"


def _host_namespaces(spec: Mapping[str, Any]) -> Violations:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) not in (None, False):
            yield f"Host Namespaces: spec.{field} is {spec.get(field)!r}"


def _privileged(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        if _context(container).get("privileged") not in (None, False):
            yield f"Privileged Containers: {name} is privileged"


def _baseline_capabilities(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        added = set((_context(container).get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            yield f"Capabilities: {name} adds {sorted(added - BASELINE_CAPABILITIES)}"


def _host_path(spec: Mapping[str, Any]) -> Violations:
    for volume in spec.get("volumes") or []:
        if volume.get("hostPath") is not None:
            yield f"HostPath Volumes: volume {volume.get('name')} is a hostPath"


def _host_ports(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        for port in container.get("ports") or []:
            if port.get("hostPort") not in (None, 0):
                yield f"Host Ports: {name} uses hostPort {port.get('hostPort')}"


def _host_probes(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        handlers = [(probe, container.get(probe) or {}) for probe in PROBES]
        lifecycle = container.get("lifecycle") or {}
        handlers += [(f"lifecycle.{hook}", lifecycle.get(hook) or {}) for hook in LIFECYCLE_HOOKS]
        for where, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                if (handler.get(action) or {}).get("host") not in (None, ""):
                    yield f"Host Probes / Lifecycle Hooks: {name}.{where}.{action} sets host"


def _apparmor(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> Violations:
    owners = [("spec", spec.get("securityContext") or {})]
    owners += [(name, _context(c)) for name, c in _containers(spec)]
    for where, context in owners:
        kind = (context.get("appArmorProfile") or {}).get("type")
        if kind is not None and kind not in APPARMOR_TYPES:
            yield f"AppArmor: {where} sets appArmorProfile.type {kind}"
    for key, value in (metadata.get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            yield f"AppArmor: annotation {key} is {value!r}"


def _selinux(spec: Mapping[str, Any]) -> Violations:
    owners = [("spec", spec.get("securityContext") or {})]
    owners += [(name, _context(c)) for name, c in _containers(spec)]
    for where, context in owners:
        options = context.get("seLinuxOptions") or {}
        if options.get("type") not in (None, *SELINUX_TYPES):
            yield f"SELinux: {where} sets seLinuxOptions.type {options.get('type')}"
        for field in ("user", "role"):
            if options.get(field) not in (None, ""):
                yield f"SELinux: {where} sets seLinuxOptions.{field}"


def _proc_mount(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        if _context(container).get("procMount") not in (None, "Default"):
            yield f"/proc Mount Type: {name} sets procMount {_context(container)['procMount']}"


def _baseline_seccomp(spec: Mapping[str, Any]) -> Violations:
    owners = [("spec", spec.get("securityContext") or {})]
    owners += [(name, _context(c)) for name, c in _containers(spec)]
    for where, context in owners:
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"Seccomp: {where} is Unconfined"


def _sysctls(spec: Mapping[str, Any]) -> Violations:
    for sysctl in (spec.get("securityContext") or {}).get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"Sysctls: {sysctl.get('name')} is not a safe sysctl"


# ------------------------------------------------------------------------------ restricted


def _volume_types(spec: Mapping[str, Any]) -> Violations:
    for volume in spec.get("volumes") or []:
        kinds = {key for key, value in volume.items() if key != "name" and value is not None}
        if not kinds & RESTRICTED_VOLUME_TYPES:
            yield f"Volume Types: volume {volume.get('name')} is {sorted(kinds)}"


def _privilege_escalation(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        if _context(container).get("allowPrivilegeEscalation") is not False:
            yield f"Privilege Escalation: {name} does not set allowPrivilegeEscalation: false"


def _non_root(spec: Mapping[str, Any]) -> Violations:
    pod_level = (spec.get("securityContext") or {}).get("runAsNonRoot")
    if pod_level is False:
        yield "Running as Non-root: spec.securityContext.runAsNonRoot is false"
    for name, container in _containers(spec):
        own = _context(container).get("runAsNonRoot")
        if own is False or (own is None and pod_level is not True):
            yield f"Running as Non-root: {name} may run as root (runAsNonRoot not true)"


def _non_root_user(spec: Mapping[str, Any]) -> Violations:
    owners = [("spec", spec.get("securityContext") or {})]
    owners += [(name, _context(c)) for name, c in _containers(spec)]
    for where, context in owners:
        if context.get("runAsUser") == 0:
            yield f"Running as Non-root user: {where} sets runAsUser 0"


def _restricted_seccomp(spec: Mapping[str, Any]) -> Violations:
    pod_level = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_level is not None and pod_level not in SECCOMP_TYPES:
        yield f"Seccomp: spec.securityContext.seccompProfile.type is {pod_level}"
    for name, container in _containers(spec):
        own = (_context(container).get("seccompProfile") or {}).get("type")
        if own is not None and own not in SECCOMP_TYPES:
            yield f"Seccomp: {name} seccompProfile.type is {own}"
        if own is None and pod_level not in SECCOMP_TYPES:
            yield f"Seccomp: {name} has no seccompProfile (nor has the pod)"


def _restricted_capabilities(spec: Mapping[str, Any]) -> Violations:
    for name, container in _containers(spec):
        capabilities = _context(container).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"Capabilities: {name} does not drop ALL"
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            yield f"Capabilities: {name} adds {sorted(added)}"


def violations(pod: Mapping[str, Any], level: str = RESTRICTED) -> list[str]:
    """Every control of ``level`` (baseline, or restricted = baseline + its own) the pod fails."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    found = [
        *_host_process(spec), *_host_namespaces(spec), *_privileged(spec),
        *_baseline_capabilities(spec), *_host_path(spec), *_host_ports(spec),
        *_host_probes(spec), *_apparmor(metadata, spec), *_selinux(spec),
        *_proc_mount(spec), *_baseline_seccomp(spec), *_sysctls(spec),
    ]  # fmt: skip
    if level == RESTRICTED:
        found += [*_volume_types(spec), *_non_root(spec), *_non_root_user(spec)]
        if (spec.get("os") or {}).get("name") != "windows":  # the Linux-only controls
            found += [
                *_privilege_escalation(spec), *_restricted_seccomp(spec),
                *_restricted_capabilities(spec),
            ]  # fmt: skip
    return found


def pod_of(template_owner: Mapping[str, Any]) -> dict[str, Any]:
    """The pod a Deployment or Job would create: its pod template as a Pod."""
    template = template_owner["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", **template}
