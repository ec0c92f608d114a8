"""What the operator was installed with, as plain values: the agent image it injects and the
volume pool's timings (the chart's ``agent.image`` and ``volumePool.*``).

Pure values for ``decide/``; ``settings.py`` reads them from the environment at startup
(``agent_image_from_environ``, ``pool_policy_from_environ``).
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_producer.operator.model.model import DEFAULT_AGENT_IMAGE, AgentSidecarSettings

DEFAULT_PULL_POLICY = "IfNotPresent"


@dataclass(frozen=True)
class PoolPolicy:
    """Timings of the volume pool, in seconds (see volume_pool.py)."""

    claim_grace_seconds: float = 120.0
    drain_grace_seconds: float = 60.0
    idle_ttl_seconds: float = 900.0
    drain_timeout_seconds: int = 600
    pending_volume_seconds: float = 300.0
    agent_start_grace_seconds: float = 120.0
    """How long an opted-in pod may take to get its agent running (image pull, volume attach
    and mount) before Degraded names it (agent_start.py)."""
    drain_retry_max_seconds: float = 3600.0
    """After each failed drain the next waits twice as long as the last (from the drain
    grace), at most this long: a long Kafka outage does not keep every free volume Draining."""


@dataclass(frozen=True)
class AgentImage:
    """The agent image the operator was installed with (Helm's ``agent.image``).

    Used for a DurableProducer that does not set ``spec.agent.image``/``imagePullPolicy``.
    """

    image: str = DEFAULT_AGENT_IMAGE
    pull_policy: str = DEFAULT_PULL_POLICY
    # Secrets (names, in the pod's namespace) for pulling the agent image (agent.imagePullSecrets).
    pull_secrets: tuple[str, ...] = ()

    def image_for(self, agent: AgentSidecarSettings) -> str:
        """The spec's image, else the operator's."""
        return agent.image or self.image

    def pull_policy_for(self, agent: AgentSidecarSettings) -> str:
        """The spec's pull policy, else the operator's."""
        return agent.image_pull_policy or self.pull_policy
