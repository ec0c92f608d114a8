"""``durable-agent``: the buffer agent's command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .wal.inspect import format_report, inspect_wal, report_as_json


def _cmd_wal_inspect(args: argparse.Namespace) -> int:
    try:
        report = inspect_wal(Path(args.directory))
    except FileNotFoundError as error:
        print(f"durable-agent: {error}", file=sys.stderr)
        return 2
    print(report_as_json(report) if args.json else format_report(report))
    return 1 if any(s.problems for s in report.segments) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-agent",
        description="durable-producer buffer agent: a local Kafka endpoint with a write-ahead log.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    wal = commands.add_parser("wal", help="tools for a WAL directory on a buffer volume")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True)
    inspect = wal_commands.add_parser(
        "inspect",
        help="print segments, offsets, checkpoint, size and quarantined files (read-only)",
        description="Read-only report of a WAL directory; exit code 1 if a segment has problems.",
    )
    inspect.add_argument("directory", help="the WAL directory (e.g. /var/lib/durable-producer/wal)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(handler=_cmd_wal_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
