"""Kubernetes objects as the operator handles them: plain JSON, never the client's models.

Reading objects as dicts keeps every field, including ones this code does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Object = Mapping[str, Any]
FINISHED_POD_PHASES = frozenset({"Succeeded", "Failed"})
"""An object as read (not modified here)."""
JsonObject = dict[str, Any]
"""An object, manifest or patch as built or decoded here."""

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def name_of(obj: Object) -> str:
    """``metadata.name``, or "" when absent."""
    return str((obj.get("metadata") or {}).get("name") or "")


def annotations_of(obj: Object) -> Mapping[str, str]:
    """``metadata.annotations``, or {} when absent."""
    return (obj.get("metadata") or {}).get("annotations") or {}


def format_time(moment: datetime) -> str:
    """``moment`` as Kubernetes writes timestamps (RFC 3339, UTC, seconds), e.g.
    ``2026-01-01T00:00:00Z``."""
    return moment.astimezone(UTC).strftime(TIME_FORMAT)


def parse_time(text: str | None) -> datetime | None:
    """A timestamp written by ``format_time`` (or Kubernetes); None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
