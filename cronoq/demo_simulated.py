"""A deterministic simulation of a mixed workload through the engine.

Ten virtual minutes of interactive, batch and background work on an
autoscaled pool, with deadlines, a rate-limited API, a nightly-style fixed
start, a small DAG with a failure handler and a flaky task that retries. It
runs in virtual time (a second or two of real time) and prints what each
class experienced.
"""

from __future__ import annotations

import random
from collections import defaultdict

from .core import (
    NS, RETRYABLE, SUCCESS, AutoscaleConfig, CoreConfig, Core, Dep, PoolConfig, ResourceConfig,
    RetryPolicy, TaskSpec,
)
from .core.types import CLASSES
from .simulation import Run, Simulator

START = 1_767_225_600   # 2026-01-01T00:00:00Z: virtual time begins here


def build(seed: int) -> tuple[Core, Simulator, dict]:
    core = Core(
        CoreConfig(seed=seed),
        [PoolConfig("app", min=2, max=24, initial=4,
                    autoscale=AutoscaleConfig(slo={"critical": 0.5, "high": 2.0},
                                              cost_per_worker_second=0.0011))],
        [ResourceConfig.token_bucket("llm-api", rate=5.0, burst=10)],
        now=START * NS,
    )
    rng = random.Random(seed)
    meta: dict[int, dict] = {}

    def model(dispatch):
        kind = dispatch.kind
        if kind == "flaky" and dispatch.attempt < 3:
            return Run(0.2, RETRYABLE, "upstream 503", retry_after=1.0)
        if kind == "load":
            return Run(2.0, "permanent", "warehouse rejected the load")
        base = {"click": 0.05, "report": 4.0, "reindex": 1.5, "chat": 0.8, "nightly": 20.0}.get(kind, 0.5)
        return Run(base * rng.lognormvariate(0, 0.5), SUCCESS)

    sim = Simulator(core, model)
    return core, sim, meta


def workload(sim: Simulator, seed: int, minutes: int, meta: dict) -> None:
    rng = random.Random(seed + 1)
    t = float(START)
    end = START + minutes * 60

    def submit(spec, at, label, deadline=None):
        task_id, _ = sim.submit(spec, at=at)
        meta[task_id] = {"label": label, "class": spec.priority, "submitted": at, "deadline": deadline}
        return task_id

    # A fixed-start job two minutes in, and a DAG whose load step fails.
    submit(TaskSpec("close-books", kind="nightly", start_at=START + 120, tolerance=2.0,
                    duration_hint=20.0), START, "fixed start")
    sim.core.submit_batch(sim.now, [
        TaskSpec("extract", key="extract", kind="report"),
        TaskSpec("transform", key="transform", kind="report", after="extract"),
        TaskSpec("load", key="load", kind="load", after="transform"),
        TaskSpec("alert", key="alert", deps=[Dep("load", on="failure")]),
    ])
    while t < end:
        t += rng.expovariate(6.0)      # about six arrivals a second in all
        roll = rng.random()
        if roll < 0.45:
            submit(TaskSpec("click", kind="click", priority="high", deadline_in=1.0), t, "interactive", t + 1.0)
        elif roll < 0.60:
            submit(TaskSpec("chat", kind="chat", priority="high", resources={"llm-api": 1},
                            deadline_in=5.0), t, "llm chat", t + 5.0)
        elif roll < 0.80:
            submit(TaskSpec("report", kind="report", priority="normal", deadline_in=60.0), t,
                   "report", t + 60.0)
        elif roll < 0.98:
            submit(TaskSpec("reindex", kind="reindex", priority="low"), t, "background")
        else:
            submit(TaskSpec("flaky", kind="flaky", priority="normal",
                            retry=RetryPolicy(max_attempts=4, initial_backoff=0.5)), t, "flaky")
        if rng.random() < 0.002:
            # A burst of background work, as from a nightly re-index.
            for _ in range(300):
                submit(TaskSpec("reindex", kind="reindex", priority="low"), t, "background")
    sim.run()


def summarize(sim: Simulator, meta: dict) -> list[dict]:
    rows: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "waits": [], "met": 0, "with_deadline": 0,
                                                 "retries": 0, "failed": 0})
    for task_id, info in meta.items():
        rec = sim.records.get(task_id)
        row = rows[info["label"]]
        row["class"] = CLASSES[info["class"]]
        row["tasks"] += 1
        if rec is None or not rec.dispatches:
            continue
        row["waits"].append(rec.dispatches[0] - info["submitted"])
        row["retries"] += len(rec.dispatches) - 1
        if rec.status != "succeeded":
            row["failed"] += 1
        if info["deadline"] is not None:
            row["with_deadline"] += 1
            if rec.ended is not None and rec.ended <= info["deadline"]:
                row["met"] += 1
    out = []
    for label, row in rows.items():
        waits = sorted(row["waits"])

        def q(f):
            return waits[min(len(waits) - 1, int(f * len(waits)))] if waits else 0.0

        out.append({
            "workload": label, "class": row["class"], "tasks": row["tasks"],
            "wait_p50": q(0.5), "wait_p90": q(0.9), "wait_max": waits[-1] if waits else 0.0,
            "deadlines_met": (row["met"] / row["with_deadline"]) if row["with_deadline"] else None,
            "retries": row["retries"], "not_succeeded": row["failed"],
        })
    order = {name: i for i, name in enumerate(CLASSES)}
    out.sort(key=lambda r: (order[r["class"]], r["workload"]))
    return out


def main(seed: int = 7, minutes: int = 10) -> int:
    from rich.console import Console
    from rich.table import Table

    core, sim, meta = build(seed)
    workload(sim, seed, minutes, meta)
    console = Console()
    table = Table(title=f"cronoq engine, {minutes} virtual minutes (seed {seed})")
    for column in ("workload", "class", "tasks", "wait p50 s", "wait p90 s", "wait max s",
                   "deadlines met", "retries", "not succeeded"):
        table.add_column(column, justify="left" if column in ("workload", "class") else "right")
    for r in summarize(sim, meta):
        met = "-" if r["deadlines_met"] is None else f"{r['deadlines_met']:.0%}"
        table.add_row(r["workload"], r["class"], str(r["tasks"]), f"{r['wait_p50']:.3f}",
                      f"{r['wait_p90']:.3f}", f"{r['wait_max']:.3f}", met, str(r["retries"]),
                      str(r["not_succeeded"]))
    console.print(table)
    snap = core.snapshot(sim.now)
    pool = snap.pool("app")
    console.print(
        f"pool app: capacity {pool.capacity} (desired {pool.desired}), cost ${pool.cost:.4f} for "
        f"{pool.worker_seconds:.0f} worker-seconds, fixed-start hit rate {pool.fixed_start_hit_rate:.0%}, "
        f"peak capacity {max((d for _, _, d in sim.scales), default=pool.capacity)}")
    console.print("totals: " + ", ".join(f"{k} {v}" for k, v in snap.totals.items() if v))
    return 0
