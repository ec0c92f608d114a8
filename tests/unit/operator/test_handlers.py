"""The kopf handlers: all in handlers.py, registered unconditionally, configured at startup."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from durable_producer.operator import handlers, http_endpoint, startup
from durable_producer.operator.act import admission
from durable_producer.operator.settings import OperatorConfig, WebhookSettings

OPERATOR_DIR = Path(handlers.__file__).parent
KOPF_REGISTRATION = re.compile(r"\bkopf\.(on\.\w+|timer|daemon|index)\(")


def test_every_kopf_handler_is_declared_in_handlers_py() -> None:
    declaring = {
        str(path.relative_to(OPERATOR_DIR))
        for path in OPERATOR_DIR.rglob("*.py")
        if KOPF_REGISTRATION.search(path.read_text())
    }

    assert declaring == {"handlers.py"}


def changing_handlers(registry: kopf.OperatorRegistry) -> set[tuple[str, str]]:
    return {
        (handler.id, str(handler.reason.value) if handler.reason else "resume")
        for handler in registry._changing.get_all_handlers()
    }


def test_import_registers_the_always_on_handlers_once() -> None:
    registry = kopf.get_default_registry()
    webhooks = [handler.id for handler in registry._webhooks.get_all_handlers()]
    startup_handlers = [handler.id for handler in registry._activities.get_all_handlers()]

    assert {
        ("reconcile_durable_producer", "create"), ("reconcile_durable_producer", "update"),
        ("reconcile_durable_producer", "resume"),
    } <= changing_handlers(registry)  # fmt: skip
    assert webhooks == [admission.MUTATION_WEBHOOK_ID]  # whether or not a certificate is set
    assert "start_operator" in startup_handlers


def register(features: str | None) -> kopf.OperatorRegistry:
    """What start_operator registers for DURABLE_PRODUCER_FEATURES (None: unset)."""
    environ = {} if features is None else {"DURABLE_PRODUCER_FEATURES": features}
    registry = kopf.OperatorRegistry()
    handlers.register_feature_handlers(
        OperatorConfig.from_environ(environ), registry, logging.getLogger("test"))
    return registry


def test_every_feature_on_registers_each_handler_once_and_one_delete_handler() -> None:
    registry = register(None)
    timers = [(h.id, h.interval) for h in registry._spawning.get_all_handlers()]
    backoffs = {h.id: h.backoff for h in registry._spawning.get_all_handlers()}
    backoffs.update((h.id, h.backoff) for h in registry._changing.get_all_handlers()
                    if h.id == handlers.DRAIN_HANDLER_ID)

    assert changing_handlers(registry) == {
        ("spark-templates", "create"), ("spark-templates", "update"),
        ("spark-templates", "resume"), ("drain-volumes", "delete"),
    }  # fmt: skip
    interval = OperatorConfig().pool_interval_seconds
    assert timers == [(handlers.POOL_TIMER_ID, interval), (handlers.RESYNC_ID, interval)]
    # A failed run is retried at the next interval, not after kopf's default of 60 s (a
    # refused PVC read once stalled the pool for a minute).
    assert backoffs == dict.fromkeys(
        (handlers.POOL_TIMER_ID, handlers.RESYNC_ID, handlers.DRAIN_HANDLER_ID), interval)
    every_flag = register("podAudit,volumePool,drainJobs,sparkPodTemplates")
    assert changing_handlers(every_flag) == changing_handlers(registry)


@pytest.mark.parametrize(("features", "expected_ids"), [
    ("", set()),
    ("sparkPodTemplates", {"spark-templates"}),
    ("podAudit,volumePool,drainJobs",
     {"drain-volumes", handlers.POOL_TIMER_ID, handlers.RESYNC_ID}),
    # One of the three pool flags off: no pool at all (the chart's schema refuses this).
    ("podAudit,volumePool", set()),
])  # fmt: skip
def test_a_feature_off_registers_none_of_its_handlers(
    features: str, expected_ids: set[str]
) -> None:
    registry = register(features)
    ids = {h.id for h in registry._changing.get_all_handlers()} | {
        h.id for h in registry._spawning.get_all_handlers()}

    assert ids == expected_ids
    finalizer_needed = any(h.requires_finalizer for h in registry._changing.get_all_handlers())
    assert finalizer_needed == ("drain-volumes" in expected_ids)


def test_handlers_read_the_config_the_startup_handler_left_in_the_memo() -> None:
    memo = kopf.Memo()
    with pytest.raises(kopf.PermanentError, match="startup did not run"):
        handlers.config_of(memo)

    memo[handlers.CONFIG_KEY] = OperatorConfig(pool_interval_seconds=3.0)

    assert handlers.config_of(memo).pool_interval_seconds == 3.0


def test_startup_configures_kopf_from_the_settings() -> None:
    settings = kopf.OperatorSettings()
    config = OperatorConfig.from_environ({"DURABLE_PRODUCER_WATCH_SERVER_TIMEOUT": "120"})

    startup.configure_kopf(settings, config, logging.getLogger("test"))

    assert settings.persistence.finalizer == startup.FINALIZER
    assert settings.watching.server_timeout == 120
    assert settings.watching.client_timeout == config.tuning.watch_client_timeout
    assert settings.admission.managed is None  # the chart owns the webhook configuration
    # Set, not kopf's min(32, CPUs + 4), which varies with the node (D5).
    assert settings.execution.max_workers == startup.HANDLER_WORKERS


def test_with_a_certificate_kopf_serves_the_webhook() -> None:
    webhook = WebhookSettings(addr="127.0.0.1", port=10443, certfile="c.crt", keyfile="c.key")

    server = admission.webhook_server(webhook)

    assert isinstance(server, kopf.WebhookServer)
    assert (server.addr, server.port, server.certfile, server.pkeyfile) == (
        "127.0.0.1", 10443, "c.crt", "c.key")  # fmt: skip


def test_with_the_volume_pool_off_no_webhook_is_served_even_with_a_certificate() -> None:
    settings = kopf.OperatorSettings()
    config = OperatorConfig.from_environ({
        "DURABLE_PRODUCER_FEATURES": "sparkPodTemplates",
        "DURABLE_PRODUCER_WEBHOOK_CERT_FILE": "c.crt", "DURABLE_PRODUCER_WEBHOOK_KEY_FILE": "c.key",
    })  # fmt: skip

    startup.configure_kopf(settings, config, logging.getLogger("test"))

    assert isinstance(settings.admission.server, admission.NoWebhookServer)


def test_without_a_certificate_the_webhook_server_serves_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = kopf.OperatorSettings()
    startup.configure_kopf(settings, OperatorConfig(), logging.getLogger("test"))
    server = settings.admission.server
    assert isinstance(server, admission.NoWebhookServer)
    assert "pods are not mutated" in caplog.text

    async def first_config() -> object:
        configs = server(lambda *args, **kwargs: None)  # type: ignore[arg-type]
        return await asyncio.wait_for(anext(configs), timeout=0.2)

    with pytest.raises(TimeoutError):  # it never offers kopf a client configuration
        asyncio.run(first_config())


def test_a_deletion_that_meets_a_timer_run_looks_again_within_seconds_not_a_minute() -> None:
    """kopf keeps the finalizer until the object's timers have exited. A timer whose sync run
    is in progress (in a thread) cannot exit at once; kopf's stop_daemons then answers how long
    to wait before it looks again. With kopf's default that was 60 s, so deleting a
    DurableProducer while a pool run was going took a minute longer than needed (a fresh
    clone's CI: the producer did not go within 60 s). Run on kopf's own stopping code."""
    from kopf._cogs.aiokits import aioenums
    from kopf._core.engines import daemons
    from kopf._core.intents import handlers as kopf_handlers

    settings = kopf.OperatorSettings()
    config = OperatorConfig()
    startup.configure_kopf(settings, config, logging.getLogger("test"))
    registry = kopf.OperatorRegistry()
    handlers.register_feature_handlers(config, registry, logging.getLogger("test"))
    timers = [
        handler
        for handler in registry._spawning.get_all_handlers()
        if isinstance(handler, kopf_handlers.TimerHandler)
    ]
    assert {timer.id for timer in timers} == {handlers.POOL_TIMER_ID, handlers.RESYNC_ID}

    async def delete_during_timer_runs() -> list[float]:
        release = threading.Event()
        running = {
            timer.id: daemons.Daemon(
                task=asyncio.create_task(asyncio.to_thread(release.wait, 10)),
                logger=logging.getLogger("test"),
                handler=timer,
                stopper=aioenums.FlagSetter(),
            )
            for timer in timers
        }
        try:
            return list(await daemons.stop_daemons(settings=settings, daemons=running))
        finally:
            release.set()
            await asyncio.gather(*(daemon.task for daemon in running.values()))

    delays = asyncio.run(delete_during_timer_runs())

    assert delays, "the timers were still running: kopf must look again"
    assert max(delays) <= 2.0, delays


def test_the_webhook_runs_on_kopfs_event_loop_and_its_work_in_threads_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D5: a sync handler waited in kopf's one thread pool behind the timers (their scrapes
    held threads for minutes) while its deadline was not yet running. Async, kopf awaits it
    at once; the blocking work runs in the webhook's own threads."""
    assert asyncio.iscoroutinefunction(handlers.attach_buffer_agent)
    ran_in: list[str] = []

    def handle(*args: object, **kwargs: object) -> admission.AdmissionAnswer:
        ran_in.append(threading.current_thread().name)
        return admission.AdmissionAnswer()

    monkeypatch.setattr(admission, "handle_admission", handle)
    asyncio.run(admission.admit({}, operation="CREATE", dryrun=False, config=OperatorConfig(),
                                logger=logging.getLogger("test"), received=0.0))
    assert ran_in and ran_in[0].startswith("admission")


def test_the_webhook_server_notes_each_reviews_arrival_for_its_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admission deadline starts at the review's arrival (D5): kopf's server calls the
    function ReadyWebhookServer gives it, which notes the time for the handlers below."""
    seen: list[float] = []

    async def kopf_server(self: object, fn: kopf.WebhookFn) -> AsyncIterator[object]:
        await asyncio.sleep(0.05)  # a review arrives
        arrived = time.monotonic()
        seen.extend([arrived, await fn({"request": {}}, webhook="w")])
        yield {"url": "https://127.0.0.1"}

    async def handler(request: object, **kwargs: object) -> float:
        await asyncio.sleep(0.5)  # kopf's own work before the handler
        return http_endpoint.review_received()

    async def serve() -> None:
        async for _ in http_endpoint.ReadyWebhookServer(port=1)(handler):  # type: ignore[arg-type]
            return

    monkeypatch.setattr(kopf.WebhookServer, "__call__", kopf_server)
    try:
        asyncio.run(serve())
    finally:
        http_endpoint.READINESS.reset()
    arrived, noted = seen
    assert arrived <= noted < arrived + 0.4  # the arrival, not the handler's start
    assert http_endpoint.review_received() >= arrived + 0.5  # outside a review: now


def test_claims_of_one_producer_wait_on_the_event_loop_and_are_refused_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D5: reviews of one DurableProducer that waited for its lock in the webhook's threads
    held them all, and later reviews queued behind them past the API server's timeout. They
    now wait on the event loop, for the time their budget has left; then 503, no thread."""
    config = OperatorConfig(webhook=WebhookSettings(timeout_seconds=1.5))  # budget 0.5 s
    entered: list[str] = []

    def slow_claim(body: dict[str, Any], **kwargs: object) -> admission.AdmissionAnswer:
        entered.append(body["metadata"]["name"])
        time.sleep(3.0)  # a claim that takes much longer than the budget
        return admission.AdmissionAnswer()

    def pod(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "shop",
                             "labels": {"durable.dev/producer": "gated"}}}

    answered: dict[str, float] = {}

    async def review(name: str, received: float) -> object:
        try:
            return await admission.admit(pod(name), operation="CREATE", dryrun=False,
                                         config=config, logger=logging.getLogger("test"),
                                         received=received)  # fmt: skip
        finally:
            answered[name] = time.monotonic() - received

    async def two_reviews() -> list[object]:
        received = time.monotonic()
        return await asyncio.gather(*(review(name, received) for name in ("first", "second")),
                                    return_exceptions=True)  # fmt: skip

    monkeypatch.setattr(admission, "handle_admission", slow_claim)
    first, second = asyncio.run(two_reviews())

    assert isinstance(first, admission.AdmissionAnswer)
    assert isinstance(second, kopf.AdmissionError) and second.code == 503
    assert "DurableProducer shop/gated was busy" in str(second)
    assert entered == ["first"]  # the second never took a thread
    # Refused at its budget's end (0.5 s), not after the first claim's 3 s.
    assert answered["second"] < 2.0, answered


