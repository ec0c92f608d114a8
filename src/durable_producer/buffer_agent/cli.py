"""``durable-agent``: the buffer agent's command line.

Every setting is a flag and a ``DURABLE_AGENT_*`` environment variable (see ``settings.py``).
Exit codes: 0 success; 1 incomplete drain, problems found or forwarding failed; 2 invalid
settings or arguments, or a start-up problem they cause (a data directory that cannot be
written, a file of the volume the agent may not read or write, a port in use), always as one
line on stderr; 3 the volume is in use by another agent; 4 (drain) the WAL is forwarded but
dead letters are still on the volume: it is not empty. A file error of any other kind (an
I/O error) is one line too, exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import faulthandler
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from durable_producer.buffer_agent.errors import SettingError, StartupError
from durable_producer.buffer_agent.forward.dead_letter import read_dead_letters, unreadable_note
from durable_producer.buffer_agent.forward.resend import resend_dead_letters
from durable_producer.buffer_agent.kafka.client_config import (
    KafkaConfigError,
    KafkaConnectionSettings,
    build_client_config,
)
from durable_producer.buffer_agent.logging_setup import LOG_FORMATS, LOG_LEVELS, configure_logging
from durable_producer.buffer_agent.options import (
    ArgumentParser,
    add_options,
    options_of,
    upper_case_of,
)
from durable_producer.buffer_agent.settings import (
    COMMON_OPTIONS,
    DRAIN_OPTIONS,
    RUN_OPTIONS,
    AgentConfig,
    in_flags,
    settings_from,
)
from durable_producer.buffer_agent.volume.directories import prepare_data_dir
from durable_producer.buffer_agent.wal import FsyncPolicy, WalConfig, WalError, WalLockedError
from durable_producer.buffer_agent.wal.recovery.inspect import (
    format_report,
    inspect_wal,
    report_as_json,
)

log = logging.getLogger("durable_producer.agent")


def _cmd_run(args: argparse.Namespace) -> int:
    from durable_producer.buffer_agent.agent import BufferAgent

    settings = settings_from(args)
    _prepare_volume(settings.agent)
    return asyncio.run(BufferAgent(settings).run())


def _cmd_drain(args: argparse.Namespace) -> int:
    from durable_producer.buffer_agent.agent import BufferAgent

    settings = settings_from(args)
    _require_volume(settings.agent.data_dir)  # a mistyped path is no empty volume
    _prepare_volume(settings.agent)
    return BufferAgent(settings).drain(settings.agent.drain_mode_timeout_s)


def _prepare_volume(agent: AgentConfig) -> None:
    prepare_data_dir(agent.data_dir, (agent.wal_dir, agent.state_dir, agent.dead_letter_dir))


def _require_volume(data_dir: Path) -> None:
    """The commands that read or empty a volume (``drain``, ``dead-letters list|resend``) make
    none: a ``--data-dir`` that does not exist was reported drained (exit 0), and its volume
    could then have been deleted with the data it held."""
    if not data_dir.is_dir():
        raise StartupError(
            f"no buffer volume at {data_dir} (--data-dir): no such directory; point --data-dir"
            " (DURABLE_AGENT_DATA_DIR) at the volume's mount"
        )


_SETUP_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.ENOENT,
     errno.ELOOP, errno.ENAMETOOLONG}
)  # fmt: skip
"""File errors that come from how the volume is set up (exit code 2), not from its device."""


def file_problem(error: OSError) -> tuple[str, int]:
    """The one line and exit code for a file of the volume the agent cannot use."""
    where = f"{error.filename}: " if error.filename is not None else ""
    what = error.strerror or str(error)
    if error.errno in _SETUP_ERRNOS:
        return (
            f"{where}{what}; the agent (user id {os.getuid()}) cannot use this file of the"
            " buffer volume: fix its type or permissions (fsGroup), or move it aside",
            2,
        )
    return f"{where}{what}; the buffer volume's device failed: see the kernel log", 1


def _cmd_wal_inspect(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    try:
        report = inspect_wal(directory, FsyncPolicy(args.fsync))
    except FileNotFoundError as error:
        print(f"durable-agent: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # read-only: nothing is moved aside, the file is only named
        line, code = file_problem(error)
        print(f"durable-agent: cannot read the WAL: {line}", file=sys.stderr)
        return code
    if not report.segments and not report.checkpoint_present and not report.quarantined:
        print(
            f"durable-agent: no WAL in {directory}{_where_the_wal_is(directory)}", file=sys.stderr
        )
        return 2
    print(report_as_json(report) if args.json else format_report(report))
    return 1 if report.problems_found else 0


def _where_the_wal_is(directory: Path) -> str:
    """A hint for ``wal inspect`` pointed at the wrong directory."""
    nested = directory / AgentConfig(data_dir=directory).wal_dir.name
    if nested.is_dir():
        return f"; the WAL of a buffer volume is its wal/ directory: try {nested}"
    return (
        f" (no segments, checkpoint or quarantine); a buffer volume keeps its WAL in"
        f" <data-dir>/wal, e.g. {AgentConfig().wal_dir}"
    )


def _taken(batches: int) -> str:
    """A letter's first batches Kafka took in a resend that failed at a later one."""
    if not batches:
        return ""
    plural = "es" if batches > 1 else ""
    return f" (its first {batches} batch{plural} in Kafka: resend sends the rest)"


