"""A pass of dead letters on a real, nearly full filesystem (a size-limited tmpfs, filled to its
last page): the letters go as far as the disk allows, none is left half written, and the store
takes letters again once room is made. The unit tests of the same paths
(``tests/unit/buffer_agent/forward/test_dead_letter.py``) patch ``os.write`` to put the limit
at an exact byte; this one lets the kernel refuse."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward import dead_letter
from durable_producer.buffer_agent.forward.dead_letter import (
    DEAD_LETTERS_FILE,
    DeadLetterStore,
    list_dead_letters,
)
from support.dead_letters import refused
from support.volumes import fill, free_bytes, mounted_tmpfs

pytestmark = pytest.mark.integration

FIRST_OFFSET = 100  # offsets of one width: every letter the same length


def _letter_length(directory: Path, payload: bytes) -> int:
    probe = DeadLetterStore(directory)
    assert probe.add_batches([refused(FIRST_OFFSET, payload)]) == (1, None)
    return probe.size_bytes()


def _letters_of_a_share(directory: Path, room: int, share: int) -> tuple[bytes, int]:
    """A payload whose letter fits ``share`` times in ``room`` bytes, and the letter's length."""
    for size in range(room // share, 0, -8):
        payload = b"\x00\xffletter"[:8] * (size // 8)
        letter = _letter_length(directory / str(size), payload)
        if room // letter == share:
            return payload, letter
    raise AssertionError(f"no payload makes {share} letters fill {room} bytes")


def test_a_pass_on_a_nearly_full_disk_stores_as_many_letters_as_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One free page, letters of a ninth of it, two letters an append: the fifth append has no
    room. Cut back whole and retried unchanged, the pass stored eight letters and stopped there
    every second; written one at a time from that append on, nine (a review's finding)."""
    page = os.sysconf("SC_PAGE_SIZE")
    payload, letter = _letters_of_a_share(tmp_path / "probe", page, 9)
    monkeypatch.setattr(dead_letter, "LETTERS_WRITE_BYTES", 2 * letter)  # two letters an append
    with mounted_tmpfs(tmp_path / "volume", "64k") as volume:
        filler = volume / "filler"
        fill(volume)
        os.truncate(filler, (filler.stat().st_size // page - 1) * page)
        room = free_bytes(volume)
        assert room == page, f"{room} bytes free after freeing one page of {page}"
        fits = room // letter  # 9: an odd number tells the two ways apart
        store = DeadLetterStore(volume / "letters")
        stored, error = store.add_batches(
            refused(FIRST_OFFSET + index, payload) for index in range(fits + 3)
        )
        assert isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT), error
        assert stored == fits
        letters = list_dead_letters(volume / "letters")
        assert [item.wal_offset for item in letters] == [FIRST_OFFSET + i for i in range(fits)]
        assert {item.payload for item in letters} == {payload}
        assert (volume / "letters" / DEAD_LETTERS_FILE).stat().st_size == fits * letter

        # Room made (the application's file removed): the rest go, none twice.
        filler.unlink()
        rest = [refused(FIRST_OFFSET + index, payload) for index in range(fits, fits + 3)]
        assert store.add_batches(rest) == (3, None)
        offsets = [item.wal_offset for item in list_dead_letters(volume / "letters")]
        assert offsets == [FIRST_OFFSET + index for index in range(fits + 3)]
