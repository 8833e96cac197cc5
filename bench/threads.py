"""The thread side, against its floors, in one run.

Floors, measured in the same run:
- threads: a ``queue.PriorityQueue`` with 8 worker threads doing the same
  no-op work (one thread puts the tasks, then waits for them all);
- asyncio: an ``asyncio.Queue`` with 8 worker coroutines.

A peer, when it is installed (``pip install huey``: a dependency of this
bench only; without it the line says so): huey's ``MemoryHuey`` with a
consumer of 8 worker threads, one thread enqueueing every no-op task, then
waiting for them all to have run (its workers poll every millisecond when
the queue is empty, instead of the default 0.1 s backing off to 10 s).

Two references for the asyncio path, to show what its target leaves room
for: the same queue whose workers resolve a plain asyncio future per item,
awaited with ``asyncio.gather`` over every future (the cost of gather
itself), and the engine alone (``bench/engine.py`` (a): submit, dispatch
and complete, sans-IO).

Paths (50,000 no-op tasks each by default, 8 slots):
- legacy: one thread calls ``ElasticPriorityScheduler.submit(Task(id,
  duration=0.0))`` for every task, then waits for ``completed_count``;
- blocking-1 / blocking-8: ``BlockingScheduler.submit`` from 1 and 8
  threads, then ``result()`` of every handle;
- asyncio-gather: ``Scheduler.submit_batch`` in batches of 1,000, then
  ``asyncio.gather`` over every handle.

Every path is a function of the number of tasks that returns tasks/s
(``PATHS``); the rounds interleave them, so the machine's noise falls on
all alike, and each figure is the median of the rounds with their min and
max, beside the floor of the same run. ``--isolate`` runs every
measurement in a fresh interpreter (``--one PATH``, which prints one
measurement as JSON); ``--json`` prints the whole run as JSON (the commit,
the load average, every round), for scripts that compare builds.

And the start latency of one critical task submitted behind a backlog of
20,000 low tasks of 1 ms on 4 slots, on each path (p50/p99 over probes).

``--compare`` measures the paths under the pure tree and the compiled
engine (``CRONOQ_MYPYC=1``; bench/builds.py builds it when missing) side by
side: each measurement in a fresh interpreter under each build in turn, the
builds alternating round by round, the floors among the paths; per path each
build's median (min-max), the ratio compiled / pure and each build's ratio
to its floor of the same run (the floors run no cronoq code: their
measurements under every build make one figure). Every subprocess reports
``cronoq.core.COMPILED``, checked against its build. ``--baseline TREE``
adds a third column, another pure tree. The latency part is left out.

    python bench/threads.py [--tasks 50000] [--repeat 5] [--probes 100] [--skip-latency]
        [--paths legacy,blocking-1,...] [--isolate] [--json]
    python bench/threads.py --compare [--baseline TREE] [--rebuild] [--tasks ...] [--repeat ...] [--paths ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve()

import builds  # noqa: E402  (bench/builds.py)

builds.put_tree_on_path()

import cronoq  # noqa: E402
import cronoq.core  # noqa: E402
from engine import asyncio_floor, asyncio_gather, cycles_per_second  # noqa: E402  (bench/engine.py)
from cronoq_compat import ElasticPriorityScheduler, Priority, Task  # noqa: E402

SLOTS = 8


# ---------------------------------------------------------------- floors

def thread_floor(n: int) -> float:
    q: queue.PriorityQueue = queue.PriorityQueue()

    def worker() -> None:
        while True:
            item = q.get()
            if item[2] is None:
                q.task_done()
                return
            q.task_done()

    workers = [threading.Thread(target=worker) for _ in range(SLOTS)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    for i in range(n):
        q.put((2, i, object()))
    q.join()
    elapsed = time.perf_counter() - start
    for i in range(SLOTS):
        q.put((9, n + i, None))
    for w in workers:
        w.join()
    return n / elapsed


async def gather_floor(n: int) -> float:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            future = await q.get()
            future.set_result(None)
            q.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(SLOTS)]
    start = time.perf_counter()
    futures = []
    for _ in range(n):
        future = loop.create_future()
        q.put_nowait(future)
        futures.append(future)
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    for w in workers:
        w.cancel()
    return n / elapsed


# ---------------------------------------------------------------- cronoq paths

def legacy(n: int) -> float:
    with ElasticPriorityScheduler(initial_workers=SLOTS, max_workers=SLOTS, min_workers=SLOTS) as sched:
        start = time.perf_counter()
        for i in range(n):
            sched.submit(Task(id=f"t{i}", duration=0.0))
        while sched.completed_count < n:
            time.sleep(0.0005)
        return n / (time.perf_counter() - start)


async def _noop(ctx, payload):
    return None


def blocking(n: int, threads: int) -> float:
    pool = cronoq.Pool("default", _noop, min=SLOTS, max=SLOTS, autoscale=False)
    with cronoq.BlockingScheduler([pool]) as sched:
        per = n // threads
        done = []
        start = time.perf_counter()

        def submit() -> None:
            handles = [sched.submit(None) for _ in range(per)]
            for h in handles:
                h.result()
            done.append(len(handles))

        pool_threads = [threading.Thread(target=submit) for _ in range(threads)]
        for t in pool_threads:
            t.start()
        for t in pool_threads:
            t.join()
        return sum(done) / (time.perf_counter() - start)


# ---------------------------------------------------------------- the peer

def memory_huey(n: int) -> float:
    from huey import MemoryHuey   # (this bench's own dependency)

    huey = MemoryHuey("bench-threads", results=False, utc=True)
    done: list[None] = []

    @huey.task()
    def noop() -> None:
        done.append(None)

    consumer = huey.create_consumer(workers=SLOTS, worker_type="thread", periodic=False,
                                    initial_delay=0.001, backoff=1.0, max_delay=0.001,
                                    check_worker_health=False)
    consumer.start()
    try:
        start = time.perf_counter()
        for _ in range(n):
            noop()
        while len(done) < n:
            time.sleep(0.0005)
        return n / (time.perf_counter() - start)
    finally:
        consumer.stop(graceful=True)


def huey_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("huey")
    except Exception:   # not installed: the bench runs without it
        return None


# ---------------------------------------------------------------- latency under a backlog

BACKLOG = 20_000
LATENCY_SLOTS = 4


async def _one_ms(ctx, payload):
    if payload is not None:
        payload.append(time.perf_counter())
    else:
        await asyncio.sleep(0.001)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def latency_async(probes: int) -> list[float]:
    pool = cronoq.Pool("default", _one_ms, min=LATENCY_SLOTS, max=LATENCY_SLOTS, autoscale=False)
    out = []
    async with cronoq.Scheduler([pool], shutdown_grace=0) as sched:
        await sched.enqueue_batch([cronoq.Task(None, priority="low") for _ in range(BACKLOG)])
        for _ in range(probes):
            seen: list[float] = []
            sent = time.perf_counter()
            handle = await sched.submit(seen, priority="critical")
            await handle
            out.append(seen[0] - sent)
    return out


def latency_blocking(probes: int) -> list[float]:
    pool = cronoq.Pool("default", _one_ms, min=LATENCY_SLOTS, max=LATENCY_SLOTS, autoscale=False)
    out = []
    with cronoq.BlockingScheduler([pool], shutdown_grace=0) as sched:
        sched.enqueue_batch([cronoq.Task(None, priority="low") for _ in range(BACKLOG)])
        for _ in range(probes):
            seen: list[float] = []
            sent = time.perf_counter()
            sched.submit(seen, priority="critical").result(timeout=30)
            out.append(seen[0] - sent)
    return out


def latency_legacy(probes: int) -> list[float]:
    out = []
    started: dict[str, float] = {}

    class Timed(ElasticPriorityScheduler):
        async def _run(self, ctx, job):   # records when each probe starts
            if ctx.key in started:
                started[ctx.key] = time.perf_counter()
            return await super()._run(ctx, job)

    with Timed(initial_workers=LATENCY_SLOTS, max_workers=LATENCY_SLOTS, min_workers=LATENCY_SLOTS,
               shutdown_grace=0) as sched:
        for i in range(BACKLOG):
            sched.submit(Task(id=f"low{i}", duration=0.001, priority=Priority.LOW))
        for i in range(probes):
            key = f"probe{i}"
            started[key] = 0.0
            sent = time.perf_counter()
            sched.submit(Task(id=key, duration=0.0, priority=Priority.CRITICAL))
            while not started[key]:
                time.sleep(0.00005)
            out.append(started[key] - sent)
    return out


# ---------------------------------------------------------------- the run

# name -> (label, measurement of n tasks in tasks/s); the rounds run them in this order.
PATHS: dict[str, tuple[str, Callable[[int], float]]] = {
    "thread floor": ("queue.PriorityQueue + 8 threads (floor)", thread_floor),
    "legacy": ("legacy submit, 1 thread", legacy),
    "blocking-1": ("BlockingScheduler.submit, 1 thread", lambda n: blocking(n, 1)),
    "blocking-8": ("BlockingScheduler.submit, 8 threads", lambda n: blocking(n, 8)),
    "huey": ("huey MemoryHuey, 8 worker threads", memory_huey),
    "asyncio floor": ("asyncio.Queue + 8 workers (floor)", lambda n: asyncio.run(asyncio_floor(n))),
    "asyncio-gather": ("Scheduler, batches of 1,000 + gather", lambda n: asyncio.run(asyncio_gather(n))),
    "gather floor": ("gather over plain futures (8 workers)", lambda n: asyncio.run(gather_floor(n))),
    "engine": ("engine alone (sans-IO cycles)", cycles_per_second),
}
# path -> (what its ratio is taken to, the target); legacy has a second one against huey.
TARGETS = {
    "legacy": ("thread floor", 0.3),
    "blocking-1": ("thread floor", 0.5),
    "blocking-8": ("thread floor", 0.5),
    "asyncio-gather": ("asyncio floor", 0.1),
}
PEER_TARGETS = {"legacy": ("huey", 2.0)}


def measure(name: str, n: int, isolate: bool) -> float:
    """One measurement of a path, here or in a fresh interpreter."""
    if not isolate:
        return PATHS[name][1](n)
    done = subprocess.run([sys.executable, str(HERE), "--one", name, "--tasks", str(n)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed in its subprocess ({done.returncode}):\n{done.stderr[-2000:]}")
    rate: float = json.loads(done.stdout)["rate"]
    return rate


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def spread(s: dict[str, Any]) -> str:
    return f"{s['median']:10,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def latency(probes: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, lat in (("asyncio Scheduler", asyncio.run(latency_async(probes))),
                      ("BlockingScheduler", latency_blocking(probes)),
                      ("legacy", latency_legacy(probes))):
        out[name] = {"p50_ms": _pct(lat, 0.5) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3}
    return out


def report(run: dict[str, Any]) -> None:
    paths = run["paths"]
    load = run["load"]
    print(f"commit {run['commit']}, Python {run['python']}, switch interval {run['switch_interval'] * 1e3:g} ms, "
          f"huey {run['huey'] or 'not installed'}")
    print(f"load average {load['start'][0]:.2f} {load['start'][1]:.2f} {load['start'][2]:.2f} at the start, "
          f"{load['end'][0]:.2f} {load['end'][1]:.2f} {load['end'][2]:.2f} at the end")
    print(f"{run['tasks']:,} no-op tasks, {SLOTS} slots; median (min-max) of {run['repeat']} interleaved rounds"
          f"{', each in a fresh interpreter' if run['isolated'] else ''}; ratio = median / the floor's median "
          f"in this run\n")
    print(f"  {'path':<40} {'tasks/s (median, min-max)':>32} {'ratio':>7}  target")
    verdicts = []
    for name, (label, _) in PATHS.items():
        if name not in paths:
            if name == "huey" and run["huey"] is None:
                print(f"  {label:<40} {'(not installed: pip install huey)':>32}")
            continue
        line = f"  {label:<40} {spread(paths[name]):>32}"
        for targets, unit in ((TARGETS, "of"), (PEER_TARGETS, "x")):
            target = targets.get(name)
            if target is None or target[0] not in paths:
                continue
            ratio = paths[name]["median"] / paths[target[0]]["median"]
            wanted = f">= {target[1]:g}{'x ' if unit == 'x' else ' of the '}{target[0]}"
            line += f" {ratio:7.3f}  {wanted}" if unit == "of" else f"; {ratio:.2f}x {target[0]} ({wanted})"
            verdicts.append(f"  {label}: {ratio:.3f} {wanted}: {'met' if ratio >= target[1] else 'missed'}")
        print(line)
    if verdicts:   # (apart, so a line's text does not change with its verdict)
        print("\n" + "\n".join(verdicts))
    if {"gather floor", "engine", "asyncio floor"} <= paths.keys():
        floor = paths["asyncio floor"]["median"]
        bound = 1 / (1 / paths["gather floor"]["median"] + 1 / paths["engine"]["median"])
        print(f"\n  references for the asyncio path: gather over plain futures "
              f"{paths['gather floor']['median'] / floor:.3f} of its floor, the engine alone "
              f"{paths['engine']['median'] / floor:.3f}, both one after the other (1/(1/a+1/b)) "
              f"{bound / floor:.3f} (a scheduler that adds nothing)")
    if run.get("latency"):
        print(f"\nstart latency of a critical task behind {BACKLOG:,} low tasks of 1 ms on {LATENCY_SLOTS} slots "
              f"({run['probes']} probes)\n")
        for label, lat in run["latency"].items():
            print(f"  {label:<20} p50 {lat['p50_ms']:7.3f} ms   p99 {lat['p99_ms']:7.3f} ms   (target p99 < 2 ms)")


# ---------------------------------------------------------------- builds side by side (--compare)

# The paths that run no cronoq code: the same under every build.
UNCHANGED_BY_BUILD = ("thread floor", "asyncio floor", "gather floor", "huey")


def one_in_build(name: str, n: int) -> list[float]:
    """A measurement for ``--compare``, run by bench/builds.py in a fresh
    interpreter under one build: [tasks/s, cronoq.core.COMPILED as 1 or 0],
    the second checked by the parent against the build it meant to run."""
    return [PATHS[name][1](n), float(cronoq.core.COMPILED)]


def build_origin() -> dict[str, Any]:
    """Where a build's subprocess loads cronoq and its engine from."""
    from importlib.util import find_spec
    engine = find_spec("cronoq.core.engine")
    return {"compiled": cronoq.core.COMPILED, "tree": str(Path(cronoq.__file__).resolve().parent.parent),
            "engine": Path(engine.origin).name if engine and engine.origin else "?"}


