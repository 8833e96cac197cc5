"""The LLM worker's throughput: cronoq-llm-worker (a process) with SLOTS
slots against tests/openai_fake.py (a process) answering every chat
completion after 50 ms, through a real cronoq-server. This process only
submits and waits. Reports tasks/s end to end (from the submission of the
batch to the last wait's answer) and in steady state (the server's end
times, from the end of the first round of SLOTS tasks to the last end), and
the most requests the fake saw in flight per run; the target is slots / 50
ms within 10 %.

    python bench/llm_worker.py [--slots 16] [--tasks 800] [--runs 5]

``--client`` measures the provider's HTTP client alone instead: SLOTS loops
in this process sending chat completions to the fake (answering at once),
and this process's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cronoq.client import Client  # noqa: E402
from serverkit import LISTEN, ServerProcess, server_env  # noqa: E402

DELAY = 0.05
PLAIN = f"""
import asyncio, sys
from cronoq.client import Worker
async def handle(lease):
    await asyncio.sleep({DELAY})
    return {{"text": "x"}}
asyncio.run(Worker(sys.argv[1], "llm", handle, slots=int(sys.argv[2])).run())
"""


async def one_run(target: str, tasks: int, slots: int) -> tuple[float, float]:
    """(end to end, steady state) tasks/s of one batch (see bench/README.md)."""
    async with Client(target) as client:
        while not [w for w in await client.workers(pools=["llm"])]:
            await asyncio.sleep(0.05)
        started = time.perf_counter()
        subs = await client.submit_batch([{"payload": {"prompt": f"p{i}"}, "pool": "llm", "kind": "llm.chat"}
                                          for i in range(tasks)])
        for sub in subs:
            result = await client.wait(sub.id, timeout=120)
            assert result.ok, result
        end_to_end = tasks / (time.perf_counter() - started)
        # Steady state: the server's end times, from the end of the first round (every slot
        # busy since) to the last end; neither the batch's admission nor these waits count.
        ids = {sub.id for sub in subs}
        ends: list[float] = []
        after = min(ids) - 1
        while after is not None and len(ends) < tasks:
            page = await client.list(pools=["llm"], after=after, limit=1000)
            ends += [t.finished for t in page.tasks if t.id in ids and t.finished is not None]
            after = page.next_after
        ends.sort()
        steady = (len(ends) - slots) / (ends[-1] - ends[slots - 1])
        return end_to_end, steady


def client_cpu(slots: int, requests: int) -> None:
    from cronoq.llm.provider import Provider
    fake = subprocess.Popen([sys.executable, str(ROOT / "tests" / "openai_fake.py"), "--delay", "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=server_env())
    assert fake.stdout is not None and fake.stdin is not None
    port = int(fake.stdout.readline())

    async def measure() -> tuple[float, float]:
        provider = Provider(f"http://127.0.0.1:{port}/v1", max_connections=slots)
        body = {"model": "m", "messages": [{"role": "user", "content": "p1"}]}

        async def loop(count: int) -> None:
            for _ in range(count):
                await provider.chat(body)

        await loop(50)   # connections open, code warm
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(loop(requests // slots) for _ in range(slots)))
        after, elapsed = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
        await provider.close()
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return cpu / (requests // slots * slots), elapsed

    try:
        per_request, elapsed = asyncio.run(measure())
    finally:
        fake.stdin.close()
        fake.wait(30)
    print(json.dumps({"client": "cronoq.llm.provider", "slots": slots, "requests": requests,
                      "cpu_us_per_request": round(per_request * 1e6), "requests_per_s": round(requests / elapsed),
                      "loadavg": [round(x, 2) for x in os.getloadavg()]}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=800)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help=(
        "the baseline: a plain cronoq.client.Worker whose handler sleeps 50 ms (no HTTP, no cronoq.llm)"))
    parser.add_argument("--client", action="store_true", help=(
        "the provider's HTTP client alone: its CPU per request, SLOTS at once, TASKS requests"))
    args = parser.parse_args()
    if args.client:
        return client_cpu(args.slots, args.tasks)
    env = server_env()
    with tempfile.TemporaryDirectory() as directory:
        fake = subprocess.Popen([sys.executable, str(ROOT / "tests" / "openai_fake.py"), "--delay", str(DELAY)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert fake.stdout is not None and fake.stdin is not None
        port = int(fake.stdout.readline())
        server = ServerProcess(LISTEN + '[[pools]]\nname = "llm"\n', Path(directory), name="bench").start()
        config = Path(directory) / "llm.toml"
        config.write_text(f'[worker]\ntarget = "{server.target}"\npool = "llm"\nslots = {args.slots}\n'
                          f'[provider]\nbase_url = "http://127.0.0.1:{port}/v1"\n[defaults]\nmodel = "m"\n')
        command = [sys.executable, "-m", "cronoq.llm.cli", "--config", str(config)]
        if args.plain:
            command = [sys.executable, "-c", PLAIN, server.target, str(args.slots)]
        worker = subprocess.Popen(command,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=env)
        try:
            rates, steady, peaks = [], [], []
            for _ in range(args.runs):
                rate, steady_rate = asyncio.run(one_run(server.target, args.tasks, args.slots))
                rates.append(rate)
                steady.append(steady_rate)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
                    peaks.append(json.load(answer)["max_in_flight"])   # 0 with --plain
        finally:
            worker.terminate()
            worker.wait(30)
            server.stop()
            fake.stdin.close()
            fake.wait(30)
    target = args.slots / DELAY
    print(json.dumps({"worker": "plain" if args.plain else "cronoq-llm-worker", "slots": args.slots, "tasks": args.tasks, "runs": args.runs, "target_tasks_per_s": target,
                      "tasks_per_s_median": round(statistics.median(rates), 1),
                      "tasks_per_s_min": round(min(rates), 1), "tasks_per_s_max": round(max(rates), 1),
                      "of_target_median": round(statistics.median(rates) / target, 3),
                      "steady_tasks_per_s_median": round(statistics.median(steady), 1),
                      "steady_tasks_per_s_min": round(min(steady), 1), "steady_tasks_per_s_max": round(max(steady), 1),
                      "steady_of_target_median": round(statistics.median(steady) / target, 3),
                      "in_flight_max": peaks, "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
