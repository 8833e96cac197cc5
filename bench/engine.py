"""Benchmarks of the sans-IO engine (cronoq.core), without any runtime.

    python bench/engine.py            # the full set (about two minutes)
    python bench/engine.py --quick    # smaller backlogs and fewer runs, for a smoke check
    python bench/engine.py --compare  # (a), (b), (e) and (f), pure and compiled side by side

Prints a table. Every figure is the median of several repetitions; the
dispatch-cost comparisons are reported as ratios, which travel better between
machines than absolute times. Not a test: nothing here asserts.

What is measured (see bench/README.md for the figures and their targets):

a. cycles/s: submit + dispatch + complete of plain tasks on one pool of
   8 slots, one core, the driver reading raw action tuples.
b. the cost of one dispatch with 1,000 and with 1,000,000 tasks pending:
   blocks of 500 complete -> dispatch cycles on a pre-filled backlog
   (refilled, untimed, between blocks), the two backlogs timed in alternating
   blocks; per dispatch, the median over blocks, and the mean (which includes
   the garbage collector's passes over the backlog).
c. bytes per pending task (tracemalloc, plain tasks, payload None).
d. (b) for tasks parked on one shared semaphore, and for a fair-share pool
   with eight tenants.
e. cycles/s of a mixed workload: four classes, a third with deadlines, over
   a standing backlog of 1,000 tasks.
f. (--compare only) the asyncio path, as bench/threads.py measures it:
   ``Scheduler.submit_batch`` in batches of 1,000 no-op tasks on 8 slots,
   then ``asyncio.gather`` over every handle, against the floor of an
   ``asyncio.Queue`` with 8 worker coroutines, in the same process.

--compare runs each figure in subprocesses, under the pure tree and under the
compiled build (bench/builds.py builds it with CRONOQ_MYPYC=1 when missing),
the two interleaved round by round, and prints both columns and their ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import builds  # noqa: E402  (bench/builds.py)

builds.put_tree_on_path()

from cronoq.core import Core, CoreConfig, PoolConfig, ResourceConfig, TaskSpec  # noqa: E402
from cronoq.core import actions as act  # noqa: E402

DISPATCH = act.DISPATCH
SLOTS = 8


def new_core(**pool_options) -> Core:
    options = dict(min=SLOTS, max=SLOTS, initial=SLOTS, autoscale=False)
    options.update(pool_options)
    resources = options.pop("resources", ())
    return Core(CoreConfig(), [PoolConfig("default", **options)], list(resources))


def collect(core: Core, leases: deque) -> None:
    """The driver's part: read the queued actions, keep the new leases."""
    actions = core.actions
    while actions:
        raw = actions.popleft()
        if raw[0] == DISPATCH:
            leases.append(raw[2])


# ---------------------------------------------------------------- (a) cycles per second

def cycles_per_second(n: int) -> float:
    core = new_core()
    spec = TaskSpec(None)
    leases: deque = deque()
    now = 1
    for _ in range(SLOTS):
        core.submit(now, spec)
    collect(core, leases)
    submit, complete, actions = core.submit, core.complete, core.actions
    popleft, append = leases.popleft, leases.append
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        now += 1000
        complete(now, popleft())
        submit(now, spec)
        while actions:
            raw = actions.popleft()
            if raw[0] == DISPATCH:
                append(raw[2])
    elapsed = time.perf_counter() - start
    return n / elapsed


def mixed_cycles_per_second(n: int, backlog: int = 1000) -> float:
    rng = random.Random(1)
    specs = []
    for i in range(4096):
        priority = rng.choice(("critical", "high", "normal", "normal", "low"))
        if rng.random() < 0.33:
            specs.append(TaskSpec(None, priority=priority, deadline_in=rng.uniform(0.5, 30.0)))
        else:
            specs.append(TaskSpec(None, priority=priority))
    core = new_core()
    leases: deque = deque()
    now = 1
    for i in range(backlog + SLOTS):
        core.submit(now, specs[i % len(specs)])
    collect(core, leases)
    submit, complete, actions = core.submit, core.complete, core.actions
    popleft, append = leases.popleft, leases.append
    gc.collect()
    start = time.perf_counter()
    for i in range(n):
        now += 1_000_000        # a millisecond per cycle: deadlines come and go
        complete(now, popleft())
        submit(now, specs[i & 4095])
        while actions:
            raw = actions.popleft()
            if raw[0] == DISPATCH:
                append(raw[2])
    elapsed = time.perf_counter() - start
    assert len(core.tasks) == backlog + SLOTS
    return n / elapsed


# ---------------------------------------------------------------- (b, d) cost of one dispatch