def _shown(path: Path) -> str:
    """A build's directory as the table shows it: relative to this tree."""
    if path == builds.REPO:
        return "this tree"
    return str(path.relative_to(builds.REPO)) if path.is_relative_to(builds.REPO) else str(path)


def compare(names: list[str], n: int, rounds: int, baseline: str | None, rebuild: bool) -> dict[str, Any]:
    """Every path under the pure tree and the compiled build (and a baseline
    tree), each measurement in a fresh interpreter, interleaved round by round."""
    side = [builds.pure(), builds.compiled(rebuild=rebuild)]
    if baseline:
        side.append(builds.tree(Path(baseline), "baseline"))
    origins = {}
    for build in side:
        origin = builds.run(build, "threads", "build_origin")
        if origin["compiled"] is not build.compiled or Path(origin["tree"]) != build.path:
            raise SystemExit(f"{build.name}: cronoq from {origin['tree']}, COMPILED {origin['compiled']}: "
                             f"not the build meant ({build.path}, COMPILED {build.compiled})")
        origins[build.name] = {**origin, "tree": _shown(build.path)}
    run: dict[str, Any] = {
        "commit": builds.commit(), "python": platform.python_version(), "switch_interval": sys.getswitchinterval(),
        "huey": huey_version(), "tasks": n, "repeat": rounds, "builds": origins,
        "baseline_commit": builds.commit(Path(baseline)) if baseline else None,
        "load": {"start": os.getloadavg()},
    }
    measures = [((name, f"{name} COMPILED"), "threads", "one_in_build", (name, n)) for name in names]
    table = builds.compare(side, measures, rounds)
    run["load"]["end"] = os.getloadavg()
    for build in side:   # every child ran the build it was meant to
        flags = [row[build.name] for label, row in table.items() if label.endswith(" COMPILED")]
        if any(flag != float(build.compiled) for values in flags for flag in values):
            raise SystemExit(f"{build.name}: a subprocess ran with cronoq.core.COMPILED != {build.compiled}")
        origins[build.name]["children"] = sum(len(values) for values in flags)
    run["paths"] = {name: {b.name: summary(table[name][b.name]) for b in side} for name in names}
    # What uses no cronoq (the floors, huey) runs the same code under every build: its
    # measurements under all of them make one figure, the one each build's ratio is taken to.
    run["pooled"] = {name: summary([v for b in side for v in table[name][b.name]])
                     for name in names if name in UNCHANGED_BY_BUILD}
    return run


