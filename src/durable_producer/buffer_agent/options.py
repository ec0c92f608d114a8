"""How a field of a component's config becomes a command-line flag and an environment variable.

A config dataclass marks a field user-facing with ``field(..., metadata=option("help"))``;
fields without it are internal tuning. ``settings.py`` picks the marked fields into the
commands, and this module turns them into argparse options (flag, ``DURABLE_AGENT_*``
variable, ``--help`` text) and into the markdown table of docs/agent.md, so the default a
user reads is the field's own default. The value parsers the fields name live here too.

A leaf module: it imports nothing from the agent, so every component's config may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from durable_producer.buffer_agent.errors import SettingError
from durable_producer.contract import AGENT_BOOTSTRAP, AGENT_ENV_PREFIX, KAFKA_PORT

_METADATA_KEY = "durable_producer.option"


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """What a field declares about its flag (see ``option``)."""

    help: str
    flag: str | None
    parse: Callable[[str], Any]
    choices: tuple[str, ...] | None
    repeatable: bool
    collect: Callable[[list[str]], Any] | None
    spans: tuple[str, ...]


def option(
    help: str,
    *,
    flag: str | None = None,
    parse: Callable[[str], Any] = str,
    choices: tuple[str, ...] | None = None,
    repeatable: bool = False,
    collect: Callable[[list[str]], Any] | None = None,
    spans: tuple[str, ...] = (),
) -> Mapping[str, OptionSpec]:
    """Field metadata making the field a flag.

    ``flag``: the flag when it is not ``--<field-name>``; the environment variable is
    ``DURABLE_AGENT_`` + the flag's name. ``parse``: text -> the field's value (with
    ``choices``, the text is checked against them first). ``repeatable``: the flag may be
    given several times (the variable holds a comma-separated list) and ``collect`` turns
    the list into the field's value. ``spans``: further fields of the same config that one
    ``A:B`` value sets: ``parse`` returns a tuple for this field and those, in order (as
    ``--listen HOST:PORT`` sets ``host`` and ``port``).
    """
    return {_METADATA_KEY: OptionSpec(help, flag, parse, choices, repeatable, collect, spans)}


@dataclass(frozen=True, slots=True)
class Option:
    """One flag of the command line, bound to the config field(s) it sets."""

    config: type[Any]
    fields: tuple[str, ...]
    spec: OptionSpec
    default: Any
    """The field's default (a tuple for a spanning option); MISSING when it has none."""

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.fields[0].replace("_", "-")

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return AGENT_ENV_PREFIX + self.dest.upper()

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def shown_default(self) -> str:
        """The default as a user writes it; empty when there is none to show."""
        if self.required or self.default is None:
            return ""
        if isinstance(self.default, tuple):
            host, *rest = (str(part) for part in self.default)
            return ":".join([f"[{host}]" if ":" in host else host, *rest])
        return str(self.default)

    def field_values(self, given: Any) -> dict[str, Any]:
        """The config fields this option sets, from its parsed command-line value."""
        if self.spec.repeatable:
            items = list(given or [])
            return {self.fields[0]: self.spec.collect(items) if self.spec.collect else items}
        if self.spec.choices is not None and given is not None:
            given = self.spec.parse(given)
        if self.spec.spans:
            return dict(zip(self.fields, given, strict=True))
        return {self.fields[0]: given}


def options_of(config: type[Any], *names: str) -> tuple[Option, ...]:
    """The options of ``config``'s user-facing fields: all of them in field order, or
    those of ``names`` in the order given (a name not user-facing is a mistake)."""
    found = {option.fields[0]: option for option in _declared(config)}
    if not names:
        return tuple(found.values())
    unknown = [name for name in names if name not in found]
    if unknown:
        raise ValueError(f"{config.__name__} has no user-facing field {', '.join(unknown)}")
    return tuple(found[name] for name in names)


def _declared(config: type[Any]) -> Iterator[Option]:
    fields = {field.name: field for field in dataclasses.fields(config)}
    for field in fields.values():
        spec = field.metadata.get(_METADATA_KEY)
        if spec is None:
            continue
        names = (field.name, *spec.spans)
        defaults = tuple(fields[name].default for name in names)
        default: Any = defaults if spec.spans else defaults[0]
        if field.default_factory is not dataclasses.MISSING:
            default = None  # made per instance (an empty mapping, say): nothing to show
        yield Option(config, names, spec, default)


