"""The chart's mutating webhook: configuration, TLS (generated or cert-manager), operator wiring."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durable_producer.operator import settings
from durable_producer.operator.act import admission
from durable_producer.operator.model import installation
from support.tools import CHART_DIR, objects_of_kind, render_chart, run_helm, single_object

NAMESPACE = "durable-system"


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = single_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in operator_container(objects)["env"]}


@pytest.fixture(scope="module")
def cert_manager_objects() -> list[dict[str, Any]]:
    return render_chart({"webhook": {"certManager": {"enabled": True}}})


def test_webhook_targets_opted_in_pods_with_the_documented_policies(
    default_objects: list[dict[str, Any]],
) -> None:
    configuration = single_object(default_objects, "MutatingWebhookConfiguration")
    (webhook,) = configuration["webhooks"]

    assert webhook["objectSelector"] == {
        "matchExpressions": [{"key": "durable.dev/producer", "operator": "Exists"}]}
    assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", "kube-node-lease"]
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["timeoutSeconds"] == 10
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                 "operations": ["CREATE"], "resources": ["pods"],
                                 "scope": "Namespaced"}]


def test_webhook_calls_the_kopf_handler_through_the_service(
    default_objects: list[dict[str, Any]],
) -> None:
    (webhook,) = single_object(default_objects, "MutatingWebhookConfiguration")["webhooks"]
    service = single_object(default_objects, "Service")
    reference = webhook["clientConfig"]["service"]

    assert reference["path"] == f"/{admission.MUTATION_WEBHOOK_ID}"
    assert reference["name"] == service["metadata"]["name"]
    assert reference["namespace"] == NAMESPACE
    assert reference["port"] == service["spec"]["ports"][0]["port"]


def test_operator_serves_the_webhook_with_the_mounted_certificate(
    default_objects: list[dict[str, Any]],
) -> None:
    container = operator_container(default_objects)
    pod_spec = single_object(default_objects, "Deployment")["spec"]["template"]["spec"]
    secret = single_object(default_objects, "Secret")
    env = env_of(default_objects)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-tls"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "webhook-tls"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert env[settings.WEBHOOK_CERT_FILE_ENV] == f"{mount['mountPath']}/tls.crt"
    assert env[settings.WEBHOOK_KEY_FILE_ENV] == f"{mount['mountPath']}/tls.key"
    assert int(env[settings.WEBHOOK_PORT_ENV]) == ports["webhook"]
    webhook = settings.WebhookSettings.from_environ(env)
    assert webhook.enabled and webhook.port == 9443


def test_generated_certificate_is_signed_by_the_ca_bundle_for_the_service_name(
    default_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is needed to inspect the certificate")
    secret = single_object(default_objects, "Secret")
    (webhook,) = single_object(default_objects, "MutatingWebhookConfiguration")["webhooks"]
    service = single_object(default_objects, "Service")["metadata"]["name"]
    ca_file, cert_file = tmp_path / "ca.crt", tmp_path / "tls.crt"
    ca_file.write_bytes(base64.b64decode(webhook["clientConfig"]["caBundle"]))
    cert_file.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))

    verified = subprocess.run(
        [openssl, "verify", "-CAfile", str(ca_file), "-verify_hostname",
         f"{service}.{NAMESPACE}.svc", str(cert_file)],
        capture_output=True, text=True, timeout=30, check=False)

    assert secret["type"] == "kubernetes.io/tls"
    assert secret["data"]["ca.crt"] == webhook["clientConfig"]["caBundle"]
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert b"PRIVATE KEY" in base64.b64decode(secret["data"]["tls.key"])


def by_name(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects_of_kind(objects, kind)}


def test_cert_manager_issues_the_certificate_and_injects_the_ca(
    cert_manager_objects: list[dict[str, Any]],
) -> None:
    configuration = single_object(cert_manager_objects, "MutatingWebhookConfiguration")
    certificates = by_name(cert_manager_objects, "Certificate")
    issuers = by_name(cert_manager_objects, "Issuer")
    pod_spec = single_object(cert_manager_objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "webhook-tls"]
    service = single_object(cert_manager_objects, "Service")["metadata"]["name"]
    (certificate,) = [c for c in certificates.values() if not c["spec"].get("isCA")]

    assert not objects_of_kind(cert_manager_objects, "Secret")
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}")
    assert certificate["spec"]["secretName"] == volume["secret"]["secretName"]
    assert f"{service}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["kind"] == "Issuer"
    assert certificate["spec"]["issuerRef"]["name"] in issuers


def test_cert_manager_signs_the_webhook_certificate_with_a_stable_ca(
    cert_manager_objects: list[dict[str, Any]],
) -> None:
    """The webhook's certificate is signed by a CA Issuer whose long-lived CA comes from a
    self-signed Issuer, so cert-manager's renewal of the webhook certificate keeps the CA the
    ca-injector puts into the caBundle (a self-signed webhook certificate would change it on
    every renewal, and pods would see x509 errors until each replica reloaded its files)."""
    certificates = by_name(cert_manager_objects, "Certificate")
    issuers = by_name(cert_manager_objects, "Issuer")
    (ca,) = [c for c in certificates.values() if c["spec"].get("isCA")]
    (serving,) = [c for c in certificates.values() if not c["spec"].get("isCA")]
    signer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca_signer = issuers[ca["spec"]["issuerRef"]["name"]]

    assert signer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert ca_signer["spec"] == {"selfSigned": {}}
    assert ca["spec"]["duration"] == f"{3650 * 24}h"


def test_cert_manager_can_use_an_existing_cluster_issuer() -> None:
    objects = render_chart({"webhook": {"certManager": {
        "enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "internal-ca"}}}})

    assert not objects_of_kind(objects, "Issuer")
    assert single_object(objects, "Certificate")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer", "name": "internal-ca"}


def test_policy_values_reach_the_configuration() -> None:
    objects = render_chart({"webhook": {
        "failurePolicy": "Ignore", "timeoutSeconds": 2,
        # null removes the default's key (Helm merges maps with the defaults).
        "namespaceSelector": {"matchExpressions": None,
                              "matchLabels": {"durable.dev/inject": "enabled"}}}})
    (webhook,) = single_object(objects, "MutatingWebhookConfiguration")["webhooks"]

    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] == 2
    assert webhook["namespaceSelector"] == {"matchLabels": {"durable.dev/inject": "enabled"}}


@pytest.mark.parametrize(("values", "message"), [
    ({"webhook": {"failurePolicy": "Sometimes"}}, "at '/webhook/failurePolicy'"),
    ({"webhook": {"timeoutSeconds": 31}}, "at '/webhook/timeoutSeconds'"),
    ({"pool": {"idleTtlSeconds": -1}}, "at '/pool/idleTtlSeconds'"),
])
def test_bad_webhook_and_pool_values_are_refused(values: dict[str, Any], message: str) -> None:
    result = run_helm(["template", "dp", str(CHART_DIR)], values=values)

    assert result.returncode != 0
    assert message in result.stderr


def test_pool_timings_reach_the_operator(default_objects: list[dict[str, Any]]) -> None:
    env = env_of(render_chart({"pool": {"claimGraceSeconds": 7, "drainGraceSeconds": 8,
                                        "idleTtlSeconds": 9, "drainTimeoutSeconds": 10,
                                        "drainRetryMaxSeconds": 11}}))

    policy = settings.pool_policy_from_environ(env)

    assert (policy.claim_grace_seconds, policy.drain_grace_seconds, policy.idle_ttl_seconds,
            policy.drain_timeout_seconds, policy.drain_retry_max_seconds) == (7, 8, 9, 10, 11)
    assert settings.pool_policy_from_environ(env_of(default_objects)) == (
        installation.PoolPolicy(claim_grace_seconds=120, drain_grace_seconds=60,
                               idle_ttl_seconds=900, drain_timeout_seconds=600))


def webhook_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (webhook,) = single_object(objects, "MutatingWebhookConfiguration")["webhooks"]
    return dict(webhook)


def test_watched_namespaces_narrow_the_webhook_to_them() -> None:
    """Elsewhere the operator may not read DurableProducers: it must not be asked at all."""
    objects = render_chart({"operator": {"watchNamespaces": ["team-a", "team-b"]}})

    expressions = webhook_of(objects)["namespaceSelector"]["matchExpressions"]

    assert {"key": "kubernetes.io/metadata.name", "operator": "In",
            "values": ["team-a", "team-b"]} in expressions
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "kube-node-lease"]} in expressions  # kept: ANDed


def test_watched_namespaces_narrow_a_custom_selector_too() -> None:
    objects = render_chart({"operator": {"watchNamespaces": ["team-a"]}, "webhook": {
        "namespaceSelector": {"matchExpressions": None,
                              "matchLabels": {"durable.dev/inject": "enabled"}}}})

    assert webhook_of(objects)["namespaceSelector"] == {
        "matchLabels": {"durable.dev/inject": "enabled"},
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                              "values": ["team-a"]}]}


def test_all_namespaces_keep_the_configured_selector(
    default_objects: list[dict[str, Any]],
) -> None:
    assert webhook_of(default_objects)["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["kube-system", "kube-node-lease"]}]}


def test_operator_is_told_the_webhook_timeout_and_the_features() -> None:
    env = env_of(render_chart({"webhook": {"timeoutSeconds": 3},
                               "rbac": {"features": {"sparkPodTemplates": False}},
                               "agent": {"imagePullSecrets": [{"name": "a"}, {"name": "b"}]}}))

    config = settings.OperatorConfig.from_environ(env)

    assert config.webhook.timeout_seconds == 3
    assert config.webhook.api_budget_seconds == 1
    assert config.features.volume_pool and not config.features.spark_pod_templates
    assert config.agent_image.pull_secrets == ("a", "b")


TLS_VALUES = {"webhook": {"tls": {"existingSecret": "dp-webhook-cert",
                                  "caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----"
                                                               b"\nMIIB\n").decode()}}}


def test_a_provided_certificate_renders_the_same_every_time() -> None:
    """`helm template` (kubectl, GitOps) has no cluster to look the Secret up in: with
    webhook.tls the output is the same on every render, so re-applying it changes nothing."""
    first = render_chart(TLS_VALUES)
    second = render_chart(TLS_VALUES)
    pod_spec = single_object(first, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "webhook-tls"]

    assert first == second
    assert not objects_of_kind(first, "Secret")  # the admin's Secret is mounted as it is
    assert volume["secret"]["secretName"] == "dp-webhook-cert"
    assert webhook_of(first)["clientConfig"]["caBundle"] == TLS_VALUES["webhook"]["tls"][
        "caBundle"]


def test_a_generated_certificate_is_new_on_each_template_render_and_restarts_the_operator(
) -> None:
    """The documented limit of the generated certificate: `helm install`/`upgrade` reuse the
    Secret (lookup); `helm template` cannot, so each render has a new CA. The Deployment
    carries the certificate's checksum, so applying a new render restarts the operator with
    the certificate the new caBundle trusts, instead of serving the old one."""
    first, second = render_chart(), render_chart()

    def tls(objects: list[dict[str, Any]]) -> dict[str, str]:
        secret = single_object(objects, "Secret")["data"]
        return {"caBundle": webhook_of(objects)["clientConfig"]["caBundle"],
                "tls.crt": secret["tls.crt"], "tls.key": secret["tls.key"]}

    def checksum(objects: list[dict[str, Any]]) -> str:
        pod = single_object(objects, "Deployment")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/webhook-tls"])

    assert tls(first)["caBundle"] != tls(second)["caBundle"]
    for objects in (first, second):
        material = json.dumps(tls(objects), sort_keys=True, separators=(",", ":"))
        assert checksum(objects) == hashlib.sha256(material.encode()).hexdigest()


@pytest.mark.parametrize(("values", "message"), [
    ({"webhook": {"tls": {"existingSecret": "mine"}}}, "at '/webhook/tls/caBundle'"),
    ({"webhook": {"tls": {"existingSecret": "mine", "caBundle": "QUJD"},
                  "certManager": {"enabled": True}}}, "at '/webhook/certManager/enabled'"),
    ({"webhook": {"tls": {"existingSecret": "Not_A_Name", "caBundle": "QUJD"}}},
     "at '/webhook/tls/existingSecret'"),
    ({"webhook": {"tls": {"existingSecret": "mine", "caBundle": "not base64!"}}},
     "at '/webhook/tls/caBundle'"),
])  # fmt: skip
def test_contradictory_certificate_values_are_refused(
    values: dict[str, Any], message: str
) -> None:
    result = run_helm(["template", "dp", str(CHART_DIR)], values=values)

    assert result.returncode != 0
    assert message in result.stderr


def test_a_webhook_url_replaces_the_service_reference() -> None:
    """webhook.url: the API server calls the operator at that address (an operator outside
    the service network, as in the tests against the local API server); no Service."""
    values = {"webhook": {**TLS_VALUES["webhook"], "url": "https://127.0.0.1:9443/"}}
    objects = render_chart(values)
    client = webhook_of(objects)["clientConfig"]

    assert client == {"url": f"https://127.0.0.1:9443/{admission.MUTATION_WEBHOOK_ID}",
                      "caBundle": TLS_VALUES["webhook"]["tls"]["caBundle"]}
    assert not objects_of_kind(objects, "Service")
    assert env_of(objects)[settings.WEBHOOK_CERT_FILE_ENV]  # still served with the Secret's


@pytest.mark.parametrize(("values", "message"), [
    ({"webhook": {"url": "https://127.0.0.1:9443"}}, "at '/webhook/tls/existingSecret'"),
    ({"webhook": {**TLS_VALUES["webhook"], "url": "http://127.0.0.1:9443"}},
     "at '/webhook/url'"),
    ({"webhook": {**TLS_VALUES["webhook"], "url": "https://127.0.0.1:9443/attach"}},
     "at '/webhook/url'"),
])  # fmt: skip
def test_bad_webhook_urls_are_refused(values: dict[str, Any], message: str) -> None:
    result = run_helm(["template", "dp", str(CHART_DIR)], values=values)

    assert result.returncode != 0
    assert message in result.stderr