def test_reviews_that_claim_nothing_do_not_wait_for_the_producers_claims() -> None:
    pod = {"metadata": {"name": "p", "namespace": "shop",
                        "labels": {"durable.dev/producer": "orders"}}}
    assert admission._claiming(pod, "CREATE", False) == ("shop", "orders")
    assert admission._claiming(pod, "CREATE", True) is None  # dry run
    assert admission._claiming(pod, "UPDATE", False) is None
    opted_out = {"metadata": {**pod["metadata"],
                              "annotations": {"agent.durable.dev/inject": "false"}}}
    assert admission._claiming(opted_out, "CREATE", False) is None


def test_a_bad_spec_seen_by_the_create_handler_and_the_timer_at_once_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf runs a new object's create handler and its resync timer at once, each with the
    same snapshot, which has no status yet: both found the StorageClass missing and both
    posted the Warning event (two identical events in a fresh clone's CI). The object's memo,
    which kopf gives both, remembers the problem warned about.

    Here, not on the real API server: the two runs must see the same stale snapshot, which
    the real kopf process gives only when its timing happens to line up (the real-server
    test, test_volume_pool_edges_process.py's StorageClass test, shows it when it does);
    the API calls and kopf's event poster are replaced, the handler code is the real one."""
    from support.webhook_harness import durable_producer

    raw = durable_producer()
    raw["metadata"].update(namespace="shop", uid="u-1", generation=1)
    raw["spec"]["storage"] = {"storageClassName": "missing"}
    body = kopf.Body(raw)  # type: ignore[arg-type]
    memo = kopf.Memo({handlers.CONFIG_KEY: OperatorConfig()})
    found: list[str | None] = ["missing"]  # the StorageClass check: the name of a missing one
    monkeypatch.setattr(handlers, "missing_storage_class", lambda *_: found[0])
    monkeypatch.setattr(handlers, "write_reconcile_conditions", lambda *_: None)
    warned: list[str] = []
    monkeypatch.setattr(kopf, "warn", lambda _body, *, reason, message: warned.append(reason))
    start = threading.Barrier(2)

    def handler_run(*, together: bool = False) -> None:  # each with a patch of its own
        if together:
            start.wait(5)
        handlers.reconcile_status(body, body.meta, kopf.Patch(), logging.getLogger("t"), memo)

    runs = [threading.Thread(target=handler_run, kwargs={"together": True}) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(10)

    assert warned == ["StorageClassNotFound"]
    handler_run()  # the timer again, on the same stale snapshot
    assert warned == ["StorageClassNotFound"]

    found[0] = None  # the class appeared, then went again: a new problem, a new event
    handler_run()
    found[0] = "missing"
    handler_run()
    assert warned == ["StorageClassNotFound", "StorageClassNotFound"]
