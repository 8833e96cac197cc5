"""A subcommand contributed the way docs/cli.md describes (test_cli_units.py registers it)."""

import argparse

from cronoq.cli import add_connection_arguments, settings_from

IMPORTED = True


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("example", help="an example subcommand", description="Exit with --code.")
    parser.add_argument("--code", type=int, default=0)
    add_connection_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args, {})
    print(f"example: code {args.code}, server {settings.target}")
    return args.code
