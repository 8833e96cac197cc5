"""``cronoq``'s parser and entry point: global options, the built-in
subcommands, the contributed ones (plugins.py), and the exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .._version import __version__
from .connection import Settings, add_connection_arguments, settings_from
from .exits import CliError, ExitCode, exit_code_for
from ..core.options import OVERLAP_POLICIES, TASK_OPTIONS
from .output import STATUS_NAMES, Output
from . import plugins

__all__ = ["main", "build_parser"]

# Commands that run until interrupted: Ctrl-C is how they end, not an error.
_ENDED_BY_INTERRUPT = {"watch", "top"}


def main(argv: Sequence[str] | None = None, prog: str = "cronoq") -> int:
    """Run ``cronoq ARGS``; returns the exit code (docs/cli.md#exit-codes).
    ``prog`` is the name usage lines give (``python -m cronoq`` runs it too)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    out = Output()
    try:
        parser = build_parser(_command_of(arguments), prog=prog)
    except CliError as exc:
        out.error(f"cronoq: {exc.message}")
        return exc.code
    args = parser.parse_args(arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return int(handler(args))
    except CliError as exc:
        out.error(f"cronoq: {exc.message}")
        return exc.code
    except KeyboardInterrupt:
        return ExitCode.OK if args.command in _ENDED_BY_INTERRUPT else ExitCode.INTERRUPTED


# ---------------------------------------------------------------- running a command against the server


def _server_command(name: str) -> Callable[[argparse.Namespace], int]:
    """A handler that connects, runs the command ``name`` (a function of
    commands.py, or top) and maps what it raises to an exit code. The
    modules that need grpc are imported here, not when parsing."""

    def handler(args: argparse.Namespace) -> int:
        out = Output()
        settings = settings_from(args)
        for warning in settings.warnings():
            out.error(warning)
        try:
            from .remote import Connection
            if name == "top":
                from .top import run_top as command
            else:
                from . import commands
                command = getattr(commands, name)
        except ImportError as exc:   # grpc or protobuf missing
            raise CliError(ExitCode.USAGE, f"`cronoq {args.command}` needs the client library (missing "
                                           f"{getattr(exc, 'name', None) or exc}); install it with: "
                                           f"pip install 'cronoq[cli]'") from None

        async def run() -> int:
            connection = Connection(settings)
            try:
                return await command(connection, args, out)
            finally:
                await connection.close()

        try:
            import asyncio   # (not at start-up: --help and --version need no event loop)

            return asyncio.run(run())
        except BrokenPipeError:
            _quiet_stdout()
            return ExitCode.ERROR
        except (CliError, KeyboardInterrupt):
            raise
        except Exception as exc:   # the call failed: say why, exit with its code
            code = exit_code_for(exc)
            out.error(f"cronoq: {_describe(exc, code, settings)}")
            return code

    return handler


def _list_environments(args: argparse.Namespace) -> int:
    """``cronoq environments``: the catalog, read here (no server is asked)."""
    import os

    from .connection import read_catalog

    out = Output()
    path, catalog = read_catalog(args, os.environ)
    if getattr(args, "output", "text") == "json":
        out.json({"catalog": path, "environments": [
            {key: value for key, value in e.as_json().items() if key != "current"} for e in catalog]})
        return ExitCode.OK
    out.table(("NAME", "REGION", "HTTP", "GRPC", "DESCRIPTION"),
              [(e.name, e.region or "-", e.http or "-", e.grpc or "-", e.description) for e in catalog])
    return ExitCode.OK


def _describe(exc: BaseException, code: ExitCode, settings: Settings) -> str:
    text = str(exc) or type(exc).__name__
    if code == ExitCode.UNAVAILABLE:
        return (f"the server at {settings.url} is unavailable: {text} (retried for {settings.retry_for:g} s; "
                f"see --retry-for)")
    if code == ExitCode.ACCESS_DENIED:
        return f"access denied: {text}"
    if code == ExitCode.TIMEOUT:
        return f"timed out: {text}"
    if code == ExitCode.ERROR and not isinstance(exc, Exception):
        return text
    return text


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- the parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a global
    option or its value), so that only its plugin module gets imported."""
    with_value = {"-o", "--output", "--server", "--env", "--environments", "--tls-ca", "--tls-cert", "--tls-key",
                  "--retry-for"}
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if word.startswith("-"):
            skip = word in with_value
            continue
        return word
    return None


def _global_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("text", "json"), default=argparse.SUPPRESS,
                        help="text for people (default), or json: one JSON document shaped like the HTTP API, "
                             "with ids and nanosecond times as strings (watch: one per line)")
    add_connection_arguments(parser)


def build_parser(chosen: str | None = None, prog: str = "cronoq") -> argparse.ArgumentParser:
    """The parser; ``chosen`` is the subcommand about to run (if a plugin's, its module is imported)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="The cronoq command line: see the scheduler at work with `cronoq demo`; "
                               "drive a cronoq-server: submit and follow tasks, look at workers, schedules "
                               "and pools, and watch it all live with `cronoq top`.",
        epilog="The token comes from $CRONOQ_TOKEN; exit codes and every option: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"cronoq {__version__}")
    _global_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    _global_arguments(common)

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=description or help)
        p.set_defaults(handler=_server_command(name))
        return p

    p = command("submit", "submit a task; prints its id (with --wait, its output)",
                "Submit a task. PAYLOAD is sent as UTF-8 text; with --json it must be JSON (checked here "
                "first) and is sent as application/json; --file PATH (or - for standard input) sends the "
                "file's bytes as application/octet-stream.")
    _payload_arguments(p)
    _task_arguments(p, template=False)
    p.add_argument("--wait", action="store_true",
                   help="wait until the task finished and print its output (unchanged when redirected)")
    p.add_argument("--wait-timeout", metavar="SECONDS", type=_seconds,
                   help="with --wait: give up waiting after this long (exit 5; the task keeps running)")

    p = command("get", "show a task", "Show a task, by id or by --key.")
    _ref_arguments(p)
    p = command("explain", "say why a task waits",
                "Say why a task is not running yet, from the leader's engine: its dispatch score, its place in "
                "its pool's line and every reason it waits (dependencies, awaited keys, start times and "
                "retry backoffs, worker labels, resources, held slots, fair share, a full pool).")
    _ref_arguments(p)
    p = command("dependents", "list the tasks that depend on a task",
                "List the tasks that depend on a task (by after or deps), nearest first: those of a task that "
                "has not ended from the leader's engine, those of a finished one while the leader remembers "
                "them (outputs.info_entries).")
    _ref_arguments(p)
    p.add_argument("--depth", type=_count(1, 5), default=1, metavar="N",
                   help="levels down: 1 (default) its direct dependents, 2 also theirs, ... at most 5")
    p.add_argument("--limit", type=_count(1, 100_000), default=100, metavar="N",
                   help="dependents at most (default 100; the server caps it at its limits.max_list)")
    p = command("wait", "wait for a task and print its output",
                "Wait until a task finished and print its output: unchanged when standard output is a file "
                "or a pipe, with control characters escaped on a terminal. Exit 4 if it did not succeed.")
    _ref_arguments(p)
    p.add_argument("--timeout", metavar="SECONDS", type=_seconds,
                   help="give up after this long (exit 5; the task keeps running); default: wait until it ends")
    p = command("cancel", "cancel a task")
    _ref_arguments(p)

    p = command("tasks", "list tasks",
                "List tasks in id order, oldest first: live ones from the scheduler, finished ones while the "
                "server keeps them.")
    p.add_argument("--pool", action="append", default=[], metavar="POOL",
                   help="only these pools (repeatable, or comma-separated)")
    p.add_argument("--status", action="append", default=[], metavar="STATUS",
                   help=f"only these statuses (repeatable, or comma-separated): "
                        f"{', '.join(s for s in STATUS_NAMES.values() if s != 'unspecified')}")
    p.add_argument("--limit", type=_count(1, 100_000), default=100, metavar="N",
                   help="tasks per page (default 100; the server caps it at its limits.max_list)")
    p.add_argument("--after", type=_after_id, default=0, metavar="ID",
                   help="only tasks with larger ids (default 0: from the first)")
    p.add_argument("--all", action="store_true", help="follow every page to the end")

    p = command("workers", "list connected workers (metrics role)")
    p.add_argument("--pool", action="append", default=[], metavar="POOL", help="only these pools")
    command("schedules", "list recurring schedules (metrics role)")

    p = command("schedule", "add or remove a recurring schedule (admin role)")
    schedule = p.add_subparsers(dest="schedule_action", required=True, metavar="ACTION")
    add = schedule.add_parser("add", parents=[common], help="register or replace a cron schedule",
                              description="Register a cron schedule, or replace the one of that name. Each "
                                          "occurrence is a task built from the options below; --key is the "
                                          "prefix of each occurrence's key.")
    add.add_argument("name", metavar="NAME")
    add.add_argument("cron", metavar="CRON", help="five fields, or six with seconds first; @daily and friends")
    _payload_arguments(add)
    _task_arguments(add, template=True)
    add.add_argument("--tz", default="UTC", help="IANA time zone of the cron expression (default UTC)")
    add.add_argument("--overlap", choices=OVERLAP_POLICIES, default=OVERLAP_POLICIES[0],
                     help="when the previous occurrence still runs (default skip)")
    remove = schedule.add_parser("remove", parents=[common], help="remove a schedule")
    remove.add_argument("name", metavar="NAME")

    command("snapshot", "pools, waits, utilization and totals (metrics role)")

    p = sub.add_parser("environments", parents=[common], help="list the catalog of environments (no server needed)",
                       description="List the environments of the catalog (--environments FILE, "
                                   "$CRONOQ_ENVIRONMENTS, or ~/.config/cronoq/environments.toml): the names "
                                   "--env takes, with their region, HTTP URL and gRPC target.")
    p.set_defaults(handler=_list_environments)

    p = command("watch", "print status changes as they happen, until Ctrl-C",
                "Print tasks' status changes as they happen (terminal ones only, unless --all), until "
                "Ctrl-C; reconnects by itself after errors and leader changes.")
    p.add_argument("--pool", action="append", default=[], metavar="POOL", help="only these pools")
    p.add_argument("--all", action="store_true", help="every transition, not only the terminal ones")

    p = command("top", "a live full-screen view of pools, workers, schedules, tasks and events",
                "A full-screen view refreshed every --interval seconds. Keys: q quits, r refreshes now.")
    p.add_argument("--pool", action="append", default=[], metavar="POOL",
                   help="limit the task and event panes to these pools")
    p.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes (default 1)")
    p.add_argument("--tasks", type=_count(0, 10_000), default=200, metavar="N",
                   help="live tasks to fetch, running first (default 200)")

    for plugin in plugins.PLUGINS:
        if plugin.name == chosen:
            plugins.add(plugin, plugins.load(plugin), sub)
        else:
            plugins.add_placeholder(plugin, sub)
    return parser


# ---------------------------------------------------------------- argument types and groups


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {text!r}") from None
    if not 0 <= value <= 31_536_000:
        raise argparse.ArgumentTypeError(f"seconds between 0 and a year, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value < 0.05:
        raise argparse.ArgumentTypeError(f"at least 0.05 seconds, got {text!r}")
    return value


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"between {low} and {high}, got {value}")
        return value
    return parse


def _task_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 2 ** 64:
        raise argparse.ArgumentTypeError(f"a task id is a number from 1 to 2^64-1, got {text!r} "
                                         f"(use --key KEY to name a task by its key)")
    return int(text)


def _after_id(text: str) -> int:
    """A task id, or 0 (before every task: the first page)."""
    return 0 if text.isascii() and text.isdigit() and int(text) == 0 else _task_id(text)


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"NAME=VALUE, got {text!r}")
    return name, value


