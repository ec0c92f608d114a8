"""Config fields -> flags: the generic part, on a config made up for the test."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import pytest

from durable_producer.buffer_agent.cli import build_parser
from durable_producer.buffer_agent.options import (
    ArgumentParser,
    add_options,
    host_port,
    non_negative_float,
    non_negative_int,
    one_of,
    option,
    options_of,
    path,
    positive_float,
    positive_int,
    reference_table,
    upper_case_of,
    values_of,
)


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, slots=True)
class ToyConfig:
    name: str = field(metadata=option("what to call it", flag="--toy-name"))
    host: str = field(
        default="127.0.0.1",
        metadata=option("HOST:PORT", flag="--address", parse=host_port, spans=("port",)),
    )
    port: int = 80
    colour: Colour = field(
        default=Colour.RED, metadata=option("a colour", parse=Colour, choices=values_of(Colour))
    )
    tags: tuple[str, ...] = field(
        default_factory=tuple, metadata=option("a tag", repeatable=True, collect=tuple)
    )
    count: int = field(default=3, metadata=option("how many", parse=positive_int))
    internal: int = 7


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ToyConfig:
    parser = ArgumentParser()
    add_options(parser, options_of(ToyConfig), environ or {})
    given = vars(parser.parse_args(argv))
    values: dict[str, object] = {}
    for declared in options_of(ToyConfig):
        values.update(declared.field_values(given[declared.dest]))
    return ToyConfig(**values)  # type: ignore[arg-type]


def test_only_marked_fields_become_flags_named_after_the_field_or_their_own_flag() -> None:
    flags = [(o.flag, o.env) for o in options_of(ToyConfig)]
    assert flags == [
        ("--toy-name", "DURABLE_AGENT_TOY_NAME"),
        ("--address", "DURABLE_AGENT_ADDRESS"),
        ("--colour", "DURABLE_AGENT_COLOUR"),
        ("--tags", "DURABLE_AGENT_TAGS"),
        ("--count", "DURABLE_AGENT_COUNT"),
    ]
    with pytest.raises(ValueError, match="no user-facing field internal"):
        options_of(ToyConfig, "internal")


def test_values_reach_the_fields_they_map_to() -> None:
    assert parse(["--toy-name=a"]) == ToyConfig("a")
    config = parse(
        ["--toy-name=a", "--address=h:9", "--colour=blue", "--tags=x", "--tags=y", "--count=2"]
    )
    assert config == ToyConfig("a", "h", 9, Colour.BLUE, ("x", "y"), 2)
    assert config.colour is Colour.BLUE


def test_the_environment_replaces_defaults_and_flags_override_it() -> None:
    environ = {"DURABLE_AGENT_TOY_NAME": "env", "DURABLE_AGENT_COUNT": "5"}
    environ["DURABLE_AGENT_TAGS"] = "p,q"
    assert parse([], environ) == ToyConfig("env", count=5, tags=("p", "q"))
    assert parse(["--count=9"], environ).count == 9


def test_help_and_reference_show_the_fields_defaults() -> None:
    table = reference_table(options_of(ToyConfig))
    assert "| `--toy-name` | `DURABLE_AGENT_TOY_NAME` | (required) | what to call it |" in table
    assert "| `--address` | `DURABLE_AGENT_ADDRESS` | `127.0.0.1:80` | HOST:PORT |" in table
    assert "| `--colour` | `DURABLE_AGENT_COLOUR` | `red` | a colour (one of: red, blue) |" in table
    assert "| `--tags` | `DURABLE_AGENT_TAGS` |  | a tag |" in table
    parser = ArgumentParser()
    add_options(parser, options_of(ToyConfig), {})
    text = " ".join(parser.format_help().split())
    assert "how many (default: 3) [env: DURABLE_AGENT_COUNT]" in text


def test_a_level_is_taken_in_any_case() -> None:
    assert upper_case_of(("DEBUG", "INFO"))("info") == "INFO"


def test_help_words() -> None:
    assert one_of(("A", "B", "C")) == "A, B or C"
    assert one_of(("A",)) == "A"


@pytest.mark.parametrize(
    ("parse", "text", "said"),
    [
        (non_negative_float, "abc", "'abc' is not a number"),
        (non_negative_float, "-1", "-1 must be 0 or more"),
        (positive_float, "0", "0 must be positive"),
        (positive_int, "1.5", "'1.5' is not a whole number"),
        (non_negative_int, "-2", "-2 must be zero or a positive integer"),
        # nan passed "must be positive" (nan <= 0 is false): --checkpoint-interval nan never
        # checkpointed, so the WAL was never freed
        (positive_float, "nan", "'nan' is not a finite number"),
        (non_negative_float, "inf", "'inf' is not a finite number"),
        # a port beyond 65535 passed, and the agent died in bind() with a traceback
        (host_port, "127.0.0.1:99999", "'127.0.0.1:99999': a port is 0 to 65535"),
        # these passed, and the agent failed to resolve them only once the WAL was open
        (
            host_port,
            "[::1:47092",
            "'[::1:47092': a bracket without its pair (an IPv6 host goes in brackets:"
            " [::1]:9092)",
        ),
        (host_port, "::1]:47092", "'::1]:47092': a bracket without its pair (an IPv6 host"
         " goes in brackets: [::1]:9092)"),
        (host_port, " :47092", "' :47092' is not HOST:PORT (e.g. 127.0.0.1:9092)"),
        (host_port, "my host:47092", "'my host:47092': a host has no spaces"),
        # DURABLE_AGENT_DATA_DIR= ran the agent in the current directory
        (path, "", "an empty path (give a directory)"),
        (upper_case_of(("DEBUG", "INFO")), "LOUD", "'LOUD' is not DEBUG or INFO"),
    ],
)
def test_a_bad_number_is_named_in_one_line(
    parse: Callable[[str], object], text: str, said: str
) -> None:
    """Not argparse's "invalid non_negative_float value" (a function's name, which the
    forwarder's own parser for --dead-letter-after and --unknown-topic-wait gave)."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert str(refused.value) == said
    assert non_negative_float("0") == 0.0 and non_negative_float("2.5") == 2.5


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--kafka-bootstrap", "k:1", "--sasl-username", "writer"],
        ["dead-letters", "list", "--data", "/tmp/volume"],
    ],
)
def test_a_flag_is_never_taken_for_a_longer_one(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--sasl-username writer`` was read as ``--sasl-username-file writer``: a name taken for
    a path, found missing only at the start, named by the other flag."""
    with pytest.raises(SystemExit) as stopped:
        build_parser({}).parse_args(argv)
    assert stopped.value.code == 2
    assert f"unrecognized arguments: {argv[-2]} {argv[-1]}" in capsys.readouterr().err
