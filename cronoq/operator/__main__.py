"""``cronoq-operator`` / ``python -m cronoq.operator``."""

from __future__ import annotations

import argparse
import asyncio
import logging.config
import os
import sys

from .config import ConfigError, load_config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cronoq-operator", description=(
        "Scale worker Deployments from their cronoq pool's desired capacity (CronoqWorkerScaler resources)."))
    parser.add_argument("--config", default=os.environ.get("CRONOQ_OPERATOR_CONFIG"),
                        help="the operator's TOML configuration (default $CRONOQ_OPERATOR_CONFIG)")
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable); default: every namespace")
    parser.add_argument("--check", action="store_true", help="check the configuration and exit")
    parser.add_argument("--log-level", default=os.environ.get("CRONOQ_LOG_LEVEL", "info"),
                        choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    # The process is ours: cronoq's and kopf's loggers write to standard error.
    level = args.log_level.upper()
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "plain"}},
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        # kopf logs every watch event at info (each status write is one): only its problems, unless debugging.
        "loggers": {"cronoq": {"level": level}, "kopf": {"level": "DEBUG" if level == "DEBUG" else "WARNING"}},
    })
    if not args.config:
        parser.error("--config (or $CRONOQ_OPERATOR_CONFIG) is required")
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"cronoq-operator: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"configuration is valid: {len(config.servers)} server(s)")
        return 0

    from .app import Operator, run_operator
    from .kube import KubernetesAPI
    from .reader import SnapshotReader

    async def serve() -> None:
        reader = SnapshotReader(config)
        try:
            await run_operator(Operator(reader, KubernetesAPI()), namespaces=args.namespace)
        finally:
            await reader.close()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
