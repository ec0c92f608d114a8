"""Three Apache Kafka nodes (each broker and controller, three voters in one KRaft quorum) for
the tests of what only replication shows: leader failover, ISR shrink, NOT_ENOUGH_REPLICAS,
rolling restarts.

Every topic is created with replication factor 3 and ``min.insync.replicas=2`` unless it says
otherwise. Ready = the admin client sees every broker. Nodes are numbered 0, 1, 2 (``node(i)``
is the one with ``node.id`` i); each can be killed (kill -9), stopped (controlled shutdown),
suspended (SIGSTOP) and started again on its own data and ports, and ``heal()`` brings the
whole cluster back: every node running and every partition's ISR full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

from .kafka_node import JVM_OPTIONS, KafkaNode, new_cluster_id, quiet_admin
from .ports import LOOPBACK, free_port
from .process import Managed, poll_until

CLUSTER_SIZE = 3
CLUSTER_PROPERTIES: Mapping[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "auto.create.topics.enable": "false",
    # a follower that stops fetching leaves the ISR after 10 s instead of 30 s
    "replica.lag.time.max.ms": "10000",
}
"""What makes the three nodes a replicated cluster (and how fast a stalled follower is noticed)."""
READY_TIMEOUT_SECONDS = 120.0
HEAL_TIMEOUT_SECONDS = 120.0
METADATA_TIMEOUT_SECONDS = 5.0
METADATA_AGREEMENT_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    """The leader's node id; -1 while the partition has none."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def isr_full(self) -> bool:
        return self.leader >= 0 and set(self.isr) == set(self.replicas)


