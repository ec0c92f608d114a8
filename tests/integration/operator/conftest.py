"""Fixtures for the operator integration tests: the real API server (kube_harness.py) and,
where a test needs what only an emulator gives, kmock (operator_harness.py)."""

from integration.operator.kube_harness import chart_operators, kube_api, start_chart_operator
from integration.operator.operator_harness import kubernetes_api, operator_process, start_operator

__all__ = ["chart_operators", "kube_api", "kubernetes_api", "operator_process",
           "start_chart_operator", "start_operator"]
