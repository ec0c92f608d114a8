"""The Helm chart, rendered by the real helm binary: lint, templates, Kubernetes schemas, RBAC."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from durable_producer.operator import settings
from durable_producer.operator.act import api_access
from durable_producer.operator.model import model
from support.tools import (
    CHART_DIR,
    REPO_ROOT,
    objects_of_kind,
    render_chart,
    run_helm,
    single_object,
)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion), 1.30 and the kubectl we ship.
KUBERNETES_VERSIONS = ("1.29.0", "1.30.0", "1.35.0")

NON_DEFAULT_VALUES: dict[str, Any] = {
    "fullnameOverride": "buffering",
    "operator": {
        "image": {"repository": "registry.example:5000/dp/operator", "tag": "9.9.9",
                  "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "watchNamespaces": ["team-a", "team-b"],
        "logLevel": "debug",
        "watchServerTimeoutSeconds": 120,
        "extraArgs": ["--log-format=json"],
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "healthPort": 8081,
        "resources": {"requests": {"cpu": "50m", "memory": "100Mi"},
                      "limits": {"cpu": "1", "memory": "300Mi"}},
        "podAnnotations": {"prometheus.io/scrape": "false"},
        "podLabels": {"team": "data"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops",
                         "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
    },
    "agent": {"image": {"repository": "registry.example:5000/dp/agent", "tag": "9.9.9",
                        "pullPolicy": "Always"}},
    "serviceAccount": {"name": "dp-operator", "annotations": {"owner": "platform"}},
    "rbac": {"features": {"podAudit": True, "sparkPodTemplates": False, "volumePool": True,
                          "drainJobs": True}},
    "webhook": {"port": 10443, "service": {"port": 8443, "annotations": {"a": "b"}}},
}

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def rbac_grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def peering_access(*, namespaced: bool) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """kopf's peering object: a KopfPeering per watched namespace, else a ClusterKopfPeering."""
    return (api_access.NAMESPACED_PEERING_API_ACCESS if namespaced
            else api_access.CLUSTER_PEERING_API_ACCESS)


def declared_operator_access(*, namespaced: bool = False) -> set[Grant]:
    """What the operator uses with the default feature flags (pool, audit, Spark templates),
    the pool's cluster-scoped StorageClass and PersistentVolume reads included."""
    return {
        (group, resource, verb)
        for group, resource, verbs in (
            *api_access.KUBERNETES_API_ACCESS, *api_access.POOL_API_ACCESS,
            *api_access.STORAGE_CLASSES_API_ACCESS, *api_access.VOLUME_PLACEMENT_API_ACCESS,
            *api_access.SPARK_TEMPLATES_API_ACCESS, *peering_access(namespaced=namespaced),
            *(api_access.NAMESPACE_SCAN_API_ACCESS if namespaced else ()))
        for verb in verbs
    }


def pool_cluster_access() -> set[Grant]:
    """The pool's cluster-scoped reads: StorageClasses, PersistentVolumes and Nodes."""
    return {(group, resource, verb)
            for group, resource, verbs in api_access.CLUSTER_FEATURE_API_ACCESS[
                settings.VOLUME_POOL]
            for verb in verbs}


