"""The Spark templates handler's error mapping: missing RBAC is permanent and says the fix."""

from __future__ import annotations

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.operator.act import spark_actions


def test_forbidden_is_permanent_and_names_the_chart_flag() -> None:
    failure = spark_actions.api_failure(
        ApiException(status=403, reason="Forbidden"), "create", "data", "orders-spark-templates"
    )

    assert isinstance(failure, kopf.PermanentError)
    assert "may not create ConfigMap data/orders-spark-templates" in str(failure)
    assert "rbac.features.sparkPodTemplates" in str(failure)


def test_other_api_errors_are_retried() -> None:
    failure = spark_actions.api_failure(
        ApiException(status=500, reason="Internal Server Error"), "patch", "data", "cm"
    )

    assert isinstance(failure, kopf.TemporaryError)
    assert failure.delay == spark_actions.RETRY_DELAY_SECONDS
    assert "HTTP 500" in str(failure)