@dataclass(frozen=True, slots=True)
class _FromEnvironment:
    """A variable's text standing as its flag's default until ``ArgumentParser`` converts it."""

    option: Option
    raw: str


class ArgumentParser(argparse.ArgumentParser):
    """Converts the environment's values once parsed, so only for the command that runs: a
    bad variable of one command breaks neither another command nor ``--help``. Flags are
    never abbreviated (argparse's default took ``--sasl-username u`` for
    ``--sasl-username-file u``: a name read as a path); its subcommands' parsers are made
    by this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for name, value in vars(parsed).items():
            if isinstance(value, _FromEnvironment):
                setattr(parsed, name, _from_environment(value.option, value.raw))
        return parsed, extras


def add_options(
    parser: ArgumentParser, options: Sequence[Option], environ: Mapping[str, str]
) -> None:
    """Add ``options`` to ``parser``; a set environment variable replaces the default."""
    for option in options:
        spec = option.spec
        convert = str if spec.choices is not None else spec.parse
        raw = environ.get(option.env)
        default: Any = [] if spec.repeatable else (None if option.required else option.default)
        if raw is not None:
            default = (
                [item for item in raw.split(",") if item]
                if spec.repeatable
                else _FromEnvironment(option, raw)
            )
        shown = f" (default: {option.shown_default})" if option.shown_default else ""
        parser.add_argument(
            option.flag,
            dest=option.dest,
            type=convert,
            default=default,
            choices=spec.choices,
            action="append" if spec.repeatable else "store",
            required=option.required and raw is None,
            help=f"{spec.help}{shown} [env: {option.env}]",
        )


def _from_environment(option: Option, raw: str) -> Any:
    """An environment variable's value, checked as argparse checks the flag's."""
    spec = option.spec
    if spec.choices is not None:
        if raw not in spec.choices:
            raise SettingError(
                f"{option.env}={raw!r} is not one of {', '.join(spec.choices)}"
                f" (the variable sets {option.flag})"
            )
        return raw
    try:
        return spec.parse(raw)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
        reason = str(error) if isinstance(error, argparse.ArgumentTypeError) else "invalid"
        raise SettingError(
            f"{option.env}={raw!r}: {reason} (the variable sets {option.flag})"
        ) from None


def reference_table(options: Sequence[Option]) -> str:
    """A markdown table of ``options`` for docs/agent.md (a test keeps the doc in step)."""
    lines = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for option in options:
        if option.required:
            default = "(required)"
        else:
            default = f"`{option.shown_default}`" if option.shown_default else ""
        meaning = option.spec.help.replace("|", "\\|")
        if option.spec.choices:
            meaning += " (one of: " + ", ".join(option.spec.choices) + ")"
        lines.append(f"| `{option.flag}` | `{option.env}` | {default} | {meaning} |")
    return "\n".join(lines)


def values_of(enum: type[Enum]) -> tuple[str, ...]:
    """The choices of an option whose field is a string enum."""
    return tuple(str(member.value) for member in enum)


def one_of(words: Sequence[str]) -> str:
    """``("A", "B", "C")`` -> ``"A, B or C"`` for help texts."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else "".join(words)


# ----------------------------------------------------------------------- value parsers


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT``; an IPv6 host in brackets (``[::]:9644``) comes back without them."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not port.isdigit() or not host.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. {AGENT_BOOTSTRAP})")
    if "[" in host or "]" in host:  # "[::1:9092" passed, and failed to resolve at bind time
        raise argparse.ArgumentTypeError(
            f"{text!r}: a bracket without its pair (an IPv6 host goes in brackets:"
            f" [::1]:{KAFKA_PORT})"
        )
    if any(character.isspace() for character in host):
        raise argparse.ArgumentTypeError(f"{text!r}: a host has no spaces")
    if int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 to 65535")
    return host, int(port)


def path(text: str) -> Path:
    """A path; an empty one (``DURABLE_AGENT_DATA_DIR=``) is a mistake, not the current
    directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (give a directory)")
    return Path(text)


def upper_case_of(words: Sequence[str]) -> Callable[[str], str]:
    """A parser taking one of ``words`` in any case (``info`` for ``INFO``)."""

    def parse(text: str) -> str:
        if text.upper() not in words:
            raise argparse.ArgumentTypeError(f"{text!r} is not {one_of(words)}")
        return text.upper()

    return parse


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be zero or a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def non_negative_float(text: str) -> float:
    value = float(_number(text, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value