def all_role_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    roles = objects_of_kind(objects, "ClusterRole") + objects_of_kind(objects, "Role")
    return [rule for role in roles for rule in role["rules"]]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = single_object(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def custom_objects() -> list[dict[str, Any]]:
    return render_chart(NON_DEFAULT_VALUES)


LINTED_VALUES: dict[str, dict[str, Any] | None] = {
    "default": None,
    "non-default": NON_DEFAULT_VALUES,
    "provided-certificate": {"webhook": {"tls": {"existingSecret": "dp-webhook-cert",
                                                 "caBundle": "QUJDRA=="}}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "volume-pool-off": {"webhook": {"enabled": False}, "rbac": {"features": {
        "podAudit": False, "volumePool": False, "drainJobs": False}}},
}


@pytest.mark.parametrize("values", LINTED_VALUES.values(), ids=LINTED_VALUES.keys())
def test_helm_lint_passes_strictly(values: dict[str, Any] | None) -> None:
    result = run_helm(["lint", "--strict", str(CHART_DIR)], values=values)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_default_render_has_the_expected_objects(default_objects: list[dict[str, Any]]) -> None:
    kinds = sorted(obj["kind"] for obj in default_objects)

    assert kinds == sorted([
        "CustomResourceDefinition", "CustomResourceDefinition", "CustomResourceDefinition",
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment",
        "MutatingWebhookConfiguration", "Secret", "PodDisruptionBudget", "ClusterKopfPeering",
    ])


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", LINTED_VALUES.values(), ids=LINTED_VALUES.keys())
def test_rendered_objects_validate_against_kubernetes_schemas(
    values: dict[str, Any] | None, kubernetes_version: str
) -> None:
    objects = render_chart(values)
    for obj in objects:
        if obj["apiVersion"].startswith(("cert-manager.io/", "kopf.dev/")):
            continue  # not Kubernetes APIs: cert-manager's and kopf's own CRDs
        # strict: unknown fields are errors, as with kubectl's default field validation
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


def test_kubernetes_schema_validation_catches_a_misplaced_field(
    default_objects: list[dict[str, Any]],
) -> None:
    deployment = single_object(default_objects, "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}

    with pytest.raises(kubernetes_validate.ValidationError, match="livenessprobe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("objects_fixture", ["default_objects", "custom_objects"])
def test_operator_deployment_is_non_root_read_only(
    objects_fixture: str, request: pytest.FixtureRequest
) -> None:
    objects = request.getfixturevalue(objects_fixture)
    deployment = single_object(objects, "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    container = operator_container(objects)

    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]


def test_liveness_probe_targets_the_kopf_liveness_endpoint(
    default_objects: list[dict[str, Any]], custom_objects: list[dict[str, Any]]
) -> None:
    """From inside the pod, at localhost (127.0.0.1 and ::1): kopf binds one address family per
    socket, so an httpGet at the pod IP fails in an IPv4-only or IPv6-only cluster."""
    for objects, port in ((default_objects, 8080), (custom_objects, 8081)):
        container = operator_container(objects)
        command = container["livenessProbe"]["exec"]["command"]

        assert command[:2] == ["python", "-c"]
        assert f"urlopen('http://localhost:{port}/healthz', timeout=4)" in command[2]
        assert f"--liveness=http://localhost:{port}/healthz" in container["command"]
        assert "httpGet" not in container["livenessProbe"]


def test_default_command_is_the_documented_kopf_invocation(
    default_objects: list[dict[str, Any]],
) -> None:
    assert operator_container(default_objects)["command"] == [
        "kopf", "run", "-m", "durable_producer.operator.handlers",
        "--peering=dp-durable-producer", "--all-namespaces",
        "--liveness=http://localhost:8080/healthz",
    ]


def test_non_default_values_reach_the_deployment(custom_objects: list[dict[str, Any]]) -> None:
    deployment = single_object(custom_objects, "Deployment")
    pod = deployment["spec"]["template"]
    container = operator_container(custom_objects)
    env = {item["name"]: item.get("value") for item in container["env"]}

    assert deployment["metadata"]["name"] == "buffering"
    assert container["image"] == "registry.example:5000/dp/operator:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert "--all-namespaces" not in container["command"]
    assert container["command"][-5:] == [
        "--namespace=team-a", "--namespace=team-b", "--liveness=http://localhost:8081/healthz",
        "--debug", "--log-format=json",
    ]
    assert env["DURABLE_PRODUCER_AGENT_IMAGE"] == "registry.example:5000/dp/agent:9.9.9"
    assert env["DURABLE_PRODUCER_WATCH_SERVER_TIMEOUT"] == "120"
    assert env["EXTRA"] == "1"
    assert pod["metadata"]["labels"]["team"] == "data"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "false"
    assert set(pod["metadata"]["annotations"]) == {"prometheus.io/scrape", "checksum/webhook-tls"}
    assert pod["spec"]["serviceAccountName"] == "dp-operator"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"


def test_no_wildcards_in_rbac(
    default_objects: list[dict[str, Any]], custom_objects: list[dict[str, Any]]
) -> None:
    for objects in (default_objects, custom_objects):
        for rule in all_role_rules(objects):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"wildcard in {field}: {rule}"
            assert "resourceNames" not in rule or rule["resourceNames"]
            assert "nonResourceURLs" not in rule


def test_default_rbac_grants_exactly_what_the_operator_declares(
    default_objects: list[dict[str, Any]],
) -> None:
    """Least privilege: no more and no less than the api_access tuples."""
    granted = rbac_grants(all_role_rules(default_objects))

    assert granted == declared_operator_access()


def test_a_feature_flag_off_removes_only_its_own_permissions(
    custom_objects: list[dict[str, Any]],
) -> None:
    granted = rbac_grants(all_role_rules(custom_objects))  # watchNamespaces: namespaced peering
    spark_only = {
        (group, resource, verb)
        for group, resource, verbs in api_access.SPARK_TEMPLATES_API_ACCESS
        for verb in verbs
    } - pool_access()

    assert {resource for _, resource, _ in spark_only} == {"configmaps"}
    assert granted == declared_operator_access(namespaced=True) - spark_only


def pool_access() -> set[Grant]:
    return {(group, resource, verb)
            for group, resource, verbs in api_access.POOL_API_ACCESS for verb in verbs}


FEATURE_COMBINATIONS = [
    {"podAudit": True, "volumePool": True, "drainJobs": True, "sparkPodTemplates": True},
    {"podAudit": True, "volumePool": True, "drainJobs": True, "sparkPodTemplates": False},
    {"podAudit": False, "volumePool": False, "drainJobs": False, "sparkPodTemplates": True},
    {"podAudit": False, "volumePool": False, "drainJobs": False, "sparkPodTemplates": False},
]


@pytest.mark.parametrize("features", FEATURE_COMBINATIONS,
                         ids=lambda f: ",".join(k for k, v in f.items() if v) or "none")
def test_rbac_grants_exactly_the_access_of_the_features_the_operator_runs(
    features: dict[str, bool],
) -> None:
    """The chart's rules equal the api_access tuples of the flags on, and the operator is told
    the same flags (DURABLE_PRODUCER_FEATURES), so it runs nothing it may not do."""
    objects = render_chart({"rbac": {"features": features},
                            "webhook": {"enabled": features["volumePool"]}})
    env = {item["name"]: item.get("value", "") for item in operator_container(objects)["env"]}
    on = settings.OperatorFeatures.from_environ(env)
    expected = {
        (group, resource, verb)
        for group, resource, verbs in (
            *api_access.KUBERNETES_API_ACCESS, *api_access.CLUSTER_PEERING_API_ACCESS,
            *(entry for name in on.enabled for entry in api_access.FEATURE_API_ACCESS[name]),
            *(entry for name in on.enabled
              for entry in api_access.CLUSTER_FEATURE_API_ACCESS.get(name, ())))
        for verb in verbs
    }

    assert on.enabled == {name for name, flag in features.items() if flag}
    assert on.volume_pool == features["volumePool"]
    assert rbac_grants(all_role_rules(objects)) == expected


def test_watched_namespaces_get_roles_and_the_cluster_role_only_reads_cluster_objects(
    custom_objects: list[dict[str, Any]],
) -> None:
    """The ClusterRole keeps only cluster-scoped reads: CRDs and Namespaces (kopf) and
    StorageClasses and PersistentVolumes (the pool: a Role cannot grant a cluster-scoped
    resource); the rest is in each namespace."""
    cluster_role = single_object(custom_objects, "ClusterRole")
    roles = objects_of_kind(custom_objects, "Role")
    bindings = objects_of_kind(custom_objects, "RoleBinding")

    assert rbac_grants(cluster_role["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        *((group, resource, verb) for group, resource, verbs in
          api_access.NAMESPACE_SCAN_API_ACCESS for verb in verbs),
    } | pool_cluster_access()
    for role in roles:
        assert not rbac_grants(role["rules"]) & pool_cluster_access()
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "dp-operator", "namespace": "durable-system"}
        ]


def test_bindings_point_at_the_operator_service_account(
    default_objects: list[dict[str, Any]],
) -> None:
    service_account = single_object(default_objects, "ServiceAccount")
    binding = single_object(default_objects, "ClusterRoleBinding")
    cluster_role = single_object(default_objects, "ClusterRole")
    pod_spec = single_object(default_objects, "Deployment")["spec"]["template"]["spec"]

    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"] == [{
        "kind": "ServiceAccount",
        "name": service_account["metadata"]["name"],
        "namespace": "durable-system",
    }]
    assert pod_spec["serviceAccountName"] == service_account["metadata"]["name"]


