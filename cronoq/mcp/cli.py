"""``cronoq-mcp`` (and ``cronoq mcp``): run the MCP server over stdio or
streamable HTTP.

``add_parser(subparsers)`` adds the ``mcp`` subcommand to another program's
argparse parser and ``run(args)`` runs it, so the ``cronoq`` command line can
delegate to this module; ``main()`` is the standalone console script.

Tokens never appear on the command line (other users can read it): the
cronoq-server token comes from ``$CRONOQ_TOKEN`` and the gateway's own access
token from ``$CRONOQ_MCP_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import logging.config
import os
import sys
from pathlib import Path
from typing import Any

from ..loopback import is_loopback

__all__ = ["add_parser", "run", "main", "SERVER_ENV", "TOKEN_ENV", "ACCESS_TOKEN_ENV", "DEFAULT_SERVER"]

SERVER_ENV = "CRONOQ_SERVER"
TOKEN_ENV = "CRONOQ_TOKEN"
ACCESS_TOKEN_ENV = "CRONOQ_MCP_TOKEN"
DEFAULT_SERVER = "127.0.0.1:7070"
EXIT_USAGE = 2     # invalid options or environment
EXIT_FAILED = 1    # could not start (an address in use, a missing extra)

DESCRIPTION = ("Run a Model Context Protocol server that lets AI agents drive a cronoq-server: tools to submit, "
               "follow, cancel, explain and schedule tasks, live resources and ready-made prompts.")
EPILOG = (f"environment: {SERVER_ENV} (the server, default {DEFAULT_SERVER}), {TOKEN_ENV} (the cronoq-server "
          f"token; its role applies), {ACCESS_TOKEN_ENV} (with --http: the token clients of this gateway must "
          "send as 'Authorization: Bearer'), CRONOQ_LOG_LEVEL. Logs go to standard error; with stdio, standard "
          "output carries only the protocol.")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", metavar="TARGET", default=None,
                        help=f"the cronoq-server gRPC address: host:port, or https://host:port for TLS "
                             f"(default ${SERVER_ENV}, else {DEFAULT_SERVER})")
    parser.add_argument("--http", metavar="HOST:PORT", default=None,
                        help="serve streamable HTTP on this address instead of stdio (port 0 picks a free "
                             f"port, logged); needs ${ACCESS_TOKEN_ENV} unless --no-access-token")
    parser.add_argument("--path", default="/mcp", help="with --http: the endpoint's path (default /mcp)")
    parser.add_argument("--no-access-token", action="store_true",
                        help="with --http on a loopback address: accept clients without an access token")
    parser.add_argument("--ca-file", metavar="PEM", type=Path,
                        help="TLS to the server with this CA (implies TLS), for a private CA")
    parser.add_argument("--cert-file", metavar="PEM", type=Path, help="client certificate for mTLS (with --key-file)")
    parser.add_argument("--key-file", metavar="PEM", type=Path, help="its private key")
    parser.add_argument("--traces", metavar="DIR", type=Path,
                        help="a directory of recorded workloads (what-if traces): adds the what_if tool, which "
                             "replays them against other policies (needs cronoq's simulator, cronoq.whatif)")
    parser.add_argument("--log-level", default=os.environ.get("CRONOQ_LOG_LEVEL", "info").lower(),
                        choices=("debug", "info", "warning", "error"), help="log verbosity (default info)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``mcp`` subcommand to ``subparsers`` (from ``add_subparsers()``);
    the caller runs ``run(args)`` when it is chosen."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "mcp", help="run the MCP server for AI agents", description=DESCRIPTION, epilog=EPILOG)
    _add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronoq-mcp", description=DESCRIPTION, epilog=EPILOG)
    _add_arguments(parser)
    return parser


class UsageError(Exception):
    pass


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--http must be HOST:PORT (e.g. 127.0.0.1:8811), got {text!r}")
    return host, int(port)


def _credentials(args: argparse.Namespace) -> Any:
    if args.ca_file is None and args.cert_file is None and args.key_file is None:
        return None
    if (args.cert_file is None) != (args.key_file is None):
        raise UsageError("--cert-file and --key-file go together")
    import grpc

    def read(path: Path | None, option: str) -> bytes | None:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{option}: cannot read {path}: {exc.strerror}") from None

    return grpc.ssl_channel_credentials(read(args.ca_file, "--ca-file"), read(args.key_file, "--key-file"),
                                        read(args.cert_file, "--cert-file"))


def _configure_logging(level: str) -> None:
    # Standard error only: with stdio, standard output is the protocol. Configured before the
    # SDK's MCPServer, whose own logging setup then finds the root logger taken and leaves it.
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "plain"}},
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {name: {"level": level.upper()} for name in ("cronoq", "mcp", "uvicorn")},
    })


def run(args: argparse.Namespace) -> int:
    """Run the MCP server as ``args`` say (from ``add_parser``'s options); the exit status."""
    try:
        from ..client import Client
        from .http import MIN_TOKEN_LENGTH, serve_http
        from .server import build_server
    except ImportError as exc:
        print(f"cronoq mcp needs the mcp extra: pip install 'cronoq[mcp]' ({exc})", file=sys.stderr)
        return EXIT_FAILED
    env = os.environ
    target = args.server or env.get(SERVER_ENV) or DEFAULT_SERVER
    token = env.get(TOKEN_ENV) or None
    try:
        credentials = _credentials(args)
        if target.startswith("http://") and credentials is not None:
            raise UsageError("TLS options need an https:// server address (or a plain host:port)")
        client = Client(target, token=token, credentials=credentials, retry_for=0)
        http = _address(args.http) if args.http is not None else None
        access_token = env.get(ACCESS_TOKEN_ENV) or None
        if http is not None:
            if not args.path.startswith("/"):
                raise UsageError(f"--path must start with '/', got {args.path!r}")
            if access_token is None and not args.no_access_token:
                raise UsageError(f"--http needs an access token for the gateway's clients in ${ACCESS_TOKEN_ENV} "
                                 "(or --no-access-token on a loopback address)")
            if access_token is not None and args.no_access_token:
                raise UsageError(f"--no-access-token given, but ${ACCESS_TOKEN_ENV} is set: choose one")
            if args.no_access_token and not is_loopback(http[0]):
                raise UsageError(f"--no-access-token is only allowed on a loopback address, not {http[0]}")
            if access_token is not None and len(access_token) < MIN_TOKEN_LENGTH:
                raise UsageError(f"${ACCESS_TOKEN_ENV} must have at least {MIN_TOKEN_LENGTH} characters")
        elif args.no_access_token:
            raise UsageError("--no-access-token applies to --http only")
        if args.traces is not None:
            from .whatif import simulator
            if simulator() is None:
                raise UsageError("--traces needs cronoq's simulator (cronoq.whatif), which this installation "
                                 "does not have")
            if not args.traces.is_dir():
                raise UsageError(f"--traces: {args.traces} is not a directory")
    except (UsageError, ValueError) as exc:
        print(f"cronoq-mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(args.log_level)
    log = logging.getLogger("cronoq.mcp")
    app = build_server(client, traces=args.traces)
    log.info("driving cronoq-server at %s (%s)", target,
             f"with the token from ${TOKEN_ENV}" if token else f"no token: ${TOKEN_ENV} is not set")

    async def serve() -> None:
        try:
            if http is None:
                await app.run_stdio_async()
            else:
                await serve_http(app, host=http[0], port=http[1], path=args.path, access_token=access_token,
                                 access_log=args.log_level == "debug")
        finally:
            await client.close()

    try:
        asyncio.run(serve())
    except OSError as exc:
        print(f"cronoq-mcp: cannot listen on {args.http}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``cronoq-mcp`` console script."""
    return run(_parser().parse_args(argv))
