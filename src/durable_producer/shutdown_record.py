"""The record a buffer agent leaves in its container's termination message when it stops.

Kubernetes keeps what a container wrote to its termination-message file (``/dev/termination-log``
by default, at most 4096 bytes) in the pod's status once the container has ended
(``state.terminated.message``). An agent stopped by SIGTERM forwards what it can, then
writes there whether its volume is now empty: no record left in the WAL and no pending dead
letter. The operator reads it from the pod's last status and marks
the volume known empty, so the volume can go without a drain Job: the only way it can go
when no Job can run any more (a namespace being deleted refuses new pods).

One JSON line, so that a person reading ``kubectl get pod -o yaml`` understands it too.
Written by ``buffer_agent/agent.py``, read by ``operator/decide/clean_shutdown.py``. A leaf:
imports nothing from the package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
"""Kubernetes' default ``terminationMessagePath``; the kubelet creates the file. Elsewhere
(no such file) the agent writes no record."""

_MARK: Final = "durable-agent stopped"


@dataclass(frozen=True)
class ShutdownRecord:
    """What was left on the volume when the agent stopped."""

    drained: bool  # everything in the WAL reached Kafka before the agent stopped
    backlog_records: int  # records in WAL frames not yet confirmed by Kafka
    dead_letters: int  # pending (not re-sent) dead letters
    quarantined_segments: int  # damaged WAL segments kept aside for a person to look at

    @property
    def volume_empty(self) -> bool:
        """Nothing on the volume that is not in Kafka: deleting it loses nothing. Quarantined
        segments are reported but do not count: what could be read of them was replayed, the
        rest is lost whoever keeps the files (a drain treats them the same way)."""
        return self.drained and self.backlog_records == 0 and self.dead_letters == 0


def render(record: ShutdownRecord) -> str:
    return json.dumps(
        {
            "event": _MARK,
            "drained": record.drained,
            "backlogRecords": record.backlog_records,
            "deadLetters": record.dead_letters,
            "quarantinedSegments": record.quarantined_segments,
        },
        separators=(", ", ": "),
    )


def parse(message: object) -> ShutdownRecord | None:
    """The record in a termination message; None for anything else (another program's
    message, a truncated or edited one): such a volume is not known to be empty."""
    if not isinstance(message, str):
        return None
    try:
        found = json.loads(message.strip())
    except ValueError:
        return None
    if not isinstance(found, dict) or found.get("event") != _MARK:
        return None
    drained = found.get("drained")
    counts = [found.get(key) for key in ("backlogRecords", "deadLetters", "quarantinedSegments")]
    if not isinstance(drained, bool) or not all(
        isinstance(count, int) and not isinstance(count, bool) and count >= 0
        for count in counts
    ):
        return None
    backlog, dead, quarantined = (int(count) for count in counts)  # type: ignore[arg-type]
    return ShutdownRecord(drained, backlog, dead, quarantined)
