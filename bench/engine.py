"""Benchmarks of the sans-IO engine (cronoq.core), without any runtime.

    python bench/engine.py            # the full set (about two minutes)
    python bench/engine.py --quick    # smaller backlogs and fewer runs, for a smoke check

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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

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


# ---------------------------------------------------------------- main

def median_of(runs: int, fn, *args):
    values = [fn(*args) for _ in range(runs)]
    return statistics.median(values), values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and fewer repetitions")
    parser.add_argument("--runs", type=int, default=None, help="repetitions per figure (default 7, quick 5)")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 7)
    big = 100_000 if args.quick else 1_000_000
    cycles = 50_000 if args.quick else 200_000
    blocks = 40 if args.quick else 200

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
