"""Subcommands that other packages contribute to ``cronoq`` (docs/cli.md#subcommands-from-other-packages).

A contributing module exposes two functions:

- ``add_parser(subparsers) -> argparse.ArgumentParser``: add its subcommand
  to the ``add_subparsers()`` object it is given (``subparsers.add_parser(NAME,
  help=..., description=...)``) with its options, and return that parser;
- ``run(args: argparse.Namespace) -> int``: run it; the return value is the
  exit code (``cronoq.cli.ExitCode``).

The module is imported only when its subcommand is the one being run, so a
missing optional dependency costs the other commands nothing; ``cronoq
--help`` lists it from this table without importing it. When the import
fails, ``cronoq`` says which extra to install and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, cast

from .exits import CliError, ExitCode

__all__ = ["Plugin", "PLUGINS", "load"]


@dataclass(frozen=True)
class Plugin:
    name: str             # the subcommand
    module: str           # exposes add_parser(subparsers) and run(args)
    help: str             # one line for `cronoq --help`
    extra: str | None     # the extra that brings the module's dependencies


PLUGINS: tuple[Plugin, ...] = (
    Plugin("demo", "cronoq.demo_cli", "run a mixed workload through an in-process scheduler and report", None),
    Plugin("mcp", "cronoq.mcp.cli", "serve the scheduler's tools to AI assistants (Model Context Protocol)", "mcp"),
    Plugin("simulate", "cronoq.whatif.cli", "what-if: replay a workload against other pool settings", "whatif"),
)


def load(plugin: Plugin) -> ModuleType:
    """Import the plugin's module; a ``CliError`` (exit 2) naming what to install if it cannot be."""
    try:
        module = importlib.import_module(plugin.module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        hint = (f"; install it with: pip install 'cronoq[{plugin.extra}]'" if plugin.extra
                else "; reinstall cronoq")
        raise CliError(ExitCode.USAGE, f"`cronoq {plugin.name}` is not available here ({plugin.module} could not "
                                       f"be imported: missing {missing}){hint}") from None
    for function in ("add_parser", "run"):
        if not callable(getattr(module, function, None)):
            raise CliError(ExitCode.USAGE, f"`cronoq {plugin.name}`: {plugin.module} has no {function}() "
                                           f"(see docs/cli.md)")
    return module


def add(plugin: Plugin, module: ModuleType, subparsers: Any) -> None:
    parser = module.add_parser(subparsers)
    if not isinstance(parser, argparse.ArgumentParser):
        raise CliError(ExitCode.USAGE, f"`cronoq {plugin.name}`: {plugin.module}.add_parser() must return the "
                                       f"parser it added")
    run = cast(Callable[[argparse.Namespace], int], module.run)
    parser.set_defaults(handler=run, command=plugin.name)


def add_placeholder(plugin: Plugin, subparsers: Any) -> None:
    """List the subcommand in ``--help`` without importing its module."""
    subparsers.add_parser(plugin.name, help=plugin.help, add_help=False)