def test_webhook_service_selects_the_operator_pod_and_its_webhook_port(
    default_objects: list[dict[str, Any]], custom_objects: list[dict[str, Any]]
) -> None:
    for objects, service_port, container_port in ((default_objects, 443, 9443),
                                                   (custom_objects, 8443, 10443)):
        service = single_object(objects, "Service")
        deployment = single_object(objects, "Deployment")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"]: p["containerPort"] for p in operator_container(objects)["ports"]}
        (port,) = service["spec"]["ports"]

        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert port["port"] == service_port
        assert ports[port["targetPort"]] == container_port


def test_webhook_can_be_switched_off() -> None:
    objects = render_chart({"webhook": {"enabled": False}})
    container = operator_container(objects)

    assert not objects_of_kind(objects, "Service")
    assert not objects_of_kind(objects, "MutatingWebhookConfiguration")
    assert not objects_of_kind(objects, "Secret")
    assert "webhook" not in {p["name"] for p in container.get("ports", [])}
    assert "DURABLE_PRODUCER_WEBHOOK_CERT_FILE" not in {e["name"] for e in container["env"]}


def test_every_object_carries_the_standard_labels(
    default_objects: list[dict[str, Any]],
) -> None:
    for obj in default_objects:
        if obj["kind"] == "CustomResourceDefinition":
            continue  # shipped verbatim from crds/, not templated
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "durable-producer"
        assert labels["app.kubernetes.io/instance"] == "dp"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["helm.sh/chart"] == "durable-producer-0.1.0"


