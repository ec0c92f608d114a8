"""The operator's /metrics and /readyz (metrics.py, http_endpoint.py) and what feeds them."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable_producer.local.ports import free_port
from durable_producer.operator import handlers, http_endpoint, metrics
from durable_producer.operator.act import admission
from durable_producer.operator.decide import volume_pool


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture()
def readiness() -> Iterator[http_endpoint.Readiness]:
    http_endpoint.READINESS.reset()
    yield http_endpoint.READINESS
    http_endpoint.READINESS.reset()


@pytest.fixture()
def endpoint() -> Iterator[str]:
    server = http_endpoint.start("127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_handler_runs_are_counted_by_result() -> None:
    before = {result: sample("durable_operator_handler_runs_total", handler="volume-pool",
                             result=result) for result in ("success", "retry", "error")}

    with handlers.counted("volume-pool"):
        pass
    with pytest.raises(kopf.TemporaryError), handlers.counted("volume-pool"):
        raise kopf.TemporaryError("waiting for drains")
    with pytest.raises(RuntimeError), handlers.counted("volume-pool"):
        raise RuntimeError("bug")

    for result in ("success", "retry", "error"):
        assert sample("durable_operator_handler_runs_total", handler="volume-pool",
                      result=result) == before[result] + 1


@pytest.mark.parametrize(("answer", "error", "result"), [
    (admission.AdmissionAnswer(ops=[{"op": "add", "path": "/x", "value": 1}]), None, "mutated"),
    (admission.AdmissionAnswer(), None, "admitted"),
    (None, kopf.AdmissionError("bad pod", code=400), "refused"),
    (None, kopf.AdmissionError("may not read", code=403), "failed"),
    (None, kopf.AdmissionError("conflicts", code=409), "failed"),
    (None, kopf.AdmissionError("too slow", code=504), "failed"),
    (None, RuntimeError("bug"), "failed"),
])  # fmt: skip
def test_admission_results(
    answer: admission.AdmissionAnswer | None, error: BaseException | None, result: str
) -> None:
    assert admission.answer_result(answer, error) == result


def test_an_opted_out_review_is_counted_and_timed(caplog: pytest.LogCaptureFixture) -> None:
    pod = {"metadata": {"name": "p", "namespace": "shop", "annotations": {
        "agent.durable.dev/inject": "false"}, "labels": {"durable.dev/producer": "orders"}}}
    before = sample("durable_operator_admission_requests_total", result="admitted")
    timed = sample("durable_operator_admission_duration_seconds_count", result="admitted")

    answer = admission.handle_admission(pod, operation="CREATE", dryrun=False,
                                        config=handlers.OperatorConfig(),
                                        logger=logging.getLogger("test"))

    assert answer.ops == []
    assert sample("durable_operator_admission_requests_total", result="admitted") == before + 1
    assert sample("durable_operator_admission_duration_seconds_count",
                  result="admitted") == timed + 1


def job(name: str, outcome: str) -> dict[str, Any]:
    condition = {"succeeded": "Complete", "failed": "Failed"}[outcome]
    return {"metadata": {"name": name},
            "status": {"conditions": [{"type": condition, "status": "True"}]}}


def test_drains_are_counted_from_the_jobs_a_pool_run_starts_and_collects() -> None:
    before = {r: sample("durable_operator_drains_total", result=r)
              for r in ("started", "succeeded", "failed")}
    plan = volume_pool.PoolPlan(jobs_to_create=["v1", "v2"], jobs_to_delete=["j1", "j2"])

    metrics.observe_pool_run(plan, [job("j1", "succeeded"), job("j2", "failed"),
                                    job("j3", "succeeded")])  # j3 is not collected this run

    assert sample("durable_operator_drains_total", result="started") == before["started"] + 2
    assert sample("durable_operator_drains_total", result="succeeded") == before["succeeded"] + 1
    assert sample("durable_operator_drains_total", result="failed") == before["failed"] + 1


def test_pool_figures_follow_the_status_and_go_when_stale() -> None:
    figures = metrics.PoolFigures()
    figures.observe("shop", "orders", {
        "volumes": {"inUse": 2, "claimed": 0, "free": 1, "draining": 1}, "outdatedAgents": 2})

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in figures.collect() for s in family.samples}
    figures.stale_after_seconds = -1.0
    stale = [s for family in figures.collect() for s in family.samples]

    assert samples[("durable_operator_volumes", (("durable_producer", "orders"),
                    ("namespace", "shop"), ("state", "InUse")))] == 2
    assert samples[("durable_operator_volumes", (("durable_producer", "orders"),
                    ("namespace", "shop"), ("state", "Draining")))] == 1
    assert samples[("durable_operator_outdated_agents", (("durable_producer", "orders"),
                    ("namespace", "shop")))] == 2
    assert stale == []


def test_metrics_endpoint_serves_the_operators_metrics(endpoint: str) -> None:
    metrics.register_defaults([("reconcile", "success")])

    status, text = get(f"{endpoint}/metrics")
    names = {family.name for family in text_string_to_metric_families(text)}

    assert status == 200
    assert {"durable_operator_handler_runs", "durable_operator_admission_requests",
            "durable_operator_admission_duration_seconds", "durable_operator_drains",
            "durable_operator_volume_claim_failures", "durable_operator_volumes",
            "durable_operator_outdated_agents"} <= names
    assert get(f"{endpoint}/nothing")[0] == 404


def test_ready_only_once_handlers_are_registered_and_the_webhook_listens(
    endpoint: str, readiness: http_endpoint.Readiness
) -> None:
    readiness.webhook_expected = True

    first = get(f"{endpoint}/readyz")
    readiness.handlers_registered.set()
    second = get(f"{endpoint}/readyz")
    readiness.webhook_serving.set()
    third = get(f"{endpoint}/readyz")

    assert first[0] == 503 and "registered the handlers" in first[1]
    assert second[0] == 503 and "webhook server is not listening" in second[1]
    assert third == (200, "ready\n")


def test_without_a_webhook_registered_handlers_are_enough(
    endpoint: str, readiness: http_endpoint.Readiness
) -> None:
    readiness.handlers_registered.set()

    assert get(f"{endpoint}/readyz")[0] == 200


def test_the_default_address_takes_ipv4_and_ipv6() -> None:
    server = http_endpoint.start("", 0)
    port = server.server_address[1]
    try:
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        if socket.has_ipv6 and server.address_family == socket.AF_INET6:
            assert get(f"http://[::1]:{port}/metrics")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is needed to make a certificate")
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_the_webhook_server_reports_ready_once_it_listens_with_its_certificate(
    tmp_path: Path, readiness: http_endpoint.Readiness
) -> None:
    cert, key = certificate(tmp_path)
    port = free_port()
    server = http_endpoint.ReadyWebhookServer(addr="127.0.0.1", port=port, certfile=cert,
                                              pkeyfile=key)

    async def first_config() -> tuple[bool, bool, object]:
        configs = server(lambda *args, **kwargs: None)  # type: ignore[arg-type]
        before = readiness.webhook_serving.is_set()
        config = await asyncio.wait_for(anext(configs), timeout=30)
        listening = socket.create_connection(("127.0.0.1", port), timeout=5)
        listening.close()
        await configs.aclose()  # type: ignore[attr-defined]
        return before, readiness.webhook_serving.is_set(), config

    before, after, config = asyncio.run(first_config())

    assert not before
    assert after
    assert "url" in config  # type: ignore[operator]


def test_a_webhook_server_without_its_certificate_never_reports_ready(
    tmp_path: Path, readiness: http_endpoint.Readiness
) -> None:
    server = http_endpoint.ReadyWebhookServer(addr="127.0.0.1", port=free_port(),
                                              certfile=tmp_path / "missing.crt",
                                              pkeyfile=tmp_path / "missing.key")

    async def first_config() -> object:
        return await anext(server(lambda *args, **kwargs: None))  # type: ignore[arg-type]

    with pytest.raises(OSError):
        asyncio.run(first_config())
    assert not readiness.webhook_serving.is_set()