class KafkaCluster(Managed):
    """Three combined-mode Kafka nodes; use as a context manager. See the module docstring."""

    def __init__(
        self,
        size: int = CLUSTER_SIZE,
        *,
        properties: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = JVM_OPTIONS,
    ) -> None:
        cluster_id = new_cluster_id()
        controller_ports = {node_id: free_port() for node_id in range(size)}
        voters = [(node_id, f"{LOOPBACK}:{port}") for node_id, port in controller_ports.items()]
        settings = {**CLUSTER_PROPERTIES, **(properties or {})}
        self.nodes: list[KafkaNode] = []
        for node_id in range(size):
            node = KafkaNode(
                node_id,
                controller_port=controller_ports[node_id],
                voters=voters,
                cluster_id=cluster_id,
                properties=settings,
                jvm_options=jvm_options,
            )
            self.nodes.append(node)

    # -- addresses and state -----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's client listener, comma-separated."""
        return ",".join(node.direct_address for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def live_nodes(self) -> list[KafkaNode]:
        """The nodes running and not suspended (the ones that answer)."""
        return [node for node in self.nodes if node.running and not node.suspended]

    def broker_ids(self) -> set[int]:
        """The brokers every live node lists in its metadata now (registered and unfenced).

        Each node answers from its own metadata cache, and a node just resumed or restarted
        answers from a stale one for a moment: asking them all is what makes a wait end on
        the cluster's state rather than on one node's memory of it."""
        listed: set[int] | None = None
        for node in self.live_nodes():
            metadata = quiet_admin(node.direct_address).list_topics(
                timeout=METADATA_TIMEOUT_SECONDS
            )
            brokers = set(metadata.brokers)
            listed = brokers if listed is None else listed & brokers
        return listed or set()

    def partitions(self, topic: str) -> dict[int, PartitionState]:
        """Leader, replicas and ISR of every partition of ``topic``, once every live node
        reports the same (``LookupError`` if they do not agree within a few seconds)."""
        views: list[dict[int, PartitionState] | str] = []

        def agreed() -> bool:
            views.clear()
            for node in self.live_nodes():
                try:
                    views.append(_partitions_seen_by(node, topic))
                except Exception as error:  # a node restarting, a topic being created
                    views.append(f"node {node.node_id}: {error}")
            first = views[0] if views else None
            return isinstance(first, dict) and all(view == first for view in views)

        if not poll_until(agreed, timeout=METADATA_AGREEMENT_SECONDS, interval=0.2):
            raise LookupError(f"the live Kafka nodes do not agree on {topic}: {views}")
        first = views[0]
        assert isinstance(first, dict)
        return first

    def partition(self, topic: str, partition: int = 0) -> PartitionState:
        return self.partitions(topic)[partition]

    def leader_of(self, topic: str, partition: int = 0) -> KafkaNode:
        """The node that leads ``topic``/``partition`` now (``LookupError`` if none does)."""
        leader = self.partition(topic, partition).leader
        if leader < 0:
            raise LookupError(f"{topic}/{partition} has no leader")
        return self.node(leader)

    def topics(self) -> list[str]:
        """The cluster's topics, internal ones (``__consumer_offsets``...) included."""
        live = ",".join(node.direct_address for node in self.live_nodes())
        metadata = quiet_admin(live).list_topics(timeout=METADATA_TIMEOUT_SECONDS)
        return sorted(metadata.topics)

    # -- waiting ---------------------------------------------------------------------------

    def wait_for_brokers(
        self, node_ids: Iterable[int] | None = None, *, timeout: float = READY_TIMEOUT_SECONDS
    ) -> None:
        """Until metadata lists every broker of ``node_ids`` (default: all)."""
        wanted = set(range(len(self.nodes)) if node_ids is None else node_ids)

        def listed() -> bool:
            try:
                return wanted <= self.broker_ids()
            except Exception:
                return False

        if not poll_until(listed, timeout=timeout, interval=0.25):
            raise TimeoutError(
                f"Kafka brokers {sorted(wanted)} not all listed after {timeout}s"
                f" (listed: {sorted(self._listed_or_empty())})"
            )

    def wait_for_full_isr(
        self, topics: Iterable[str] | None = None, *, timeout: float = HEAL_TIMEOUT_SECONDS
    ) -> None:
        """Until every partition of ``topics`` (default: every topic) has a leader and all its
        replicas in sync."""
        names = list(self.topics() if topics is None else topics)
        lagging: list[str] = []

        def full() -> bool:
            lagging.clear()
            try:
                for topic in names:
                    for number, state in self.partitions(topic).items():
                        if not state.isr_full:
                            lagging.append(f"{topic}/{number} {state}")
            except Exception as error:
                lagging.append(str(error))
            return not lagging

        if not poll_until(full, timeout=timeout, interval=0.25):
            raise TimeoutError(f"ISR not full after {timeout}s: {lagging[:5]}")

    def _listed_or_empty(self) -> set[int]:
        try:
            return self.broker_ids()
        except Exception:
            return set()

    # -- faults ----------------------------------------------------------------------------

    def kill(self, node_id: int) -> None:
        """kill -9 of one node."""
        self.node(node_id).kill()

    def stop(self, node_id: int, timeout: float = 60.0) -> None:
        """Controlled shutdown of one node (SIGTERM)."""
        self.node(node_id).stop(timeout)

    def start_node(self, node_id: int) -> None:
        """Start a killed or stopped node again on its data; return once the cluster lists it."""
        self.node(node_id).start()
        self.wait_for_brokers()

    def suspend(self, node_id: int) -> None:
        self.node(node_id).suspend()

    def resume(self, node_id: int) -> None:
        self.node(node_id).resume()

    def rolling_restart(
        self, topics: Iterable[str] = (), *, timeout: float = HEAL_TIMEOUT_SECONDS
    ) -> None:
        """Restart every node in turn, as an upgrade does: controlled shutdown, start, wait until
        the cluster lists it and the ISR of ``topics`` is full again, then the next node."""
        names = list(topics)
        for node in self.nodes:
            node.stop()
            node.start()
            self.wait_for_brokers(timeout=timeout)
            self.wait_for_full_isr(names, timeout=timeout)

    def heal(self, timeout: float = HEAL_TIMEOUT_SECONDS) -> None:
        """Resume suspended nodes, start stopped ones, and wait until every broker is listed and
        every partition's ISR is full: what a test that hurt the cluster leaves behind."""
        for node in self.nodes:
            if node.suspended:
                node.resume()
        down = [node for node in self.nodes if not node.running]
        for node in down:
            node.launch()
        for node in down:
            node.wait_ready(timeout)
        self.wait_for_brokers(timeout=timeout)
        self.wait_for_full_isr(timeout=timeout)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Format and launch every node (the voters only get ready together), then wait until
        the admin client sees every broker."""
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_ready()
            self.wait_for_brokers()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _partitions_seen_by(node: KafkaNode, topic: str) -> dict[int, PartitionState]:
    """``topic``'s partitions as ``node`` reports them (a fresh client with only that node to
    bootstrap from sends its first request there)."""
    metadata = quiet_admin(node.direct_address).list_topics(
        topic, timeout=METADATA_TIMEOUT_SECONDS
    )
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        raise LookupError(f"topic {topic}: {None if found is None else found.error}")
    return {
        number: PartitionState(
            leader=partition.leader,
            replicas=tuple(partition.replicas),
            isr=tuple(sorted(partition.isrs)),
        )
        for number, partition in found.partitions.items()
    }
