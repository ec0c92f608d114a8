from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.wal import WriteAheadLog
from support.wal_helpers import SMALL


@pytest.fixture
def wal_dir(tmp_path: Path) -> Path:
    return tmp_path / "wal"


@pytest.fixture
def small_wal(wal_dir: Path) -> Iterator[WriteAheadLog]:
    wal = WriteAheadLog.open(wal_dir, SMALL)
    try:
        yield wal
    finally:
        wal.close()