def _cmd_dead_letters_list(args: argparse.Namespace) -> int:
    volume = AgentConfig(data_dir=Path(args.data_dir))
    _require_volume(volume.data_dir)
    reading = read_dead_letters(volume.dead_letter_dir, include_resent=args.all)
    letters = reading.letters
    if reading.unreadable:
        print(
            f"durable-agent: {volume.dead_letter_dir}: {len(letters)} dead letter(s)"
            f"{unreadable_note(reading.unreadable)}",
            file=sys.stderr,
        )
    if not letters:
        print("no dead letters")
        return 1 if reading.unreadable else 0
    print(f"{'id':<28} {'topic':<24} {'part':>4} {'wal offset':>10}  reason")
    for letter in letters:
        state = " (re-sent)" if letter.resent else _taken(letter.taken_batches)
        print(
            f"{letter.id:<28} {letter.topic:<24} {letter.partition:>4} "
            f"{letter.wal_offset:>10}  {letter.reason}{state}"
        )
    return 1 if reading.unreadable else 0


def _cmd_dead_letters_resend(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    _require_volume(settings.agent.data_dir)
    summary = resend_dead_letters(
        settings.agent.dead_letter_dir,
        build_client_config(settings.kafka),
        ids=args.ids or None,
    )
    print(
        f"re-sent {len(summary.resent)}, failed {len(summary.failed)}, "
        f"skipped {len(summary.skipped)}"
    )
    for letter_id, reason in summary.failed + summary.skipped:
        print(f"  {letter_id}: {reason}")
    # A letter skipped stays on the volume (and a drain then finds it): not a success.
    return 1 if summary.failed or summary.skipped else 0


def build_parser(environ: Mapping[str, str] | None = None) -> ArgumentParser:
    environ = os.environ if environ is None else environ
    parser = ArgumentParser(
        prog="durable-agent",
        description="durable-producer buffer agent: a local Kafka endpoint that writes every "
        "batch to a write-ahead log on a persistent volume and forwards it to Kafka.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="serve the Kafka protocol locally and forward to the cluster",
        description="Serve until SIGTERM, then stop accepting, drain until --drain-timeout, "
        "checkpoint and exit 0; what is left stays on the volume.",
    )
    add_options(run, COMMON_OPTIONS + RUN_OPTIONS, environ)
    run.set_defaults(handler=_cmd_run)

    drain = commands.add_parser(
        "drain",
        help="forward everything on a volume and exit (for volumes whose pod is gone)",
        description="Exit code 0 when everything reached Kafka and the volume is empty, 1 when"
        " --timeout ran out, 4 when dead letters are still on the volume (re-send or remove"
        " them, then drain again).",
    )
    add_options(drain, COMMON_OPTIONS + DRAIN_OPTIONS, environ)
    drain.set_defaults(handler=_cmd_drain)

    wal = commands.add_parser("wal", help="tools for a WAL directory on a buffer volume")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True)
    inspect = wal_commands.add_parser(
        "inspect",
        help="print segments, offsets, checkpoint, size and quarantined files (read-only)",
        description="Read-only report of a WAL directory and what opening it will do; exit code 1 "
        "if it finds damage or entries that are not part of the log.",
    )
    inspect.add_argument("directory", help=f"the WAL directory (e.g. {AgentConfig().wal_dir})")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    add_options(inspect, options_of(WalConfig, "fsync"), environ)  # judges a damaged last frame
    _add_quiet_logging(inspect)
    inspect.set_defaults(handler=_cmd_wal_inspect)

    letters = commands.add_parser("dead-letters", help="records Kafka refused for good")
    letter_commands = letters.add_subparsers(dest="letters_command", required=True)
    listing = letter_commands.add_parser("list", help="list pending dead letters")
    add_options(listing, options_of(AgentConfig, "data_dir"), environ)
    listing.add_argument("--all", action="store_true", help="include re-sent ones")
    _add_quiet_logging(listing)
    listing.set_defaults(handler=_cmd_dead_letters_list)
    resend = letter_commands.add_parser("resend", help="produce dead letters again")
    add_options(resend, COMMON_OPTIONS, environ)
    resend.add_argument("ids", nargs="*", help="dead letter ids (default: all pending)")
    resend.set_defaults(handler=_cmd_dead_letters_resend)
    return parser


def _add_quiet_logging(command: argparse.ArgumentParser) -> None:
    """The log options of a read-only command: hidden, WARNING by default."""
    command.add_argument(
        "--log-level", default="WARNING", type=upper_case_of(LOG_LEVELS), help=argparse.SUPPRESS
    )
    command.add_argument(
        "--log-format", default="text", choices=LOG_FORMATS, help=argparse.SUPPRESS
    )


def main(argv: list[str] | None = None) -> int:
    # A crash in compiled code (the agent's C modules, librdkafka's threads) then prints every
    # thread's Python stack to the process's stderr (the container's log) before it dies.
    if sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError):  # no file descriptor behind it
            faulthandler.enable(sys.__stderr__, all_threads=True)
    try:
        args = build_parser().parse_args(argv)
    except SettingError as error:  # an environment variable argparse did not see
        print(f"durable-agent: {error}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    try:
        return int(args.handler(args))
    except KafkaConfigError as error:  # its fields, named by the agent's flags
        print(f"durable-agent: {in_flags(str(error), KafkaConnectionSettings)}", file=sys.stderr)
        return 2
    except (SettingError, StartupError) as error:
        print(f"durable-agent: {error}", file=sys.stderr)
        return 2
    except WalLockedError as error:
        print(f"durable-agent: {error}", file=sys.stderr)
        return 3
    except WalError as error:  # the volume cannot hold a log (e.g. a failed fsync on open)
        print(f"durable-agent: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # a file of the volume it may not open, or a failing device
        log.debug("file error", exc_info=True)
        line, code = file_problem(error)
        print(f"durable-agent: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
