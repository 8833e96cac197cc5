"""``python -m cronoq demo``: a realistic mixed workload on the real runtime.

Two pools share one scheduler. ``app`` serves interactive clicks (high
priority, one-second deadlines), reports (normal, with deadlines), nightly
style re-indexing (low), a fixed-start job, a small DAG whose load step fails
and triggers its failure handler, a flaky task that succeeds on its third
attempt, and a checkpointed ingest (chunk, embed, index) whose index stage
fails once: its retry resumes after the embed checkpoint and runs only the
index stage. ``llm`` serves chat turns through a rate-limited API (a token
bucket). A live view shows the pools while it runs; at the end a table
reports waits by class, priority adherence, fixed-start hit rate,
utilization and cost.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections import defaultdict

import cronoq

from .core.types import CLASSES

__all__ = ["run_demo", "demo_scheduler"]


class Recorder:
    """What the demo measures itself: per task, when it was submitted and started."""

    def __init__(self) -> None:
        self.submitted: dict[int, tuple[float, str, float | None]] = {}
        self.started: dict[int, float] = {}
        self.finished: dict[int, tuple[float, str]] = {}
        self.stages: list[tuple[int, str]] = []       # (attempt, stage) the ingest ran
        self.resumed_from: list[str | None] = []       # per ingest attempt

    def waits_by_class(self) -> dict[str, list[float]]:
        waits: dict[str, list[float]] = defaultdict(list)
        for task_id, (at, cls, _) in self.submitted.items():
            started = self.started.get(task_id)
            if started is not None:
                waits[cls].append(started - at)
        return waits

    def deadlines(self) -> tuple[int, int]:
        met = total = 0
        for task_id, (_, _, deadline) in self.submitted.items():
            if deadline is None or task_id not in self.finished:
                continue
            total += 1
            if self.finished[task_id][0] <= deadline:
                met += 1
        return met, total


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _workload(sched: cronoq.Scheduler, rec: Recorder, seconds: float, rng: random.Random,
                    speed: float, clock=None) -> None:
    clock = clock or sched.clock

    def now() -> float:
        return clock.now_ns() / 1e9

    loop_start = now()

    async def submit(payload, **options):
        handle = await sched.submit(payload, **options)
        deadline = options.get("deadline_in")
        # A fixed start "waits" from its start time, not from its submission.
        ready = now() + options.get("start_in", 0.0)
        rec.submitted[handle.id] = (ready, options.get("priority", "normal"),
                                    None if deadline is None else now() + deadline)
        return handle

    # Scheduled work and a pipeline, up front.
    await submit({"job": "close-books"}, kind="nightly", start_in=min(8.0, seconds / 2),
                 tolerance=1.0, duration_hint=1.0 * speed, priority="normal")
    pipeline = [cronoq.Task({"step": "extract"}, key="extract", kind="etl")]
    pipeline += [cronoq.Task({"step": "transform", "shard": i}, key=f"transform-{i}", kind="etl",
                             after="extract") for i in range(4)]
    pipeline += [
        cronoq.Task({"step": "load"}, key="load", kind="load", after=[f"transform-{i}" for i in range(4)]),
        cronoq.Task({"step": "alert"}, key="alert", kind="alert", deps=[cronoq.Dep("load", on="failure")]),
        cronoq.Task({"step": "cleanup"}, key="cleanup", kind="etl", deps=[cronoq.Dep("load", on="complete")]),
    ]
    for handle in await sched.submit_batch(pipeline):
        rec.submitted[handle.id] = (now(), "normal", None)
    await submit({"job": "flaky"}, kind="flaky",
                 retry=cronoq.RetryPolicy(max_attempts=4, initial_backoff=0.2, jitter=False))
    await submit({"doc": "handbook.pdf"}, kind="ingest", key="ingest:handbook", stages=list(INGEST_STAGES),
                 retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.2, jitter=False))

    while now() - loop_start < seconds:
        await clock.sleep(rng.expovariate(60.0))
        roll = rng.random()
        if roll < 0.45:
            await submit({"click": rng.randrange(1000)}, kind="click", priority="high", deadline_in=1.0)
        elif roll < 0.60:
            await submit({"prompt": "summarize"}, pool="llm", kind="chat", priority="high",
                         resources={"llm-api": 1}, deadline_in=3.0)
        elif roll < 0.75:
            await submit({"report": rng.randrange(100)}, kind="report", priority="normal", deadline_in=10.0)
        else:
            await submit({"doc": rng.randrange(10**6)}, kind="reindex", priority="low")
        if rng.random() < 0.004:
            for _ in range(150):    # a burst of background work
                await submit({"doc": rng.randrange(10**6)}, kind="reindex", priority="low")


INGEST_STAGES = ("chunk", "embed", "index")


def _executor(rec: Recorder, rng: random.Random, speed: float, clock=None):
    durations = {"click": 0.03, "chat": 0.25, "report": 0.6, "reindex": 0.15, "etl": 0.3,
                 "load": 0.4, "alert": 0.05, "nightly": 1.0, "flaky": 0.1}
    clock = clock or cronoq.SystemClock()

    async def run(ctx: cronoq.TaskContext, payload):
        if ctx.attempt == 1:
            rec.started[ctx.id] = clock.now_ns() / 1e9
        if ctx.kind == "ingest":
            return await ingest(ctx, payload)
        await clock.sleep(durations.get(ctx.kind, 0.1) * speed * rng.lognormvariate(0, 0.4))
        if ctx.kind == "load":
            raise cronoq.Permanent("the warehouse rejected the load")
        if ctx.kind == "flaky" and ctx.attempt < 3:
            raise cronoq.Retryable(f"upstream 503 on attempt {ctx.attempt}")
        rec.finished[ctx.id] = (clock.now_ns() / 1e9, "succeeded")
        return {"ok": True, "attempt": ctx.attempt}

    async def ingest(ctx: cronoq.TaskContext, payload):
        # Each stage checkpoints its result; a retry skips what is checkpointed.
        rec.resumed_from.append(ctx.resumed_from)
        for stage in INGEST_STAGES:
            if stage in ctx.checkpoints:
                continue
            rec.stages.append((ctx.attempt, stage))
            await clock.sleep(0.3 * speed)
            if stage == "index" and ctx.attempt == 1:
                raise cronoq.Retryable("the search index is read-only for a moment")
            await ctx.checkpoint(stage, {"stage": stage, "doc": payload["doc"]})
        rec.finished[ctx.id] = (clock.now_ns() / 1e9, "succeeded")
        return {"ok": True, "attempt": ctx.attempt, "stages": ctx.completed_stages}

    return run


def demo_scheduler(run, *, seed: int, **options) -> cronoq.Scheduler:
    """The demo's two pools and its rate-limited API around executor ``run``
    (``options`` go to the Scheduler: a store, a clock...)."""
    pools = [
        cronoq.Pool("app", run, min=2, max=16,
                    autoscale=cronoq.AutoscaleConfig(slo={"high": 0.5}, cost_per_worker_second=0.0011)),
        cronoq.Pool("llm", run, min=1, max=8,
                    autoscale=cronoq.AutoscaleConfig(cost_per_worker_second=0.004)),
    ]
    resources = [cronoq.Resource.token_bucket("llm-api", rate=8.0, burst=4)]
    return cronoq.Scheduler(pools, resources, seed=seed, **options)


def _pool_table(snap, title: str):
    from rich.table import Table

    table = Table(title=title)
    for column in ("pool", "capacity", "desired", "busy", "pending", "dispatched", "wait p50 s",
                   "wait p99 s", "adherence", "fixed-start hits", "utilization", "cost $"):
        table.add_column(column, justify="left" if column == "pool" else "right")
    for p in snap.pools:
        table.add_row(p.name, str(p.capacity), str(p.desired), str(p.busy), str(p.pending),
                      str(p.dispatched), f"{p.wait_p50:.3f}", f"{p.wait_p99:.3f}",
                      f"{p.priority_adherence:.3f}", f"{p.fixed_start_hit_rate:.0%}",
                      f"{p.utilization:.0%}", f"{p.cost:.4f}")
    return table


async def _main(seconds: float, seed: int, speed: float, live: bool, store_path: str, kept: bool,
                record: str | None = None) -> int:
    from rich.console import Console

    rng = random.Random(seed)
    rec = Recorder()
    run = _executor(rec, rng, speed)
    console = Console(width=max(130, Console().width))
    # Durable state: every submission is committed to a SQLite file before it
    # is acknowledged (payloads and results are JSON).
    store = cronoq.SqliteStore(store_path)
    sched = demo_scheduler(run, seed=seed, store=store)
    recorder = None
    if record is not None:
        from .whatif import TraceRecorder

        recorder = TraceRecorder(sched, record)   # before start: it times every attempt
    try:
        await _run(sched, rec, console, seconds, seed, rng, speed, live,
                   store_path if kept else "a temporary SQLite file")
    finally:
        if recorder is not None:
            recorder.close()
            console.print(f"trace written to {record} (replay it: python -m cronoq.whatif {record})")
        await store.close()
    return 0


async def _run(sched, rec, console, seconds, seed, rng, speed, live, where) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.table import Table

    async with sched:
        work = asyncio.create_task(_workload(sched, rec, seconds, rng, speed))
        started = time.time()
        with Live(console=console, refresh_per_second=4, transient=True, auto_refresh=live) as view:
            while not work.done() or (await sched.snapshot()).live_tasks:
                snap = await sched.snapshot()
                header = Table.grid()
                header.add_row(f"[bold]cronoq demo[/] {time.time() - started:5.1f} s   live tasks "
                               f"{snap.live_tasks}   running {snap.running}   pending {snap.pending}   "
                               f"succeeded {snap.totals['succeeded']}   retries {snap.totals['retries']}")
                if live:
                    view.update(Group(header, _pool_table(snap, "pools (last 60 s)")))
                if time.time() - started > seconds + 30:
                    break   # a safety net: never run away
                await asyncio.sleep(0.25)
        await work
        snap = await sched.snapshot()
    console.print(_pool_table(snap, f"cronoq demo: {seconds:g} s of mixed work (seed {seed})"))
    classes = Table(title="waits by class (submission to first start)")
    for column in ("class", "tasks", "p50 s", "p90 s", "p99 s", "max s"):
        classes.add_column(column, justify="left" if column == "class" else "right")
    waits = rec.waits_by_class()
    for name in CLASSES:
        values = waits.get(name, [])
        if values:
            classes.add_row(name, str(len(values)), f"{_percentile(values, 0.5):.3f}",
                            f"{_percentile(values, 0.9):.3f}", f"{_percentile(values, 0.99):.3f}",
                            f"{max(values):.3f}")
    console.print(classes)
    met, total = rec.deadlines()
    totals = snap.totals
    console.print(
        f"deadlines met {met}/{total}; submitted {totals['submitted']}, succeeded {totals['succeeded']}, "
        f"failed {totals['failed']} (the pipeline's load step), skipped {totals['skipped']}, "
        f"retries {totals['retries']}; state kept in {where} (leader epoch {sched.epoch})")
    console.print(_ingest_line(rec))


def _ingest_line(rec: Recorder) -> str:
    """What the checkpointed ingest ran, attempt by attempt."""
    parts = []
    for attempt, resumed in enumerate(rec.resumed_from, 1):
        ran = ", ".join(stage for a, stage in rec.stages if a == attempt) or "nothing"
        start = f"resumed after {resumed!r}" if resumed else "started fresh"
        parts.append(f"attempt {attempt} {start}, ran {ran}")
    return "checkpointed ingest: " + ("; ".join(parts) if parts else "did not run")


def run_demo(seconds: float = 20.0, seed: int = 7, speed: float = 1.0, live: bool = True,
             store_path: str | None = None, record: str | None = None) -> int:
    """Run the demo; state goes to ``store_path`` (a SQLite file, kept), or by
    default to a file in a temporary directory removed at the end. With
    ``record``, a trace of the run is written there (``cronoq.whatif``)."""
    if store_path is not None:
        return asyncio.run(_main(seconds, seed, speed, live, store_path, True, record))
    with tempfile.TemporaryDirectory(prefix="cronoq-demo-") as directory:
        path = os.path.join(directory, "cronoq-demo.db")
        return asyncio.run(_main(seconds, seed, speed, live, path, False, record))
