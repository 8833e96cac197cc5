"""What one refresh and one frame of ``cronoq top`` cost, by the number of live tasks.

    python bench/cli_top.py                          # 0, 1,000, 10,000 and 100,000 live tasks
    python bench/cli_top.py --sizes 0,10000 --rounds 20

A ``cronoq-server`` process (in memory, no auth) with one pool and no
workers, so every task submitted stays live (ready). At each size, in the
benchmark process, a ``TopView`` (the view ``cronoq top`` draws) is timed:

- refresh: one round of top's calls (Snapshot, ListWorkers, ListRecurring and
  the live-task pages: running first, then waiting, up to ``--tasks``),
  through the same ``Connection`` as the command;
- frame: drawing the view (pools, workers, schedules, ``--tasks`` tasks, 200
  events) into a 160 x 50 Rich console writing to memory.

Medians (and minimums) of ``--rounds`` repetitions. Not a test: nothing here
asserts. The machine is shared and noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from cronoq._proto import cronoq_pb2 as pb  # noqa: E402
from cronoq.cli.connection import settings_from  # noqa: E402
from cronoq.cli.remote import Connection  # noqa: E402
from cronoq.cli.top import EVENTS_KEPT, TopView  # noqa: E402
from cronoq.client import Client  # noqa: E402


def start_server(directory: Path) -> tuple[subprocess.Popen[str], str]:
    config = directory / "bench.toml"
    config.write_text('[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 1\n'
                      '[limits]\nmax_tasks_per_batch = 10000\n'
                      '[[pools]]\nname = "batch"\n')
    server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert server.stderr is not None
    port = None
    while True:
        line = server.stderr.readline()
        if not line:
            raise RuntimeError("the server exited")
        match = re.search(r"listening: grpc [^ ]+:(\d+)", line)
        if match:
            port = match.group(1)
        if port is not None and "serving as the leader" in line:
            break
    # Drain the log from now on, so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()   # type: ignore[union-attr]
    return server, f"127.0.0.1:{port}"


def _events(count: int) -> list[pb.StatusEvent]:
    now = time.time_ns()
    return [pb.StatusEvent(id=i + 1, pool="batch", status=pb.TASK_STATUS_READY, attempt=0, key=f"bulk-{i}",
                           at_unix_ns=now) for i in range(count)]


async def measure(target: str, sizes: list[int], rounds: int, task_limit: int) -> list[dict[str, float]]:
    args = argparse.Namespace(server=target)
    conn = Connection(settings_from(args, {}))
    console = Console(width=160, height=50, file=io.StringIO(), color_system="truecolor", force_terminal=True)
    view = TopView(conn, pools=[], interval=1.0, task_limit=task_limit, console=console)
    view.events.events.extend(_events(EVENTS_KEPT))
    view.events.state = "live"
    rows = []
    submitted = 0
    try:
        async with Client(target) as client:
            for size in sizes:
                while submitted < size:
                    batch = min(10_000, size - submitted)
                    await client.submit_batch([{"payload": b"", "pool": "batch", "key": f"bulk-{submitted + i}"}
                                               for i in range(batch)])
                    submitted += batch
                refreshes, frames = [], []
                for _ in range(rounds):
                    begin = time.perf_counter()
                    await view.refresh()
                    refreshes.append(time.perf_counter() - begin)
                    begin = time.perf_counter()
                    console.print(view.render())
                    frames.append(time.perf_counter() - begin)
                    console.file = io.StringIO()
                assert view.snapshot.error is None and view.tasks.error is None, (view.snapshot.error,
                                                                                   view.tasks.error)
                live = view.snapshot.data.live_tasks
                rows.append({"live": live, "shown": len(view.tasks.data),
                             "refresh_p50": statistics.median(refreshes), "refresh_min": min(refreshes),
                             "frame_p50": statistics.median(frames), "frame_min": min(frames)})
    finally:
        await conn.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,1000,10000,100000", help="live task counts, ascending")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=200, help="top's --tasks")
    options = parser.parse_args()
    sizes = sorted(int(s) for s in options.sizes.split(","))
    print(f"CPython {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"--tasks {options.tasks}, {options.rounds} rounds, medians (minimums) in ms")
    with tempfile.TemporaryDirectory() as directory:
        server, target = start_server(Path(directory))
        try:
            rows = asyncio.run(measure(target, sizes, options.rounds, options.tasks))
        finally:
            server.terminate()
            server.wait(20)
    print(f"{'live tasks':>10}  {'shown':>5}  {'refresh':>15}  {'frame':>15}")
    for row in rows:
        print(f"{row['live']:>10,}  {row['shown']:>5}  {row['refresh_p50'] * 1e3:7.2f} ({row['refresh_min'] * 1e3:5.2f})"
              f"  {row['frame_p50'] * 1e3:7.2f} ({row['frame_min'] * 1e3:5.2f})")


if __name__ == "__main__":
    main()
