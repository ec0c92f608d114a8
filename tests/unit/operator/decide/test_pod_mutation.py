"""Pod mutation: the JSONPatch applied to a pod gives exactly the expected pod, idempotently."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_producer import contract, volume_budget
from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.settings import settings_from
from durable_producer.operator.decide import agent_container, pod_mutation
from durable_producer.operator.decide.sizing import SizingInputs, size_buffer
from durable_producer.operator.model.installation import AgentImage
from durable_producer.operator.model.model import DurableProducerSpec
from durable_producer.operator.settings import agent_image_from_environ

AGENT_IMAGE = agent_image_from_environ(
    {"DURABLE_PRODUCER_AGENT_IMAGE": "registry.example/agent:1.2.3"})
CLAIM = "orders-buffer-abc"


def make_spec(**overrides: Any) -> DurableProducerSpec:
    raw: dict[str, Any] = {
        "kafka": {"bootstrapServers": ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]},
        "throughput": {"peakBytesPerSecond": 2**20},
        "outageSeconds": 600,
    }
    raw.update(overrides)
    return DurableProducerSpec.model_validate(raw)


def deployment_pod() -> dict[str, Any]:
    """A pod as a ReplicaSet creates it: generateName, no name yet."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-7d9f8-",
            "namespace": "shop",
            "labels": {"app": "orders", contract.PRODUCER_LABEL: "orders"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "orders-7d9f8", "uid": "u-1", "controller": True}],
        },
        "spec": {
            "containers": [{
                "name": "app",
                "image": "shop/orders:1",
                "env": [{"name": "LOG_LEVEL", "value": "info"}],
            }],
            "restartPolicy": "Always",
        },
    }


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(pod, ops, in_place=False)