class Backlog:
    """A core with ``backlog`` tasks pending behind 8 busy slots."""

    def __init__(self, make_core, make_specs, backlog: int) -> None:
        self.core = make_core()
        self.specs = make_specs()
        self.backlog = backlog
        self.leases: deque = deque()
        self.now = 1
        self.i = 0
        self.refill(backlog + SLOTS)
        self.per_block: list[float] = []
        self.total = 0.0
        self.cycles = 0

    def refill(self, n: int | None = None) -> None:
        """Top the backlog up (untimed): every slot is busy, so new tasks wait."""
        core, specs = self.core, self.specs
        nspecs = len(specs)
        if n is None:
            n = self.backlog - core.pending
        for _ in range(n):
            core.submit(self.now, specs[self.i % nspecs])
            self.i += 1
        collect(core, self.leases)

    def block(self, size: int) -> None:
        """Time ``size`` complete -> dispatch cycles."""
        self.refill()
        core = self.core
        complete, actions = core.complete, core.actions
        popleft, append = self.leases.popleft, self.leases.append
        now = self.now
        start = time.perf_counter()
        for _ in range(size):
            now += 1000
            complete(now, popleft())
            while actions:
                raw = actions.popleft()
                if raw[0] == DISPATCH:
                    append(raw[2])
        elapsed = time.perf_counter() - start
        self.now = now
        self.per_block.append(elapsed / size)
        self.total += elapsed
        self.cycles += size
        assert core.pending >= self.backlog - size


def dispatch_cost(make_core, make_specs, small: int, large: int, blocks: int, block: int = 500):
    """Seconds per complete -> dispatch cycle on a small and a large backlog.

    The two backlogs are timed in alternating blocks, so that a burst of
    machine noise hits both alike. Returns ((median, mean) small, (median,
    mean) large); the median is over blocks, the mean includes the garbage
    collector's passes (which walk every live object, backlog included).
    """
    a = Backlog(make_core, make_specs, small)
    b = Backlog(make_core, make_specs, large)
    gc.collect()
    for _ in range(blocks):
        a.block(block)
        b.block(block)
    result = tuple((statistics.median(x.per_block), x.total / x.cycles) for x in (a, b))
    del a, b
    gc.collect()
    return result


def plain_core():
    return new_core()


def plain_specs():
    return [TaskSpec(None)]


def semaphore_core():
    # Four permits for eight slots: the backlog parks on the semaphore.
    return new_core(resources=[ResourceConfig.semaphore("db", 4)])


def semaphore_specs():
    return [TaskSpec(None, resources={"db": 1})]


def fair_core():
    return new_core(tenant_weights={f"tenant{k}": float(1 + k % 3) for k in range(8)})


def fair_specs():
    return [TaskSpec(None, tenant=f"tenant{k}") for k in range(8)]


# ---------------------------------------------------------------- (c) memory

def bytes_per_pending(n: int) -> float:
    gc.collect()
    tracemalloc.start()
    core = Core(CoreConfig(), [PoolConfig("default", min=0, max=SLOTS, initial=0, autoscale=False)])
    spec = TaskSpec(None)
    base = tracemalloc.get_traced_memory()[0]
    submit = core.submit
    for _ in range(n):
        submit(1, spec)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert core.pending == n
    return used / n


# ---------------------------------------------------------------- (f) the asyncio path

async def _noop(ctx, payload):
    return None


async def asyncio_floor(n: int) -> float:
    import asyncio
    q: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            await q.get()
            q.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(SLOTS)]
    start = time.perf_counter()
    for i in range(n):
        q.put_nowait(i)
    await q.join()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.cancel()
    return n / elapsed


