"""Whether the test being torn down failed: fixtures that start processes show their logs then.

tests/conftest.py's report hook records the call phase's outcome in the item's stash.
"""

from __future__ import annotations

import pytest

CALL_FAILED = pytest.StashKey[bool]()


def call_failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test's own call (not its setup) failed."""
    return request.node.stash.get(CALL_FAILED, False)
