"""Fixtures for the operator integration tests: the real API server (kube_harness.py) and, for
the one test that needs what only an emulator gives, kmock (operator_harness.py)."""

from support.kube_harness import chart_operators, kube_api, start_chart_operator
from support.operator_harness import kubernetes_api

__all__ = ["chart_operators", "kube_api", "kubernetes_api", "start_chart_operator"]
