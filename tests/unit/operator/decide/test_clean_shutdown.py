"""When a stopped agent's record may mark its volume empty (issue 29, D2 (b))."""

from __future__ import annotations

from typing import Any

import pytest

from durable_producer.contract import AGENT_CONTAINER_NAME, CLAIM_TOKEN_ANNOTATION
from durable_producer.operator.decide import clean_shutdown
from durable_producer.operator.decide import volume_pool as vp
from durable_producer.shutdown_record import ShutdownRecord, render

EMPTY = render(ShutdownRecord(True, 0, 0, 0))
VOLUME = "orders-buffer-1"


def stopped_pod(message: str | None = EMPTY, *, exit_code: int = 0, token: str | None = "t1",
                deleting: bool = True, phase: str = "Running",
                injected: bool = True) -> dict[str, Any]:
    annotations = {} if token is None else {CLAIM_TOKEN_ANNOTATION: token}
    terminated: dict[str, Any] = {"exitCode": exit_code}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": "busy", "namespace": "shop", "annotations": annotations,
                     **({"deletionTimestamp": "2026-11-27T10:00:00Z"} if deleting else {})},
        "spec": {
            "initContainers": [{"name": AGENT_CONTAINER_NAME,
                                "restartPolicy": "Always" if injected else "Never"}],
            "containers": [{"name": "app"}],
            "volumes": [{"name": "durable-buffer", "persistentVolumeClaim": {"claimName": VOLUME}}],
        },
        "status": {"phase": phase, "initContainerStatuses": [
            {"name": AGENT_CONTAINER_NAME, "state": {"terminated": terminated}}]},
    }


def pvc(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": VOLUME, "resourceVersion": "42", "annotations": annotations}}


def test_a_pod_being_deleted_whose_agent_stopped_empty_names_its_volume_and_claim() -> None:
    assert clean_shutdown.emptied_volume(stopped_pod()) == clean_shutdown.EmptiedVolume(
        VOLUME, "t1")
    # A finished pod (a Job's, say) too: nothing restarts its agent.
    assert clean_shutdown.emptied_volume(stopped_pod(deleting=False, phase="Succeeded"))


@pytest.mark.parametrize("pod", [
    # The kubelet restarts a sidecar that exits in a live pod: it could write again.
    stopped_pod(deleting=False),
    stopped_pod(exit_code=1),
    stopped_pod(message=None),
    stopped_pod(message="OOMKilled"),
    stopped_pod(message=render(ShutdownRecord(False, 5, 0, 0))),
    stopped_pod(message=render(ShutdownRecord(True, 0, 2, 0))),
    stopped_pod(token=None),  # admitted before pods carried the claim
    stopped_pod(injected=False),
], ids=["live-pod", "exit-1", "no-message", "other-message", "backlog", "dead-letters",
        "no-token", "not-injected"])
def test_anything_less_names_no_volume(pod: dict[str, Any]) -> None:
    assert clean_shutdown.emptied_volume(pod) is None


def test_the_record_speaks_only_for_the_claim_it_was_made_under() -> None:
    assert clean_shutdown.needs_marking(pvc(**{CLAIM_TOKEN_ANNOTATION: "t1"}), "t1")
    # Released by the pool timer before the event came, and not claimed since.
    assert clean_shutdown.needs_marking(pvc(**{vp.RELEASED_TOKEN_ANNOTATION: "t1"}), "t1")
    # Claimed since by another pod, which may have written to it.
    assert not clean_shutdown.needs_marking(
        pvc(**{CLAIM_TOKEN_ANNOTATION: "t2", vp.RELEASED_TOKEN_ANNOTATION: "t1"}), "t1")
    assert not clean_shutdown.needs_marking(pvc(), "t1")
    # Already empty: nothing to write.
    assert not clean_shutdown.needs_marking(
        pvc(**{CLAIM_TOKEN_ANNOTATION: "t1", vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY}), "t1")


def test_the_mark_is_guarded_by_the_version_read() -> None:
    patch = clean_shutdown.empty_patch(pvc(**{CLAIM_TOKEN_ANNOTATION: "t1"}))
    assert patch == {"metadata": {"resourceVersion": "42",
                                  "annotations": {vp.BACKLOG_ANNOTATION: vp.BACKLOG_EMPTY}}}
