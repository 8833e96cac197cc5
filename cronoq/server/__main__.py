"""``cronoq-server`` / ``python -m cronoq.server``: run the server, or check
a configuration (``--check``), or print the API definition (``--print-proto``)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import logging.config
import os
import sys

from .config import ConfigError, ServerConfig, default_config, load
from .environment import check_environment

EXIT_CONFIG = 2    # invalid configuration or environment
EXIT_FAILED = 1    # could not start (a port taken, the store unreachable...)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq-server", description="Run the cronoq scheduler as a service (gRPC API, remote workers).")
    parser.add_argument("--config", metavar="PATH", default=os.environ.get("CRONOQ_CONFIG"),
                        help="the TOML configuration (default: $CRONOQ_CONFIG; without one: a single pool "
                             "'default', in-memory state, loopback listeners, no authentication)")
    parser.add_argument("--check", action="store_true",
                        help="run every check that startup runs before it listens (the file, tokens and "
                             "their variables, TLS files, loopback rules) and exit: 0 and 'configuration is "
                             "valid', or the errors and 2")
    parser.add_argument("--shard", metavar="NAME", default=os.environ.get("CRONOQ_SHARD"),
                        help="with [[shards]] in the configuration: the shard this server runs (stands for "
                             "server.shard; default: $CRONOQ_SHARD)")
    parser.add_argument("--print-proto", action="store_true", help="print the gRPC API definition (cronoq.proto)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="allow listening on non-loopback addresses without credentials (trusted networks only)")
    parser.add_argument("--log-level", default=os.environ.get("CRONOQ_LOG_LEVEL", "info"),
                        choices=("debug", "info", "warning", "error"), help="log verbosity (default info)")
    return parser


def _config(path: str | None, shard: str | None) -> ServerConfig:
    if not path:
        if shard is not None:
            raise ConfigError([f"--shard {shard}: shards are defined in a configuration file ([[shards]]); "
                               f"pass --config"])
        return default_config()
    return load(path, shard=shard)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.print_proto:
        from .._proto import proto_text
        sys.stdout.write(proto_text())
        return 0
    try:
        config = _config(args.config, args.shard)
    except ConfigError as exc:
        print(f"cronoq-server: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        # Every check startup makes before it opens a socket, with the same verdict.
        try:
            check_environment(config, insecure_no_auth=args.insecure_no_auth,
                              warn=lambda text: print(f"cronoq-server: warning: {text}", file=sys.stderr))
        except ConfigError as exc:
            print(f"cronoq-server: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        print("configuration is valid")
        return 0
    # The process is ours: cronoq's loggers write to standard error.
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "plain"}},
        "loggers": {"cronoq": {"handlers": ["stderr"], "level": args.log_level.upper(), "propagate": False}},
    })
    try:
        from .app import BindError, Server
    except ImportError as exc:
        print(f"cronoq-server needs the server extra: pip install 'cronoq[server]' ({exc})", file=sys.stderr)
        return EXIT_FAILED
    server = Server(config, insecure_no_auth=args.insecure_no_auth)
    # What start-up made (modules, grpc, protobuf, the config) lives as long as the process:
    # the collector stops scanning it, so that a full collection is a few ms, not a 40-50 ms
    # stall of every dispatch (bench/README.md, "The LLM worker").
    gc.freeze()
    try:
        return asyncio.run(server.run())
    except ConfigError as exc:
        print(f"cronoq-server: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except BindError as exc:
        print(f"cronoq-server: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