async def asyncio_gather(n: int, batch: int = 1000) -> float:
    import asyncio

    import cronoq
    pool = cronoq.Pool("default", _noop, min=SLOTS, max=SLOTS, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        start = time.perf_counter()
        handles = []
        for i in range(0, n, batch):
            handles.extend(await sched.submit_batch([cronoq.Task(None) for _ in range(min(batch, n - i))]))
        await asyncio.gather(*handles)
        return n / (time.perf_counter() - start)


def asyncio_path(n: int) -> list[float]:
    """[floor tasks/s, Scheduler tasks/s, their ratio], measured in one process."""
    import asyncio
    floor = asyncio.run(asyncio_floor(n))
    path = asyncio.run(asyncio_gather(n))
    return [floor, path, path / floor]


def plain_dispatch_us(small: int, large: int, blocks: int) -> list[float]:
    """(b) in microseconds: [per dispatch at ``small`` pending, at ``large``]."""
    (s_med, _), (l_med, _) = dispatch_cost(plain_core, plain_specs, small, large, blocks)
    return [s_med * 1e6, l_med * 1e6]


def compare(args: argparse.Namespace, runs: int, big: int, cycles: int, blocks: int) -> None:
    both = [builds.pure(), builds.compiled(rebuild=args.rebuild)]
    if args.baseline:
        both.append(builds.tree(Path(args.baseline), "baseline"))
    k = f"{big // 1000:,}k"
    measures = [
        ("a  cycles/s, 8 slots", "engine", "cycles_per_second", (cycles,)),
        (("b  dispatch, 1k pending (us)", f"b  dispatch, {k} pending (us)"), "engine", "plain_dispatch_us",
         (1000, big, blocks)),
        ("e  mixed cycles/s", "engine", "mixed_cycles_per_second", (cycles // 2,)),
        (("f  asyncio.Queue + 8 workers (floor), tasks/s", "f  submit_batch + gather, tasks/s",
          "f    ratio to the floor"), "engine", "asyncio_path", (args.tasks,)),
    ]
    print(f"cronoq engine, pure and compiled: Python {platform.python_version()} on {platform.machine()}, "
          f"commit {builds.commit()}, {runs} interleaved rounds{' (quick)' if args.quick else ''}")
    if args.baseline:
        print(f"baseline: commit {builds.commit(Path(args.baseline))}")
    print(f"load average before: {builds.load()}")
    table = builds.compare(both, measures, runs)
    print(f"load average after: {builds.load()}\n")
    us = {label for label in table if label.endswith("(us)")}
    builds.print_table(table, both, formats={**{u: ".2f" for u in us}, "f    ratio to the floor": ".3f"},
                       lower_is_better=us)


# ---------------------------------------------------------------- main

def median_of(runs: int, fn, *args):
    values = [fn(*args) for _ in range(runs)]
    return statistics.median(values), values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and fewer repetitions")
    parser.add_argument("--runs", type=int, default=None, help="repetitions per figure (default 7, quick 5)")
    parser.add_argument("--compare", action="store_true",
                        help="(a), (b), (e) and (f) under the pure tree and the compiled build, side by side")
    parser.add_argument("--rebuild", action="store_true", help="with --compare: build the compiled variant anew")
    parser.add_argument("--tasks", type=int, default=50_000, help="with --compare: tasks per run of (f)")
    parser.add_argument("--baseline", metavar="TREE",
                        help="with --compare: a third column, another pure tree (a worktree of main, say)")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 7)
    big = 100_000 if args.quick else 1_000_000
    cycles = 50_000 if args.quick else 200_000
    blocks = 40 if args.quick else 200
    if args.compare:
        compare(args, runs, 100_000 if args.quick else 1_000_000, cycles, blocks)
        return

    print(f"cronoq engine benchmark: Python {platform.python_version()} on {platform.machine()}, "
          f"{runs} runs per figure{' (quick)' if args.quick else ''}")
    rows = []

    rate, values = median_of(runs, cycles_per_second, cycles)
    rows.append(("a", "submit+dispatch+complete, 8 slots", f"{rate:,.0f} cycles/s",
                 f"runs {min(values):,.0f}..{max(values):,.0f}; target >= 200,000"))

    for label, make_core, make_specs in (("b", plain_core, plain_specs),
                                         ("d", semaphore_core, semaphore_specs),
                                         ("d", fair_core, fair_specs)):
        name = {"plain_core": "plain FIFO", "semaphore_core": "parked on a semaphore",
                "fair_core": "fair share, 8 tenants"}[make_core.__name__]
        runs_ = [dispatch_cost(make_core, make_specs, 1000, big, blocks) for _ in range(max(3, runs // 2))]
        s_med = statistics.median(r[0][0] for r in runs_)
        l_med = statistics.median(r[1][0] for r in runs_)
        s_mean = statistics.median(r[0][1] for r in runs_)
        l_mean = statistics.median(r[1][1] for r in runs_)
        ratios = [r[1][0] / r[0][0] for r in runs_]
        rows.append((label, f"dispatch cost, {name}: 1k pending", f"{s_med * 1e6:.2f} us",
                     f"mean incl. GC {s_mean * 1e6:.2f} us"))
        rows.append((label, f"dispatch cost, {name}: {big // 1000:,}k pending", f"{l_med * 1e6:.2f} us",
                     f"mean incl. GC {l_mean * 1e6:.2f} us"))
        rows.append((label, f"  ratio {big // 1000:,}k / 1k ({name})", f"{statistics.median(ratios):.2f}x",
                     f"runs {min(ratios):.2f}..{max(ratios):.2f}; mean ratio {l_mean / s_mean:.2f}x; "
                     f"target <= 1.5"))
        gc.collect()

    size, values = median_of(max(3, runs // 2), bytes_per_pending, big)
    rows.append(("c", f"memory per pending task ({big:,} tasks)", f"{size:,.0f} B",
                 f"runs {min(values):,.0f}..{max(values):,.0f}; target <= 700"))

    rate, values = median_of(runs, mixed_cycles_per_second, cycles // 2)
    rows.append(("e", "mixed: 4 classes, 1/3 deadlines, 1k backlog", f"{rate:,.0f} cycles/s",
                 f"runs {min(values):,.0f}..{max(values):,.0f}"))

    width = max(len(r[1]) for r in rows)
    vwidth = max(len(r[2]) for r in rows)
    print()
    for label, what, value, note in rows:
        print(f"{label}  {what:<{width}}  {value:>{vwidth}}  {note}")


if __name__ == "__main__":
    main()
