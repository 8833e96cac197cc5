"""``cronoq-llm-worker --config llm.toml``: serve a pool of a cronoq-server
with LLM calls (see docs/howto/llm-workloads.md for the file)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import logging.config
import os
import sys

from .config import LLMConfig
from .worker import LLMWorker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cronoq-llm-worker", description=__doc__)
    parser.add_argument("--config", required=True, help="the worker's TOML file")
    parser.add_argument("--target", help="the server's gRPC address (overrides [worker] target)")
    parser.add_argument("--slots", type=int, help="requests in flight (overrides [worker] slots)")
    args = parser.parse_args(argv)
    # The process is ours: cronoq's loggers write to standard error.
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "plain"}},
        "loggers": {"cronoq": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
    })
    try:
        config = LLMConfig.load(args.config)
        if args.target:
            config.target = args.target
        if args.slots:
            config.slots = args.slots
        # The worker token from the environment, never from the file.
        config.token = config.token or os.environ.get("CRONOQ_TOKEN")
        worker = LLMWorker(config)
        # Start-up's objects live as long as the process: a full collection that scanned
        # them took about 25 ms, a stall of every request in flight (as cronoq-server does).
        gc.freeze()
        asyncio.run(worker.run())
    except (OSError, ValueError) as exc:
        print(f"cronoq-llm-worker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