def patch_for(pod: dict[str, Any], spec: DurableProducerSpec | None = None,
              claim: str = CLAIM) -> list[dict[str, Any]]:
    return pod_mutation.mutation_patch(pod, "orders", spec or make_spec(), claim, AGENT_IMAGE)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def test_plain_deployment_pod_gets_sidecar_env_volume_grace_and_annotations() -> None:
    pod = deployment_pod()

    result = apply(pod, patch_for(pod))

    spec = result["spec"]
    (agent,) = spec["initContainers"]
    assert agent["name"] == contract.AGENT_CONTAINER_NAME
    assert agent["image"] == "registry.example/agent:1.2.3"
    assert agent["restartPolicy"] == "Always"
    assert agent["startupProbe"]["httpGet"] == {"path": "/healthz", "port": 9644}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9644}
    assert agent["securityContext"]["runAsNonRoot"] is True
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"cpu": "1", "memory": "512Mi"}}
    assert {"name": "durable-buffer", "mountPath": "/var/lib/durable-producer"} in agent[
        "volumeMounts"]
    assert env_of(spec["containers"][0]) == {
        "LOG_LEVEL": "info",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "DURABLE_PRODUCER_BOOTSTRAP": "127.0.0.1:9092",
    }
    assert spec["volumes"] == [
        {"name": "durable-buffer", "persistentVolumeClaim": {"claimName": CLAIM}}
    ]
    assert spec["terminationGracePeriodSeconds"] == agent_container.MINIMUM_GRACE_SECONDS
    assert spec["securityContext"] == {"fsGroup": agent_container.AGENT_USER_ID,
                                       "fsGroupChangePolicy": "OnRootMismatch"}
    annotations = result["metadata"]["annotations"]
    assert annotations[contract.BUFFER_VOLUME_ANNOTATION] == CLAIM
    assert json.loads(annotations[contract.INJECTED_ANNOTATION]) == {
        "producer": "orders", "agentImage": "registry.example/agent:1.2.3",
        "volume": CLAIM, "bootstrap": "127.0.0.1:9092",
        "pod": "shop/ReplicaSet/u-1/orders-7d9f8-*",
    }
    # Everything else untouched.
    assert result["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    assert spec["restartPolicy"] == "Always"
    assert pod_mutation.is_injected(result)


def test_the_pod_carries_the_claim_its_volume_was_handed_out_under() -> None:
    pod = deployment_pod()
    with_token = apply(pod, pod_mutation.mutation_patch(
        pod, "orders", make_spec(), CLAIM, AGENT_IMAGE, claim_token="t1"))
    without = apply(pod, patch_for(pod))

    assert with_token["metadata"]["annotations"][contract.CLAIM_TOKEN_ANNOTATION] == "t1"
    assert contract.CLAIM_TOKEN_ANNOTATION not in without["metadata"]["annotations"]  # a dry run


def test_grace_period_outlives_the_agent_drain_deadline() -> None:
    assert agent_container.MINIMUM_GRACE_SECONDS > agent_container.AGENT_DRAIN_TIMEOUT_SECONDS + 30


def test_sidecar_arguments_are_accepted_by_the_real_agent_cli() -> None:
    spec = make_spec(
        fsync={"policy": "always"},
        fullDisk={"policy": "block", "blockTimeoutMs": 2000},
        agent={"ports": {"kafka": 19092, "metrics": 19644}},
        kafka={
            "bootstrapServers": ["kafka:9093"],
            "tls": {"caSecretRef": {"name": "kafka-ca", "key": "ca.pem"},
                    "clientCertificateSecretName": "client-tls"},
            "sasl": {"mechanism": "SCRAM-SHA-512", "secretName": "kafka-user"},
        },
    )
    container = agent_container.agent_sidecar(spec, AGENT_IMAGE)

    args = build_parser({}).parse_args(container["args"])

    assert args.command == "run"
    assert args.kafka_bootstrap == "kafka:9093"
    assert args.listen == ("127.0.0.1", 19092)
    assert args.metrics_listen == ("::", 19644)  # every address, IPv6 and IPv4
    assert args.fsync == "always"
    assert args.full_disk_policy == "block"
    assert args.block_timeout == 2.0
    assert args.security_protocol == "SASL_SSL"
    assert str(args.ssl_ca_file) == "/etc/durable-producer/kafka-ca/ca.crt"
    assert str(args.sasl_password_file) == "/etc/durable-producer/kafka-sasl/password"
    volume_bytes = size_buffer(SizingInputs.from_spec(spec)).size_bytes
    # The WAL's share of the volume, as the agent's own budget computes it from its settings.
    agent_budget = volume_budget.wal_budget(
        volume_budget.usable_bytes(volume_bytes), args.segment_bytes, args.max_batch_bytes
    )
    assert args.max_buffer_bytes == agent_budget.wal_bytes > 0
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(mounts) == {"durable-buffer", "durable-kafka-ca", "durable-kafka-client-tls",
                           "durable-kafka-sasl"}


def test_secret_volumes_reference_the_spec_secrets_only() -> None:
    spec = make_spec(kafka={
        "bootstrapServers": ["kafka:9093"],
        "sasl": {"mechanism": "PLAIN", "secretName": "creds", "usernameKey": "user",
                 "passwordKey": "pass"},
    })
    pod = deployment_pod()

    result = apply(pod, patch_for(pod, spec))

    volumes = {v["name"]: v for v in result["spec"]["volumes"]}
    assert volumes["durable-kafka-sasl"]["secret"] == {
        "secretName": "creds",
        "items": [{"key": "user", "path": "username"}, {"key": "pass", "path": "password"}],
    }
    assert "durable-kafka-ca" not in volumes


def test_an_ordinary_init_container_is_kept_after_the_agent_with_every_field() -> None:
    pod = deployment_pod()
    migrate = {"name": "migrate", "image": "shop/migrate:1", "futureField": {"kept": True}}
    pod["spec"]["initContainers"] = [copy.deepcopy(migrate)]

    result = apply(pod, patch_for(pod))

    names = [c["name"] for c in result["spec"]["initContainers"]]
    assert names == [contract.AGENT_CONTAINER_NAME, "migrate"]
    assert result["spec"]["initContainers"][1] == migrate


def init_container(name: str, *, sidecar: bool = False) -> dict[str, Any]:
    return {"name": name, "image": f"{name}:1", **({"restartPolicy": "Always"} if sidecar else {})}


def init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers", [])]


def test_the_agent_comes_after_native_sidecars_and_before_the_init_containers_after_them(
) -> None:
    """D4 (b): native sidecars stop in reverse order. The agent must stop before a mesh proxy
    (its final drain needs the pod's network), so it starts after every sidecar already there;
    a mesh's own ordinary init container (iptables setup) stays before the proxy."""
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [
        init_container("mesh-init"), init_container("mesh-proxy", sidecar=True),
        init_container("migrate")]
    shipper = deployment_pod()
    shipper["spec"]["initContainers"] = [
        init_container("log-shipper", sidecar=True), init_container("setup"),
        init_container("mesh-proxy", sidecar=True), init_container("migrate")]

    assert init_names(apply(pod, patch_for(pod))) == [
        "mesh-init", "mesh-proxy", contract.AGENT_CONTAINER_NAME, "migrate"]
    assert init_names(apply(shipper, patch_for(shipper))) == [
        "log-shipper", "setup", "mesh-proxy", contract.AGENT_CONTAINER_NAME, "migrate"]


def test_a_copied_pod_with_its_agent_before_a_proxy_gets_the_agent_moved_after_it() -> None:
    """A copy of an admitted pod made by a version that put the agent first."""
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [init_container("mesh-proxy", sidecar=True)]
    once = apply(pod, patch_for(pod))
    (agent,) = [c for c in once["spec"]["initContainers"]
                if c["name"] == contract.AGENT_CONTAINER_NAME]
    once["spec"]["initContainers"] = [agent, init_container("mesh-proxy", sidecar=True)]
    once["metadata"]["namespace"] = "staging"  # not a reinvocation: mutated again

    again = apply(once, patch_for(once))

    assert init_names(again) == ["mesh-proxy", contract.AGENT_CONTAINER_NAME]
    assert patch_for(again) == []


ISTIO_EXCLUDE = "traffic.sidecar.istio.io/excludeInboundPorts"
LINKERD_SKIP = "config.linkerd.io/skip-inbound-ports"


def test_the_agents_metrics_port_is_excluded_from_mesh_inbound_interception() -> None:
    """D4 (c): kubelet's probes of the agent and the operator's scrape are plain HTTP from
    outside the mesh; Istio rewrites probes only for spec.containers, and under STRICT mTLS
    its proxy refuses them. Both meshes' exclusion lists get the agent's metrics port."""
    pod = deployment_pod()

    annotations = apply(pod, patch_for(pod))["metadata"]["annotations"]

    assert annotations[ISTIO_EXCLUDE] == "9644"
    assert annotations[LINKERD_SKIP] == "9644"


def test_the_metrics_port_is_merged_into_existing_exclusions_once() -> None:
    pod = deployment_pod()
    pod["metadata"]["annotations"] = {ISTIO_EXCLUDE: "8080, 15020,", LINKERD_SKIP: "9000-9999"}
    spec = make_spec(agent={"ports": {"metrics": 9700}})

    once = apply(pod, patch_for(pod, spec))

    assert once["metadata"]["annotations"][ISTIO_EXCLUDE] == "8080,15020,9700"
    assert once["metadata"]["annotations"][LINKERD_SKIP] == "9000-9999"  # covered already
    assert patch_for(once, spec) == []
    assert once["spec"]["initContainers"][0]["ports"][0]["containerPort"] == 9700


def test_app_bootstrap_env_is_overridden_not_duplicated() -> None:
    pod = deployment_pod()
    pod["spec"]["containers"][0]["env"].append(
        {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "kafka:9092"})

    result = apply(pod, patch_for(pod))

    env = result["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env].count("KAFKA_BOOTSTRAP_SERVERS") == 1
    assert env_of(result["spec"]["containers"][0])["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"


def test_agent_pull_secrets_are_added_once_and_the_pods_own_kept() -> None:
    pod = deployment_pod()
    pod["spec"]["imagePullSecrets"] = [{"name": "app-registry"}, {"name": "shared"}]
    agent_image = AgentImage(image="registry.example/agent:1", pull_secrets=("shared", "agents"))

    result = apply(pod, pod_mutation.mutation_patch(pod, "orders", make_spec(), CLAIM,
                                                    agent_image))

    assert result["spec"]["imagePullSecrets"] == [
        {"name": "app-registry"}, {"name": "shared"}, {"name": "agents"}]
    assert pod_mutation.mutation_patch(result, "orders", make_spec(), CLAIM, agent_image) == []


def test_without_agent_pull_secrets_the_pod_gets_none() -> None:
    result = apply(deployment_pod(), patch_for(deployment_pod()))

    assert "imagePullSecrets" not in result["spec"]


def test_longer_grace_period_and_fs_group_are_kept() -> None:
    pod = deployment_pod()
    pod["spec"]["terminationGracePeriodSeconds"] = 600
    pod["spec"]["securityContext"] = {"fsGroup": 2000, "runAsUser": 1000}

    result = apply(pod, patch_for(pod))

    assert result["spec"]["terminationGracePeriodSeconds"] == 600
    assert result["spec"]["securityContext"] == {"fsGroup": 2000, "runAsUser": 1000}


def test_second_pass_changes_nothing() -> None:
    pod = deployment_pod()
    once = apply(pod, patch_for(pod))

    assert patch_for(once) == []
    assert pod_mutation.claimed_volume(once) == CLAIM


def test_reinvocation_after_another_webhook_added_a_container() -> None:
    pod = deployment_pod()
    once = apply(pod, patch_for(pod))
    changed_by_other = copy.deepcopy(once)
    changed_by_other["spec"]["containers"].append({"name": "mesh-proxy", "image": "proxy:1"})

    ops = patch_for(changed_by_other, claim=pod_mutation.claimed_volume(changed_by_other) or "")
    result = apply(changed_by_other, ops)

    assert [op["path"] for op in ops] == ["/spec/containers"]
    assert env_of(result["spec"]["containers"][1])["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert [c["name"] for c in result["spec"]["initContainers"]] == ["durable-agent"]
    assert len(result["spec"]["volumes"]) == 1


def test_a_reinvocation_leaves_what_others_changed_on_the_agent() -> None:
    """An image mirror rewrote the agent's image and LimitRanger (run again before a
    reinvocation) set defaults: our second pass reverts neither (D6)."""
    pod = deployment_pod()
    once = apply(pod, patch_for(pod))
    changed = copy.deepcopy(once)
    agent = changed["spec"]["initContainers"][0]
    agent["image"] = "mirror.internal/agent:1.2.3"
    agent["resources"]["limits"]["ephemeral-storage"] = "1Gi"
    agent["volumeMounts"].append({"name": "kube-api-access", "mountPath": "/var/run/x"})

    assert pod_mutation.already_mutated(changed)
    assert pod_mutation.reinvocation_patch(changed) == []


def test_a_reinvocation_gives_the_bootstrap_env_only_to_containers_added_since() -> None:
    pod = deployment_pod()
    once = apply(pod, patch_for(pod))
    changed = copy.deepcopy(once)
    changed["spec"]["initContainers"][0]["image"] = "mirror.internal/agent:1.2.3"
    changed["spec"]["containers"][0]["env"].append({"name": "EXTRA", "value": "1"})
    changed["spec"]["containers"].append({"name": "mesh-proxy", "image": "proxy:1"})

    result = apply(changed, pod_mutation.reinvocation_patch(changed))

    assert result["spec"]["containers"][0] == changed["spec"]["containers"][0]
    assert env_of(result["spec"]["containers"][1])["KAFKA_BOOTSTRAP_SERVERS"] == (
        "127.0.0.1:9092")
    assert result["spec"]["initContainers"] == changed["spec"]["initContainers"]


def test_a_reinvocation_moves_the_agent_after_a_native_proxy_a_later_webhook_appended(
) -> None:
    """D4 (b): a mesh webhook called after ours appended its proxy as a native sidecar behind
    the agent; the agent is moved after it as it is (another webhook's edit of it kept)."""
    once = apply(deployment_pod(), patch_for(deployment_pod()))
    changed = copy.deepcopy(once)
    changed["spec"]["initContainers"][0]["image"] = "mirror.internal/agent:1.2.3"
    changed["spec"]["initContainers"] += [init_container("mesh-init"),
                                          init_container("mesh-proxy", sidecar=True)]

    ops = pod_mutation.reinvocation_patch(changed)
    result = apply(changed, ops)

    assert [op["path"] for op in ops] == ["/spec/initContainers"]
    assert init_names(result) == ["mesh-init", "mesh-proxy", contract.AGENT_CONTAINER_NAME]
    assert result["spec"]["initContainers"][2] == changed["spec"]["initContainers"][0]
    assert pod_mutation.already_mutated(result)
    assert pod_mutation.reinvocation_patch(result) == []


def test_a_reinvocation_after_istio_put_its_native_proxy_first_changes_nothing() -> None:
    """Istio's native-sidecar mode moves its own init containers to the front when its webhook
    runs after ours: the agent is then already after the proxy."""
    once = apply(deployment_pod(), patch_for(deployment_pod()))
    changed = copy.deepcopy(once)
    changed["spec"]["initContainers"][:0] = [init_container("istio-init"),
                                             init_container("istio-proxy", sidecar=True)]

    assert pod_mutation.reinvocation_patch(changed) == []


def test_a_pod_without_our_annotation_is_not_taken_for_a_reinvocation() -> None:
    pod = deployment_pod()
    once = apply(pod, patch_for(pod))
    del once["metadata"]["annotations"][contract.INJECTED_ANNOTATION]

    assert not pod_mutation.already_mutated(once)
    assert not pod_mutation.already_mutated(deployment_pod())


def test_a_pod_made_from_an_admitted_pods_manifest_is_not_taken_for_a_reinvocation() -> None:
    """A copy of an admitted pod (its manifest exported and created again under another name,
    ``kubectl debug --copy-to``, or in another namespace) carries the first pod's annotation,
    agent and claim: it is mutated again, with the claim it is given (D6)."""
    once = apply(deployment_pod(), patch_for(deployment_pod()))
    renamed = copy.deepcopy(once)
    renamed["metadata"] = {**renamed["metadata"], "name": "orders-debug"}
    del renamed["metadata"]["generateName"], renamed["metadata"]["ownerReferences"]
    elsewhere = copy.deepcopy(once)
    elsewhere["metadata"]["namespace"] = "staging"

    assert pod_mutation.already_mutated(once)
    for copied in (renamed, elsewhere):
        assert not pod_mutation.already_mutated(copied)
        again = apply(copied, patch_for(copied, claim="orders-buffer-2"))
        assert pod_mutation.claimed_volume(again) == "orders-buffer-2"
        assert [c["name"] for c in again["spec"]["initContainers"]] == ["durable-agent"]
        recorded = json.loads(again["metadata"]["annotations"][contract.INJECTED_ANNOTATION])
        assert recorded["volume"] == "orders-buffer-2"
        assert pod_mutation.already_mutated(again)


def test_an_annotation_without_the_pod_it_was_made_for_is_not_a_reinvocation() -> None:
    """Pods admitted by a version that did not record the pod: a copy of one is mutated."""
    once = apply(deployment_pod(), patch_for(deployment_pod()))
    summary = json.loads(once["metadata"]["annotations"][contract.INJECTED_ANNOTATION])
    del summary["pod"]
    once["metadata"]["annotations"][contract.INJECTED_ANNOTATION] = json.dumps(summary)

    assert not pod_mutation.already_mutated(once)


def test_the_agent_gets_cpu_and_memory_limits_by_default() -> None:
    """A ResourceQuota on limits.cpu/limits.memory refuses a container without them, and
    LimitRange defaults never reach a container a webhook adds (D6)."""
    assert agent_container.agent_resources(make_spec()) == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"}}


def test_a_missing_default_limit_is_never_below_the_request() -> None:
    spec = make_spec(agent={"resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                          "limits": {"cpu": "3"}}})

    assert agent_container.agent_resources(spec)["limits"] == {"cpu": "3", "memory": "1Gi"}


def test_limits_the_spec_sets_are_kept() -> None:
    spec = make_spec(agent={"resources": {"limits": {"cpu": "250m", "memory": "256Mi"}}})

    assert agent_container.agent_resources(spec)["limits"] == {"cpu": "250m", "memory": "256Mi"}


def test_pod_without_spec_or_annotations_gets_them() -> None:
    pod = {"metadata": {"labels": {contract.PRODUCER_LABEL: "orders"}}}

    result = apply(pod, patch_for(pod))

    assert result["spec"]["containers"] == []
    assert pod_mutation.is_injected(result)


@pytest.mark.parametrize(("tls", "sasl", "expected"), [
    (False, False, "PLAINTEXT"), (True, False, "SSL"), (False, True, "SASL_PLAINTEXT"),
    (True, True, "SASL_SSL"),
])
def test_security_protocol(tls: bool, sasl: bool, expected: str) -> None:
    kafka: dict[str, Any] = {"bootstrapServers": ["k:9092"]}
    if tls:
        kafka["tls"] = {}
    if sasl:
        kafka["sasl"] = {"mechanism": "PLAIN", "secretName": "s"}

    assert agent_container.security_protocol(make_spec(kafka=kafka)) == expected


@pytest.mark.parametrize("segment_mib", [1, 2, 64, 1024])
def test_the_agent_takes_the_settings_of_every_segment_size(segment_mib: int) -> None:
    """With 1 MiB segments the agent took batches of up to Kafka's 1,048,588 bytes and its
    WAL then refused those above 1,048,576 (MESSAGE_TOO_LARGE); now the agent refuses such
    settings, so the operator gives it the one segment as its largest batch."""
    spec = make_spec(agent={"segmentSizeMib": segment_mib})
    run = settings_from(build_parser({}).parse_args(agent_container.agent_run_args(spec)))
    largest = min(contract.DEFAULT_MAX_BATCH_BYTES, segment_mib << 20)
    assert run.ingest.max_batch_bytes == largest <= run.wal.max_frame_bytes
    drain = build_parser({}).parse_args(agent_container.agent_drain_args(spec, 300))
    settings_from(drain)


def test_drain_arguments_are_accepted_by_the_real_agent_cli() -> None:
    args = build_parser({}).parse_args(agent_container.agent_drain_args(make_spec(), 300))

    assert args.command == "drain"
    assert args.timeout == 300.0
    assert args.kafka_bootstrap == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    always = make_spec(fsync={"policy": "always"})
    drain = build_parser({}).parse_args(agent_container.agent_drain_args(always, 300))
    assert drain.fsync == "always"  # recovery reads the tail as the agent wrote it


# Property tests: arbitrary pods (with fields we know nothing about) mutate idempotently.

names = st.text(alphabet="abcdefghij-", min_size=1, max_size=6)
scalars = st.one_of(st.integers(-5, 5), st.booleans(), st.text(max_size=4), st.none())
unknown_fields = st.dictionaries(st.sampled_from(["x-extra", "restartPolicy", "ports"]),
                                 st.one_of(scalars, st.just("Always")), max_size=2)
env_lists = st.lists(
    st.fixed_dictionaries({"name": st.sampled_from(
        ["A", "B", "KAFKA_BOOTSTRAP_SERVERS", "DURABLE_PRODUCER_BOOTSTRAP"]),
        "value": st.text(max_size=4)}),
    max_size=3)


@st.composite
def containers(draw: st.DrawFn) -> dict[str, Any]:
    container: dict[str, Any] = {"name": draw(names), "image": "img"}
    container.update(draw(unknown_fields))
    if draw(st.booleans()):
        container["env"] = draw(env_lists)
    return container


def unique_by_name(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for item in items:
        seen.setdefault(item["name"], item)
    return list(seen.values())


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": unique_by_name(draw(st.lists(containers(), max_size=3)))}
    if draw(st.booleans()):
        spec["initContainers"] = unique_by_name(draw(st.lists(containers(), max_size=2)))
    if draw(st.booleans()):
        spec["volumes"] = unique_by_name(draw(st.lists(
            st.fixed_dictionaries({"name": names, "emptyDir": st.just({})}), max_size=2)))
    if draw(st.booleans()):
        spec["terminationGracePeriodSeconds"] = draw(st.integers(0, 200))
    if draw(st.booleans()):
        spec["securityContext"] = draw(st.dictionaries(
            st.sampled_from(["fsGroup", "runAsUser"]), st.integers(0, 5000), max_size=2))
    metadata: dict[str, Any] = {"labels": {contract.PRODUCER_LABEL: "orders"}}
    if draw(st.booleans()):
        metadata["annotations"] = draw(st.dictionaries(
            st.sampled_from(["a", "b/c", "d~e", ISTIO_EXCLUDE]),
            st.one_of(st.text(max_size=3), st.just("15020,9644"), st.just(" 80 , ")),
            max_size=2))
    return {"metadata": metadata, "spec": spec, **draw(st.dictionaries(
        st.sampled_from(["status", "x-top"]), scalars, max_size=1))}


@settings(max_examples=150, deadline=None)
@given(pods())
def test_patch_gives_the_desired_pod_and_applying_twice_equals_once(pod: dict[str, Any]) -> None:
    spec = make_spec()
    ops = patch_for(pod, spec)
    once = apply(pod, ops)
    twice = apply(once, patch_for(once, spec))

    assert once == pod_mutation.mutated_pod(pod, "orders", spec, CLAIM, AGENT_IMAGE)
    assert twice == once
    assert patch_for(once, spec) == []
    for key in ("initContainers", "containers", "volumes"):
        item_names = [item["name"] for item in once["spec"].get(key, [])]
        assert len(item_names) == len(set(item_names)), key
    # The agent right after the last other native sidecar; the others in their order.
    inits = once["spec"]["initContainers"]
    agent_at = init_names(once).index(contract.AGENT_CONTAINER_NAME)
    sidecars_at = [i for i, c in enumerate(inits)
                   if c.get("restartPolicy") == "Always" and i != agent_at]
    assert agent_at == 1 + max(sidecars_at, default=-1)
    assert [c for c in inits if c["name"] != contract.AGENT_CONTAINER_NAME] == [
        c for c in pod["spec"].get("initContainers", [])
        if c["name"] != contract.AGENT_CONTAINER_NAME]
    # No field of the input is lost: every original container is still there, only env added.
    for original in pod["spec"]["containers"]:
        (kept,) = [c for c in once["spec"]["containers"] if c["name"] == original["name"]]
        assert {k: v for k, v in kept.items() if k != "env"} == {
            k: v for k, v in original.items() if k != "env"}
    assert {k: v for k, v in once.items() if k not in ("metadata", "spec")} == {
        k: v for k, v in pod.items() if k not in ("metadata", "spec")}
