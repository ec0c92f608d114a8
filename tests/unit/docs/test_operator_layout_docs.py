"""docs/operator.md's table of the operator's modules names every file in the room it is in."""

from __future__ import annotations

import re

from support.tools import REPO_ROOT

OPERATOR_DIR = REPO_ROOT / "src" / "durable_producer" / "operator"
ROOM_ROW = re.compile(r"^\| \*\*`operator/(?:(\w+)/)?`\*\*")
MODULE = re.compile(r"`(\w+\.py)`")


def documented_rooms() -> dict[str, set[str]]:
    """Room ("" for the operator's top level) -> the modules its rows of the table name."""
    guide = (REPO_ROOT / "docs" / "operator.md").read_text()
    section = guide.split("## How the code is laid out", 1)[1].split("\n## ", 1)[0]
    rooms: dict[str, set[str]] = {}
    room: str | None = None
    for line in section.splitlines():
        heading = ROOM_ROW.match(line)
        if heading:
            room = heading.group(1) or ""
            rooms[room] = set()
        elif room is not None and line.startswith("| `"):
            first_cell = line.split("|")[1]
            rooms[room].update(MODULE.findall(first_cell))
    return rooms


def actual_rooms() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for path in OPERATOR_DIR.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        room = path.parent.relative_to(OPERATOR_DIR).as_posix()
        rooms.setdefault("" if room == "." else room, set()).add(path.name)
    return rooms


def test_every_operator_module_is_in_the_docs_table_in_its_room() -> None:
    assert documented_rooms() == actual_rooms()
