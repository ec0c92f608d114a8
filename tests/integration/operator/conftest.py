"""Fixtures for the operator integration tests (implemented in operator_harness.py)."""

from integration.operator.operator_harness import kubernetes_api, operator_process, start_operator

__all__ = ["kubernetes_api", "operator_process", "start_operator"]