def _ref_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("id", nargs="?", type=_task_id, metavar="ID", help="the task's id")
    group.add_argument("--key", help="name the task by its key instead")


def _payload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("payload", nargs="?", metavar="PAYLOAD", help="the payload, as UTF-8 text (or JSON with --json)")
    p.add_argument("--json", action="store_true", help="the payload (or --file) is JSON: checked, sent as "
                                                       "application/json")
    p.add_argument("--file", metavar="PATH", help="send this file's bytes as the payload (- for standard input)")
    p.add_argument("--content-type", metavar="TYPE", help="the content type the worker sees (overrides the above)")


def _task_arguments(p: argparse.ArgumentParser, *, template: bool) -> None:
    """The flags of the task options that have one (cronoq.core.options);
    a recurring template's only those it may set."""
    for opt in TASK_OPTIONS:
        if opt.cli is None or (template and not opt.template):
            continue
        text = opt.doc.replace("`", "")
        if opt.default not in ("None", "()", "{}"):
            text += f" (default {opt.default.replace('`', '')})"
        if opt.kind == "choice":
            p.add_argument(opt.cli, choices=opt.choices, help=text)
        elif opt.kind == "seconds":
            p.add_argument(opt.cli, type=_seconds, metavar=opt.metavar, help=text)
        elif opt.kind == "pairs":
            p.add_argument(opt.cli, action="append", default=[], type=_pair, metavar=opt.metavar,
                           help=f"{text} (repeatable)")
        elif opt.kind == "refs":
            p.add_argument(opt.cli, action="append", default=[], metavar=opt.metavar,
                           help=f"{text}: an id, or a key (repeatable)")
        else:
            p.add_argument(opt.cli, help=text)


