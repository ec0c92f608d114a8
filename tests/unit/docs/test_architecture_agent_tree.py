"""docs/architecture.md's tree names every module in the folder it is in, and no folder the code
does not have: the buffer agent's block, and the whole of src/durable_producer/ (the operator,
Spark, local/ and the top level with it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
AGENT = REPO / "src" / "durable_producer" / "buffer_agent"
FOLDER = re.compile(r"^(?P<indent> {4,})(?P<name>\w+)/(\s|$)")
CONTINUATION = " " * 25


def agent_tree() -> dict[tuple[str, ...], str]:
    """The agent's block of the doc's room-by-room tree: folder (path parts) -> its words."""
    text = (REPO / "docs" / "architecture.md").read_text()
    lines = text[text.index("  buffer_agent/ ") : text.index("  operator/ ")].splitlines()
    tree: dict[tuple[str, ...], str] = {(): lines[0]}
    stack: list[tuple[int, str]] = []
    current: tuple[str, ...] = ()
    for line in lines[1:]:
        folder = FOLDER.match(line)
        if folder:
            depth = len(folder["indent"])
            stack = [(d, n) for d, n in stack if d < depth] + [(depth, folder["name"])]
            current = tuple(name for _, name in stack)
            tree[current] = line
        elif line.startswith(CONTINUATION):
            tree[current] += " " + line
        else:  # a top-level file line of buffer_agent/
            current = ()
            stack = []
            tree[current] += " " + line
    return tree


def unnamed_modules(
    tree: dict[tuple[str, ...], str], root: Path, exempt: tuple[str, ...]
) -> list[str]:
    """The modules (.py, .c) of each folder of ``tree`` under ``root`` its words do not name."""
    missing = []
    for folder, words in tree.items():
        named = set(re.findall(r"\w+", words))
        directory = root.joinpath(*folder)
        for path in sorted([*directory.glob("*.py"), *directory.glob("*.c")]):
            if path.stem not in exempt and path.stem not in named:
                missing.append(str(path.relative_to(root)))
    return missing


def test_every_agent_module_is_named_in_its_folder() -> None:
    missing = unnamed_modules(agent_tree(), AGENT, ("__init__",))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_agent_folder_is_in_the_doc_and_exists() -> None:
    tree = agent_tree()
    on_disk = {
        path.parent.relative_to(AGENT).parts
        for path in AGENT.rglob("__init__.py")
    }
    assert set(tree) == on_disk


PACKAGE = REPO / "src" / "durable_producer"
ANY_FOLDER = re.compile(r"^(?P<indent> +)(?P<name>\w+)/(\s|$)")


def package_tree() -> dict[tuple[str, ...], str]:
    """The whole room-by-room tree (``src/durable_producer/`` to the end of its block):
    folder (path parts) -> its words, file lines counted in the folder they are indented under."""
    text = (REPO / "docs" / "architecture.md").read_text()
    start = text.index("\nsrc/durable_producer/\n") + 1
    lines = text[start : text.index("```", start)].splitlines()
    tree: dict[tuple[str, ...], str] = {(): lines[0]}
    stack: list[tuple[int, str]] = []
    current: tuple[str, ...] = ()
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip(" "))
        folder = ANY_FOLDER.match(line)
        if folder:
            stack = [(d, n) for d, n in stack if d < indent] + [(indent, folder["name"])]
            current = tuple(name for _, name in stack)
            tree[current] = line
        elif line.startswith(CONTINUATION):
            tree[current] += " " + line
        else:  # a file line: it belongs to the folder one level out
            stack = [(d, n) for d, n in stack if d < indent]
            current = tuple(name for _, name in stack)
            tree[current] += " " + line
    return tree


def test_every_module_of_the_package_is_named_in_its_folder() -> None:
    missing = unnamed_modules(package_tree(), PACKAGE, ("__init__", "__main__"))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_package_folder_is_in_the_doc_and_exists() -> None:
    on_disk = {path.parent.relative_to(PACKAGE).parts for path in PACKAGE.rglob("__init__.py")}
    assert set(package_tree()) == on_disk
