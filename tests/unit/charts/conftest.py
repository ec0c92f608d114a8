"""Fixtures the chart tests share."""

from __future__ import annotations

from typing import Any

import pytest

from support.tools import render_chart


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    """The chart rendered with its default values, once per test module."""
    return render_chart()
