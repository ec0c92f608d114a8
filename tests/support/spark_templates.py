"""An executor pod template like the one the operator renders, for the Spark helpers' tests.

Written out as YAML text on purpose (not rendered from the operator's code), so the tests
check the Spark side against the documented shape.
"""

from __future__ import annotations

# The webhook adds the agent as a native sidecar; templates fetched before admission have none.
AGENT_SIDECAR = """
    - name: durable-agent
      image: durable-agent:test
      restartPolicy: Always"""


def executor_template(grace_seconds: int = 120, *, with_agent: bool = False) -> str:
    """The executor template of DurableProducer ``orders``, with its drain grace period."""
    init_containers = AGENT_SIDECAR if with_agent else " []"
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  labels:
    durable.dev/producer: orders
spec:
  terminationGracePeriodSeconds: {grace_seconds}
  initContainers:{init_containers}
  containers:
    - name: spark-kubernetes-executor
      env:
        - name: DURABLE_PRODUCER_BOOTSTRAP
          value: 127.0.0.1:9092
"""
