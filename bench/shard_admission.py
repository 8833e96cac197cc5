"""A shard's admission path beside an unsharded server's, in one process.

``bench/server.py --shards`` reads the servers' CPU from /proc, in clock
ticks (10 ms: half a microsecond per task over 20,000 tasks) and under
whatever else runs on the machine. This drives the gRPC servicer's
``SubmitBatch`` directly instead (no sockets; a stand-in for grpcio's
context): an unsharded server's service and shard b's (the configuration of
``bench/server.py --shards``: a serves pool default, b pools gpu and idle),
each with its running scheduler, both in this process. Batches of
``--batch`` no-op tasks into pool idle (b's own: the call lands on the right
shard) go to the two in turn, parsed from the wire and their answers
serialized, the order alternating; each batch is timed alone. The figures
are the low quantiles of the time per task over ``--batches`` batches each:
noise only adds time, so they compare the two paths' own cost.

    python bench/shard_admission.py [--batches 300] [--batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import _shard_config  # noqa: E402
from cronoq._proto import cronoq_pb2 as pb  # noqa: E402
from cronoq.server.app import Server  # noqa: E402
from cronoq.server.auth import Authenticator  # noqa: E402
from cronoq.server.config import load  # noqa: E402
from cronoq.server.grpc_api import TasksServicer  # noqa: E402
from cronoq.server.remote import WorkerHub  # noqa: E402
from cronoq.server.service import Service  # noqa: E402
from cronoq.server.shards import ShardedService  # noqa: E402


class Context:
    """What the servicer asks of grpcio's context on a call that succeeds."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-python-asyncio/bench"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def auth_context(self) -> dict[str, Any]:
        return {}

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        raise RuntimeError(f"{code}: {details}")


async def _servicer(path: Path, shard: str | None) -> TasksServicer:
    server = Server(load(path, shard=shard), handle_signals=False)   # (its for_shard() config, as it runs)
    config = server.config
    hub = WorkerHub(config.limits, {p.name: p.lease_ttl_s for p in config.pools}, config.server.standby_close_s)
    service = Service(config, hub) if config.shard is None else ShardedService(config, hub, server.resource_shards)
    sched = server._scheduler(hub, None)
    await sched.start()
    service.lead(sched)
    return TasksServicer(service, Authenticator(config, {}))


async def measure(batches: int, batch: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        servicers = {}
        for name, shard in (("unsharded", None), ("shard b", "b")):
            path = Path(directory) / f"{name.replace(' ', '-')}.toml"
            path.write_text(_shard_config({"a": 1, "b": 2}, shard))   # (nothing listens: the ports are unused)
            servicers[name] = await _servicer(path, shard)
        wire = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="idle", payload=b"") for _ in range(batch)]
                                     ).SerializeToString()
        context: Any = Context()

        async def one(servicer: TasksServicer) -> float:
            t0 = time.perf_counter()
            answer = await servicer.SubmitBatch(pb.SubmitBatchRequest.FromString(wire), context)
            answer.SerializeToString()
            for _ in range(3):   # the scheduler's driver runs the admitted batch
                await asyncio.sleep(0)
            return (time.perf_counter() - t0) / batch * 1e6

        for servicer in servicers.values():   # warm up
            for _ in range(10):
                await one(servicer)
        times: dict[str, list[float]] = {name: [] for name in servicers}
        names = list(servicers)
        gc.disable()   # collected between batches, every 20, not inside one
        try:
            for index in range(batches):
                for name in (names if index % 2 == 0 else names[::-1]):
                    times[name].append(await one(servicers[name]))
                if index % 20 == 19:
                    gc.collect()
        finally:
            gc.enable()
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches timed per setup")
    parser.add_argument("--batch", type=int, default=500, help="tasks per batch")
    args = parser.parse_args()
    load_average = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    times = asyncio.run(measure(args.batches, args.batch))
    print(f"load average before: {load_average}; {args.batches} batches of {args.batch} into pool idle per setup, "
          f"us per task")
    quantiles = {name: (min(v), *(statistics.quantiles(v, n=20)[i] for i in (1, 4)), statistics.median(v))
                 for name, v in times.items()}
    print(f"{'':<10} {'min':>7} {'p10':>7} {'p25':>7} {'median':>7}")
    for name, row in quantiles.items():
        print(f"{name:<10} " + " ".join(f"{x:>7.2f}" for x in row))
    plain, shard = quantiles["unsharded"], quantiles["shard b"]
    print(f"{'ratio':<10} " + " ".join(f"{s / p:>7.3f}" for s, p in zip(shard, plain)) + "   (target <= 1.1)")


if __name__ == "__main__":
    main()
