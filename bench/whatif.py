"""Benchmarks of cronoq.whatif: replay speed, recording overhead, fidelity.

    python bench/whatif.py                 # everything (about five minutes)
    python bench/whatif.py --only speed    # a, with --tasks 1000000 (the default)
    python bench/whatif.py --only overhead # b
    python bench/whatif.py --only fidelity # c

Not a test: nothing here asserts. What is measured (see bench/README.md):

a. speed: a synthetic trace of --tasks tasks shaped like the demo's mixed
   workload (interactive clicks with deadlines, chat turns through a token
   bucket, reports, background re-indexing in bursts, a retry now and then)
   over two autoscaled pools, written as a trace file; the time to read it
   and the time to replay it (one core, the recorded policy, durations from
   the trace), median of --runs runs.
b. recording overhead: tasks per second through a live Scheduler (no store,
   an async executor that returns at once, --overhead-tasks tasks submitted
   by 8 concurrent submitters) with and without a TraceRecorder (its writer
   thread included, and its close), in alternating runs; the ratio of the
   medians, and the process's CPU time per task.
c. fidelity in real time: the demo (python -m cronoq demo, its SQLite store,
   --fidelity-seconds of submissions) recorded --fidelity-runs times with the
   same seed; each trace replayed with its recorded policy, with no start
   delay and with --start-delay (what the live runtime adds to each start,
   docs/whatif.md "Calibrating"). Reported: per class, the replays' p50/p90/
   p99 waits beside the live ones, and the same figures of the live runs
   beside each other (how much two live runs of the same workload differ),
   plus the deadline misses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cronoq  # noqa: E402
from cronoq.whatif import Report, Trace, TraceRecorder, replay, variants  # noqa: E402

START = 1_767_225_600.0
POLICY = {
    "pools": {
        "app": {"min": 4, "max": 64, "autoscale": {"slo": {"high": 0.5}, "cost_per_worker_second": 0.0011}},
        "llm": {"min": 2, "max": 16, "autoscale": {"cost_per_worker_second": 0.004}},
    },
    "resources": {"llm-api": {"kind": "token_bucket", "rate": 40.0, "burst": 20}},
    "seed": 7,
}


def synthetic_trace(path: str, tasks: int, seed: int = 7, rate: float = 100.0) -> None:
    """A demo-shaped workload of ``tasks`` tasks, ``rate`` arrivals a second."""
    rng = random.Random(seed)
    dumps = json.dumps
    t = 0.0
    n = 0
    with open(path, "w") as f:
        f.write(dumps({"cronoq_trace": 1, "t0": START, "policy": POLICY, "source": "bench/whatif.py"}) + "\n")

        def emit(line: dict, runs: list[tuple[float, str]]) -> None:
            nonlocal n
            n += 1
            line["task"] = n
            line["at"] = round(t, 6)
            line["attempts"] = [{"seconds": round(s, 6), "outcome": o} for s, o in runs]
            f.write(dumps(line, separators=(",", ":")) + "\n")

        while n < tasks:
            t += rng.expovariate(rate)
            roll = rng.random()
            if roll < 0.45:
                emit({"pool": "app", "kind": "click", "priority": "high", "deadline": round(t + 1.0, 6)},
                     [(0.03 * rng.lognormvariate(0, 0.4), "success")])
            elif roll < 0.60:
                emit({"pool": "llm", "kind": "chat", "priority": "high", "resources": {"llm-api": 1},
                      "deadline": round(t + 3.0, 6)}, [(0.25 * rng.lognormvariate(0, 0.4), "success")])
            elif roll < 0.75:
                emit({"pool": "app", "kind": "report", "priority": "normal", "deadline": round(t + 10.0, 6)},
                     [(0.6 * rng.lognormvariate(0, 0.4), "success")])
            elif roll < 0.99:
                emit({"pool": "app", "kind": "reindex", "priority": "low"},
                     [(0.15 * rng.lognormvariate(0, 0.4), "success")])
            else:
                emit({"pool": "app", "kind": "flaky", "priority": "normal"},
                     [(0.1, "retryable"), (0.1, "success")])
            if rng.random() < 0.0005:
                for _ in range(min(150, tasks - n)):
                    emit({"pool": "app", "kind": "reindex", "priority": "low"},
                         [(0.15 * rng.lognormvariate(0, 0.4), "success")])


def bench_speed(tasks: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.jsonl")
        started = time.perf_counter()
        synthetic_trace(path, tasks)
        print(f"a. wrote a trace of {tasks:,} tasks ({os.path.getsize(path) / 1e6:.0f} MB) in "
              f"{time.perf_counter() - started:.1f} s")
        loads, replays, totals, cpu = [], [], [], []
        for _ in range(runs):
            gc.collect()
            started, started_cpu = time.perf_counter(), time.process_time()
            trace = Trace.load(path)
            loaded = time.perf_counter()
            variant = variants(trace)[0]
            result = replay(trace, variant)
            done, done_cpu = time.perf_counter(), time.process_time()
            loads.append(loaded - started)
            replays.append(done - loaded)
            totals.append(done - started)
            cpu.append(done_cpu - started_cpu)
            del trace
        report = Report(Trace.load(path), [result])   # (not timed: the figures' own pass)
        fig = report.variants[0]
        print(f"   read the trace: median {statistics.median(loads):.1f} s  (runs: "
              f"{', '.join(f'{x:.1f}' for x in loads)})")
        print(f"   replay:         median {statistics.median(replays):.1f} s  (runs: "
              f"{', '.join(f'{x:.1f}' for x in replays)}) = "
              f"{tasks / statistics.median(replays):,.0f} tasks/s")
        print(f"   read + replay:  median {statistics.median(totals):.1f} s wall, "
              f"{statistics.median(cpu):.1f} s of CPU (runs: {', '.join(f'{x:.1f}' for x in cpu)})")
        print(f"   the replay: {fig.endings['succeeded']:,} succeeded, makespan {fig.makespan:,.0f} s, "
              f"worker-s {fig.worker_seconds:,.0f}, high p99 wait {fig.waits['high'].p99:.3f} s")


async def _throughput(tasks: int, record: bool) -> tuple[float, float]:
    async def work(ctx, payload):
        return None

    sched = cronoq.Scheduler([cronoq.Pool("default", work, min=8, max=8, autoscale=False)])
    recorder = None
    d = tempfile.mkdtemp()
    if record:
        recorder = TraceRecorder(sched, os.path.join(d, "t.jsonl"))
    async with sched:
        per = tasks // 8

        async def submitter() -> None:
            for _ in range(per):
                await sched.enqueue(None, kind="k", priority="normal")

        started, started_cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(submitter() for _ in range(8)))
        while (await sched.snapshot()).live_tasks:
            await asyncio.sleep(0.001)
        if recorder is not None:
            recorder.close()   # (what it has left to write counts)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    return per * 8 / elapsed, cpu / (per * 8) * 1e6


def bench_overhead(tasks: int, runs: int) -> None:
    plain, recorded, plain_cpu, recorded_cpu = [], [], [], []
    for _ in range(runs):
        rate, cpu = asyncio.run(_throughput(tasks, False))
        plain.append(rate)
        plain_cpu.append(cpu)
        rate, cpu = asyncio.run(_throughput(tasks, True))
        recorded.append(rate)
        recorded_cpu.append(cpu)
    a, b = statistics.median(plain), statistics.median(recorded)
    ca, cb = statistics.median(plain_cpu), statistics.median(recorded_cpu)
    print(f"b. tasks/s without a recorder: median {a:,.0f} (runs: {', '.join(f'{x:,.0f}' for x in plain)}); "
          f"CPU per task median {ca:.1f} us")
    print(f"   tasks/s with a recorder:    median {b:,.0f} (runs: {', '.join(f'{x:,.0f}' for x in recorded)}); "
          f"CPU per task median {cb:.1f} us")
    print(f"   ratio {b / a:.2f}: the recorder costs {(1 - b / a) * 100:.0f} % of the throughput "
          f"({(1 / b - 1 / a) * 1e6:.1f} us per task of wall time, {cb - ca:.1f} us of CPU)")


def _waits(fig, cls: str) -> tuple[float, float, float]:
    w = fig.waits.get(cls)
    return (w.p50, w.p90, w.p99) if w else (math.nan, math.nan, math.nan)


def bench_fidelity(seconds: float, runs: int, seed: int, start_delay: float) -> None:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lives, replays, delayed = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(runs):
            path = os.path.join(d, f"t{i}.jsonl")
            subprocess.run([sys.executable, "-m", "cronoq", "demo", "--seconds", str(seconds), "--seed",
                            str(seed), "--no-live", "--record", path], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            trace = Trace.load(path)
            variant = variants(trace)[0]
            report = Report(trace, [replay(trace, variant), replay(trace, variant, start_delay=start_delay)])
            lives.append(report.live)
            replays.append(report.variants[0])
            delayed.append(report.variants[1])
    print(f"c. the demo, {seconds:g} s of submissions, seed {seed}, {runs} live runs (real time, SQLite store)")
    for name, column in (("no start delay", replays), (f"start_delay {start_delay:g} s", delayed)):
        print(f"   replays with {name}:")
        print("   class   | live p50 / p90 / p99 s | replay p50 / p90 / p99 s | |replay - live| "
              "p50 / p90 / p99 (share of live)")
        for cls in ("high", "normal", "low"):
            for live, rep in zip(lives, column):
                lw, rw = _waits(live, cls), _waits(rep, cls)
                err = [abs(r - l) for r, l in zip(rw, lw)]
                print(f"   {cls:7} | {lw[0]:6.3f} {lw[1]:6.3f} {lw[2]:6.3f}   | "
                      f"{rw[0]:6.3f} {rw[1]:6.3f} {rw[2]:6.3f}     | "
                      + "  ".join(f"{e:.3f} ({e / l:.0%})" if l else f"{e:.3f}" for e, l in zip(err, lw)))
    for cls in ("high", "normal", "low"):
        spread = []
        for i in range(len(lives)):
            for j in range(i + 1, len(lives)):
                a, b = _waits(lives[i], cls), _waits(lives[j], cls)
                spread.append(max(abs(x - y) / max(x, y, 1e-9) for x, y in zip(a, b)))
        if spread:
            print(f"   live vs live, {cls}: largest relative difference of p50/p90/p99 between two runs: "
                  f"{max(spread):.0%}")
    for live, rep, late in zip(lives, replays, delayed):
        print(f"   deadline misses: live {live.deadline_misses}/{live.deadline_tasks}, "
              f"replay {rep.deadline_misses}/{rep.deadline_tasks} (with the delay {late.deadline_misses}); "
              f"tasks {sum(live.endings.values())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("speed", "overhead", "fidelity"))
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--overhead-tasks", type=int, default=100_000)
    parser.add_argument("--fidelity-seconds", type=float, default=10.0)
    parser.add_argument("--fidelity-runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start-delay", type=float, default=0.015)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    if args.only in (None, "speed"):
        bench_speed(args.tasks, args.runs)
    if args.only in (None, "overhead"):
        bench_overhead(args.overhead_tasks, max(3, args.runs))
    if args.only in (None, "fidelity"):
        bench_fidelity(args.fidelity_seconds, args.fidelity_runs, args.seed, args.start_delay)


if __name__ == "__main__":
    main()
