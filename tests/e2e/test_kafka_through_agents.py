"""End to end on kind: applications and Spark produce through injected agents to Kafka.

Every assertion counts records in the Kafka running in the cluster (read back with its own
console consumer): a value "<pod>:<n>" for each record a producer pod had acknowledged.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from e2e.kind_support import (
    SPARK_IMAGE,
    WORKLOAD_NAMESPACE,
    KindCluster,
    load_manifest,
    producer_manifests,
    wait_until,
)

pytestmark = pytest.mark.e2e

AGENT_CONTAINER = "durable-agent"
DONE_LINE = re.compile(r"^DONE acknowledged=(\d+) failed=(\d+)", re.M)
PROGRESS_LINE = re.compile(r"^PROGRESS acknowledged=(\d+)", re.M)
START_FILE = "/signals/start"


def running_pods(cluster: KindCluster, app: str) -> list[str]:
    return [
        pod["metadata"]["name"]
        for pod in cluster.pods(WORKLOAD_NAMESPACE, f"app={app}")
        if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
    ]


def acknowledged(cluster: KindCluster, pod: str) -> tuple[int, bool]:
    """(records the agent acknowledged to the producer, whether the producer finished)."""
    log = cluster.logs(WORKLOAD_NAMESPACE, pod, "producer")
    done = DONE_LINE.search(log)
    if done:
        assert done.group(2) == "0", f"{pod} had failed deliveries:\n{log[-2000:]}"
        return int(done.group(1)), True
    progress = PROGRESS_LINE.findall(log)
    return (int(progress[-1]) if progress else 0), False


def wait_for_producers_done(cluster: KindCluster, pods: list[str], records: int,
                            timeout: float = 300) -> None:
    wait_until(lambda: all(acknowledged(cluster, pod) == (records, True) for pod in pods),
               timeout=timeout, what=f"{pods} to have {records} records acknowledged")


def missing_values(cluster: KindCluster, topic: str, expected: set[str]) -> set[str]:
    return expected - set(cluster.topic_values(topic))


def wait_for_values_in_kafka(cluster: KindCluster, topic: str, expected: set[str],
                             timeout: float = 300) -> None:
    state: dict[str, set[str]] = {"missing": expected}

    def delivered() -> bool:
        state["missing"] = missing_values(cluster, topic, expected)
        return not state["missing"]

    try:
        wait_until(delivered, timeout=timeout, interval=10, what=f"all records in {topic}")
    except AssertionError as error:
        sample = sorted(state["missing"])[:5]
        raise AssertionError(f"{error}: {len(state['missing'])} missing, e.g. {sample}") from None


def expected_values(pod: str, records: int) -> set[str]:
    return {f"{pod}:{n}" for n in range(records)}


def test_deployment_produces_through_injected_agents(kind_cluster: KindCluster) -> None:
    topic, records = "e2e-basic", 2000
    kind_cluster.create_topic(topic)
    kind_cluster.apply(producer_manifests("basic", topic=topic, records=records, replicas=2))
    wait_until(lambda: len(running_pods(kind_cluster, "basic")) == 2, timeout=240,
               what="2 producer pods running")
    pods = running_pods(kind_cluster, "basic")
    for pod_name in pods:
        pod = kind_cluster.get_json("pod", pod_name, "--namespace", WORKLOAD_NAMESPACE)
        sidecars = [c["name"] for c in pod["spec"].get("initContainers", [])]
        assert AGENT_CONTAINER in sidecars, f"{pod_name} has no agent: {sidecars}"

    wait_for_producers_done(kind_cluster, pods, records)

    expected = set().union(*(expected_values(pod, records) for pod in pods))
    wait_for_values_in_kafka(kind_cluster, topic, expected)
    counts = Counter(kind_cluster.topic_values(topic))
    duplicated = {value: n for value, n in counts.items() if n > 1 and value in expected}
    assert not duplicated, f"records stored twice without any failure: {list(duplicated)[:5]}"


def test_broker_outage_is_ridden_out(kind_cluster: KindCluster) -> None:
    topic, records = "e2e-outage", 12000
    kind_cluster.create_topic(topic)
    kind_cluster.apply(producer_manifests("outage", topic=topic, records=records, rate=150))
    wait_until(lambda: len(running_pods(kind_cluster, "outage")) == 1, timeout=240,
               what="the producer pod running")
    (pod,) = running_pods(kind_cluster, "outage")
    wait_until(lambda: acknowledged(kind_cluster, pod)[0] > 500, timeout=120,
               what="the producer to get going before the outage")

    kind_cluster.scale_kafka(0)
    try:
        before, _ = acknowledged(kind_cluster, pod)
        assert before < records - 1500, "the producer finished before Kafka went down"
        wait_until(lambda: acknowledged(kind_cluster, pod)[0] >= before + 1500, timeout=120,
                   what="the agent to keep acknowledging while Kafka is down")
    finally:
        kind_cluster.scale_kafka(1)

    wait_for_producers_done(kind_cluster, [pod], records)
    wait_for_values_in_kafka(kind_cluster, topic, expected_values(pod, records))


def test_pod_deleted_mid_backlog_is_delivered_by_the_next_owner(
    kind_cluster: KindCluster,
) -> None:
    topic, records = "e2e-deleted", 3000
    kind_cluster.create_topic(topic)
    kind_cluster.apply(producer_manifests("deleted", topic=topic, records=records,
                                          start_file=START_FILE))
    wait_until(lambda: len(running_pods(kind_cluster, "deleted")) == 1, timeout=240,
               what="the producer pod running")
    (pod,) = running_pods(kind_cluster, "deleted")
    wait_until(lambda: "WARM" in kind_cluster.logs(WORKLOAD_NAMESPACE, pod, "producer"),
               timeout=120, what="the agent to learn the topic's metadata from Kafka")

    kind_cluster.scale_kafka(0)
    try:
        kind_cluster.kubectl("exec", "--namespace", WORKLOAD_NAMESPACE, pod, "--container",
                             "producer", "--", "touch", START_FILE)
        # Everything the producer writes now is only on the pod's buffer volume.
        wait_for_producers_done(kind_cluster, [pod], records)
        kind_cluster.kubectl("delete", "pod", pod, "--namespace", WORKLOAD_NAMESPACE,
                             "--wait=true", timeout=180)
    finally:
        kind_cluster.scale_kafka(1)

    # The volume outlives the pod: the Deployment's next pod replays it, or a drain Job does.
    wait_for_values_in_kafka(kind_cluster, topic, expected_values(pod, records), timeout=600)


def test_spark_job_writes_through_agents(kind_cluster: KindCluster) -> None:
    topic, records = "e2e-spark", 20000
    kind_cluster.create_topic(topic, partitions=4)
    manifests = load_manifest("spark.yaml")
    driver = next(obj for obj in manifests if obj["kind"] == "Pod")
    assert driver["spec"]["containers"][0]["image"] == SPARK_IMAGE
    kind_cluster.apply(manifests)

    def driver_finished() -> bool:
        pod = kind_cluster.get_json("pod", "e2e-spark-driver", "--namespace",
                                    WORKLOAD_NAMESPACE)
        return pod["status"].get("phase") in ("Succeeded", "Failed")

    wait_until(driver_finished, timeout=900, interval=10, what="the Spark driver to finish")
    log = kind_cluster.logs(WORKLOAD_NAMESPACE, "e2e-spark-driver", "driver")
    assert f"SPARK JOB DONE rows={records}" in log, log[-4000:]

    wait_for_values_in_kafka(kind_cluster, topic, {f"spark:{n}" for n in range(records)},
                             timeout=600)
