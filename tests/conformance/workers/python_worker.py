"""The Python conformance worker: the contract of tests/conformance/README.md,
written with cronoq.client.Worker and nothing below it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cronoq import Permanent, Retryable
from cronoq.client import Lease, Reject, Worker


def say(line: str) -> None:
    print(line, flush=True)


async def stages(lease: Lease, request: dict[str, Any]) -> dict[str, Any]:
    restored = dict(lease.checkpoints)   # what earlier attempts saved, as this lease brought it
    ran: list[str] = []
    for stage in request["stages"]:
        if stage in restored:
            continue
        if lease.attempt == 1 and len(ran) == request["fail_after"]:
            raise Retryable(f"failed after {len(ran)} stages")
        await lease.checkpoint(stage, {"stage": stage})
        ran.append(stage)
    return {"ran": ran, "resumed_from": lease.resumed_from, "restored": restored}


async def handle(lease: Lease) -> Any:
    say(f"started {lease.task_id} {lease.attempt}")
    request = lease.json()
    do = request.get("do")
    if do == "echo":
        return request["value"]
    if do == "retry":
        if lease.attempt < request["until"]:
            raise Retryable(f"not yet: attempt {lease.attempt}", retry_after=request["retry_after_s"])
        return {"attempt": lease.attempt}
    if do == "throw":
        raise RuntimeError(request["message"])
    if do == "permanent":
        raise Permanent(request["message"])
    if do == "sleep":
        if lease.attempt >= request.get("until", lease.attempt + 1):
            return "slept"
        try:
            await asyncio.sleep(request["seconds"])
        except asyncio.CancelledError:
            # The worker cancels the handler when the server gives the attempt up.
            say(f"aborted {lease.task_id} {lease.attempt} {lease.abort_reason}")
            raise
        return "slept"
    if do == "reject":
        raise Reject(request["message"])
    if do == "stages":
        return await stages(lease, request)
    raise Permanent(f"unknown do: {do}")


async def announce_when_connected(worker: Worker) -> None:
    # The Python worker has no connect hook: `connected` is its public flag.
    while not worker.connected:
        await asyncio.sleep(0.01)
    say("ready")


async def main() -> None:
    environ = os.environ
    worker = Worker(environ["CRONOQ_TARGET"], environ["CRONOQ_POOL"], handle, slots=int(environ["CRONOQ_SLOTS"]),
                    token=environ["CRONOQ_TOKEN"], name=environ["CRONOQ_WORKER_NAME"],
                    grace=float(environ["CRONOQ_DRAIN_TIMEOUT_S"]), initial_backoff=0.05, max_backoff=0.5)
    ready = asyncio.create_task(announce_when_connected(worker))
    try:
        await worker.run()   # SIGTERM drains it (handle_signals), then run() returns
    finally:
        ready.cancel()


if __name__ == "__main__":
    asyncio.run(main())