def report_compare(run: dict[str, Any]) -> None:
    paths, pooled, load, side = run["paths"], run["pooled"], run["load"], list(run["builds"])
    first = side[0]
    verdicts: list[str] = []
    print(f"commit {run['commit']}, Python {run['python']}, switch interval {run['switch_interval'] * 1e3:g} ms, "
          f"huey {run['huey'] or 'not installed'}"
          + (f"; baseline commit {run['baseline_commit']}" if run["baseline_commit"] else ""))
    for name, origin in run["builds"].items():
        print(f"  {name}: cronoq from {origin['tree']}, its engine {origin['engine']}; cronoq.core.COMPILED "
              f"{origin['compiled']} in each of its {origin['children']} subprocesses")
    print(f"load average {load['start'][0]:.2f} {load['start'][1]:.2f} {load['start'][2]:.2f} at the start, "
          f"{load['end'][0]:.2f} {load['end'][1]:.2f} {load['end'][2]:.2f} at the end")
    print(f"{run['tasks']:,} no-op tasks, {SLOTS} slots; median (min-max) of {run['repeat']} interleaved rounds, "
          f"each measurement in a fresh interpreter under each build in turn; of floor = the path's median "
          f"under that build / the floor's median over all its {len(side) * run['repeat']} measurements of this "
          f"run (the floors and huey run no cronoq code)\n")
    heads = ["path", *(f"{b}: tasks/s" for b in side), *(f"{b} / {first}" for b in side[1:]),
             *(f"{b}: of floor" for b in side), "target"]
    rows = []
    for name, (label, _) in PATHS.items():
        if name not in paths:
            continue
        by = paths[name]
        row = [label, *(spread(by[b]).strip() for b in side),
               *(f"{by[b]['median'] / by[first]['median']:.2f}x" for b in side[1:])]
        target = TARGETS.get(name)
        if target is not None and target[0] in pooled:
            floor = pooled[target[0]]["median"]
            row += [f"{by[b]['median'] / floor:.3f}" for b in side]
            row.append(f">= {target[1]:g} of the {target[0]}")
            verdicts += [f"  {label}, {b}: {by[b]['median'] / floor:.3f} of the {target[0]} (>= {target[1]:g}): "
                         f"{'met' if by[b]['median'] / floor >= target[1] else 'missed'}" for b in side]
        else:
            row += [""] * len(side) + [""]
        peer = PEER_TARGETS.get(name)
        if peer is not None and peer[0] in pooled:
            wanted = pooled[peer[0]]["median"]
            verdicts += [f"  {label}, {b}: {by[b]['median'] / wanted:.2f}x {peer[0]} (>= {peer[1]:g}x): "
                         f"{'met' if by[b]['median'] / wanted >= peer[1] else 'missed'}" for b in side]
        rows.append(row)
    for name in pooled:   # the figure the ratios are taken to
        rows.append([f"{PATHS[name][0]}, all builds", spread(pooled[name]).strip(), *[""] * (len(heads) - 2)])
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    for row in [heads, *rows]:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if verdicts:
        print("\n" + "\n".join(verdicts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds (each figure is their median)")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--paths", help=f"comma-separated, of: {', '.join(PATHS)} (default: all)")
    parser.add_argument("--isolate", action="store_true", help="each measurement in a fresh interpreter")
    parser.add_argument("--json", action="store_true", help="print the run as JSON instead of a table")
    parser.add_argument("--one", metavar="PATH", help="measure PATH once and print {path, tasks, rate} as JSON")
    parser.add_argument("--compare", action="store_true",
                        help="every path under the pure tree and the compiled build (bench/builds.py), "
                             "side by side, each measurement in a fresh interpreter (no latency part)")
    parser.add_argument("--rebuild", action="store_true", help="with --compare: build the compiled variant anew")
    parser.add_argument("--baseline", metavar="TREE",
                        help="with --compare: a third column, another pure tree (a worktree of main, say)")
    args = parser.parse_args()
    n = args.tasks
    if args.one is not None:
        if args.one not in PATHS:
            parser.error(f"--one: no path {args.one!r}")
        print(json.dumps({"path": args.one, "tasks": n, "rate": PATHS[args.one][1](n)}))
        return 0
    names = list(PATHS) if args.paths is None else [name.strip() for name in args.paths.split(",")]
    unknown = [name for name in names if name not in PATHS]
    if unknown:
        parser.error(f"--paths: no path {', '.join(map(repr, unknown))}")
    huey = huey_version()
    if huey is None and "huey" in names:
        names.remove("huey")
    if args.compare:
        compared = compare(names, n, args.repeat, args.baseline, args.rebuild)
        if args.json:
            print(json.dumps(compared, indent=2))
        else:
            report_compare(compared)
        return 0
    if args.baseline or args.rebuild:
        parser.error("--baseline and --rebuild go with --compare")
    run: dict[str, Any] = {
        "commit": builds.commit(), "python": platform.python_version(), "switch_interval": sys.getswitchinterval(),
        "huey": huey, "tasks": n, "repeat": args.repeat, "isolated": args.isolate,
        "load": {"start": os.getloadavg()},
    }
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeat):   # interleaved, so noise hits every path alike
        for name in names:
            rounds[name].append(measure(name, n, args.isolate))
    run["paths"] = {name: summary(values) for name, values in rounds.items()}
    if not args.skip_latency:
        run["probes"] = args.probes
        run["latency"] = latency(args.probes)
    run["load"]["end"] = os.getloadavg()
    if args.json:
        print(json.dumps(run, indent=2))
    else:
        report(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