def test_chart_crd_is_an_exact_copy_of_the_repository_crd() -> None:
    source = REPO_ROOT / "crds" / "durableproducers.durable.dev.yaml"
    chart_copy = CHART_DIR / "crds" / "durableproducers.durable.dev.yaml"

    assert chart_copy.read_bytes() == source.read_bytes(), (
        f"the chart's CRD differs from {source}: copy it with `cp {source} {chart_copy}`"
    )
    for path in (REPO_ROOT / "crds").glob("*.yaml"):  # kopf's peering CRDs too
        assert (CHART_DIR / "crds" / path.name).read_bytes() == path.read_bytes(), path.name
    assert sorted(p.name for p in (CHART_DIR / "crds").iterdir()) == sorted(
        p.name for p in (REPO_ROOT / "crds").glob("*.yaml")
    )


def test_chart_and_app_versions_follow_the_package_version() -> None:
    from importlib.metadata import version

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())

    assert chart["appVersion"] == version("durable-producer")
    assert chart["version"] == version("durable-producer")


def test_notes_render_with_the_release_specifics() -> None:
    result = run_helm(
        ["install", "dp", str(CHART_DIR), "--dry-run=client", "--namespace", "durable-system"],
        values={"operator": {"watchNamespaces": ["team-a"]}},
    )

    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "durable-producer/operator:0.1.0" in notes
    assert "Watching:  team-a" in notes
    assert "kubectl -n durable-system get deploy dp-durable-producer" in notes


def test_operator_reads_every_setting_the_chart_passes(
    default_objects: list[dict[str, Any]],
) -> None:
    env = {item["name"]: item for item in operator_container(default_objects)["env"]}

    assert env[model.AGENT_IMAGE_ENV]["value"] == model.DEFAULT_AGENT_IMAGE
    assert env[model.AGENT_IMAGE_PULL_POLICY_ENV]["value"] == "IfNotPresent"
    assert int(env[settings.WATCH_SERVER_TIMEOUT_ENV]["value"]) == (
        settings.DEFAULT_WATCH_SERVER_TIMEOUT_SECONDS)
    operator_source = "\n".join(
        path.read_text() for path in (REPO_ROOT / "src/durable_producer/operator").rglob("*.py"))
    unread = [name for name in env if f'"{name}"' not in operator_source]
    assert not unread, f"the chart sets {unread}, which the operator never reads"


def test_crd_leaves_the_agent_image_to_the_chart(default_objects: list[dict[str, Any]]) -> None:
    """A CRD default would fill spec.agent.image in every object and hide the chart's value."""
    (definition,) = [crd for crd in objects_of_kind(default_objects, "CustomResourceDefinition")
                     if crd["metadata"]["name"] == "durableproducers.durable.dev"]
    (served,) = definition["spec"]["versions"]
    spec = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    agent = spec["properties"]["agent"]

    assert "default" not in agent["properties"]["image"]
    assert "image" not in agent.get("default", {})
    assert "imagePullPolicy" not in agent.get("default", {})


def test_chart_refuses_kubernetes_without_native_sidecars() -> None:
    """Agents run as native sidecars (restartPolicy: Always init containers): 1.29 or newer."""
    too_old = run_helm(["template", "dp", str(CHART_DIR), "--kube-version", "1.28.0"])
    oldest = run_helm(["template", "dp", str(CHART_DIR), "--kube-version", "1.29.0"])

    assert too_old.returncode != 0
    assert "chart requires kubeVersion: >=1.29.0-0" in too_old.stderr
    assert oldest.returncode == 0, oldest.stderr


def test_chart_packages_with_its_crd_schema_and_notes(tmp_path: Path) -> None:
    result = run_helm(["package", str(CHART_DIR), "--destination", str(tmp_path)])

    assert result.returncode == 0, result.stderr
    with tarfile.open(tmp_path / "durable-producer-0.1.0.tgz") as package:
        names = set(package.getnames())
    assert {
        "durable-producer/Chart.yaml",
        "durable-producer/values.yaml",
        "durable-producer/values.schema.json",
        "durable-producer/crds/durableproducers.durable.dev.yaml",
        "durable-producer/templates/NOTES.txt",
    } <= names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".orig")]


def test_service_account_and_rbac_can_be_brought_by_the_cluster_admin() -> None:
    objects = render_chart({"serviceAccount": {"create": False, "name": "platform-operator"},
                            "rbac": {"create": False}})
    pod_spec = single_object(objects, "Deployment")["spec"]["template"]["spec"]

    assert not objects_of_kind(objects, "ServiceAccount")
    assert not [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io")]
    assert pod_spec["serviceAccountName"] == "platform-operator"
