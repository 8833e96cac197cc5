"""``python -m cronoq demo``: a realistic mixed workload on the real runtime.

Two pools share one scheduler. ``app`` serves interactive clicks (high
priority, one-second deadlines), reports (normal, with deadlines), nightly
style re-indexing (low), a fixed-start job, a small DAG whose load step fails
and triggers its failure handler, a flaky task that succeeds on its third
attempt, and a checkpointed ingest (chunk, embed, index) whose index stage
fails once: its retry resumes after the embed checkpoint and runs only the
index stage. ``llm`` serves chat turns through a rate-limited API (a token
bucket).

What it shows is told as a story: the notable moments (the fixed start, the
failing load step and its handler, the retries, the resumed ingest, bursts,
pools scaling) are lines in the live view, or printed one by one when the
output is not a terminal (a pipe, a CI log). The report at the end explains
its terms and what the numbers say, over the run's real window, and ends
with the next steps. Everything fits 80 columns and more.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections import defaultdict, deque
from typing import Any

import cronoq

from .core.types import CLASSES, CoreConfig

__all__ = ["run_demo", "demo_scheduler"]

STORY_LINES = 8           # notable moments the live view keeps on screen
NEXT_STEPS = (
    ("the same scheduler as a service, with workers in any language", "docs/server-quickstart.md"),
    ("a live view in the browser", "docs/dashboard.md"),
    ("moving legacy ElasticPriorityScheduler code over", "MIGRATING.md"),
    ("this demo's options (a longer run, a kept store, a trace to replay)", "python -m cronoq demo --help"),
)


class Recorder:
    """What the demo measures itself: per task, when it was submitted and
    started; and the story, the notable moments as they happen."""

    def __init__(self, began: float = 0.0) -> None:
        self.began = began
        self.submitted: dict[int, tuple[float, str, float | None]] = {}
        self.started: dict[int, float] = {}
        self.finished: dict[int, tuple[float, str]] = {}
        self.stages: list[tuple[int, str]] = []       # (attempt, stage) the ingest ran
        self.resumed_from: list[str | None] = []       # per ingest attempt
        self.story: deque[tuple[float, str]] = deque(maxlen=200)
        self.listeners: list[Any] = []                 # called with each new story line
        self.fixed_start_delay: float | None = None

    def tell(self, at: float, text: str) -> None:
        line = (at - self.began, text)
        self.story.append(line)
        for listener in self.listeners:
            listener(line)

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


def _duration(seconds: float) -> str:
    """A wait as a person reads it: 3 ms, 0.42 s, 2.1 s."""
    if seconds < 0.0005:
        return "under 1 ms"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s"
    return f"{seconds:.0f} s"


async def _workload(sched: cronoq.Scheduler, rec: Recorder, seconds: float, rng: random.Random,
                    speed: float, clock: Any = None) -> None:
    clock = clock or sched.clock

    def now() -> float:
        return float(clock.now_ns()) / 1e9

    loop_start = now()

    async def submit(payload: Any, **options: Any) -> Any:
        handle = await sched.submit(payload, **options)
        deadline = options.get("deadline_in")
        # A fixed start "waits" from its start time, not from its submission.
        ready = now() + options.get("start_in", 0.0)
        rec.submitted[handle.id] = (ready, options.get("priority", "normal"),
                                    None if deadline is None else now() + deadline)
        return handle

    # Scheduled work and a pipeline, up front.
    start_in = min(8.0, seconds / 2)
    await submit({"job": "close-books", "due": now() + start_in}, kind="nightly", start_in=start_in,
                 tolerance=1.0, duration_hint=1.0 * speed, priority="normal")
    rec.tell(now(), f"booked close-books to start at +{start_in:g} s (a fixed start: a worker is held for it)")
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
    rec.tell(now(), "a pipeline: extract -> 4 transforms -> load -> alert (if load fails) and cleanup")
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
            rec.tell(now(), "a burst: 150 low-priority re-index tasks at once (clicks still go first)")


INGEST_STAGES = ("chunk", "embed", "index")


def _executor(rec: Recorder, rng: random.Random, speed: float, clock: Any = None) -> Any:
    durations = {"click": 0.03, "chat": 0.25, "report": 0.6, "reindex": 0.15, "etl": 0.3,
                 "load": 0.4, "alert": 0.05, "nightly": 1.0, "flaky": 0.1}
    clock = clock or cronoq.SystemClock()

    def now() -> float:
        return float(clock.now_ns()) / 1e9

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        if ctx.attempt == 1:
            rec.started[ctx.id] = now()
        if ctx.kind == "ingest":
            return await ingest(ctx, payload)
        if ctx.kind == "nightly":
            late = now() - payload["due"]
            rec.fixed_start_delay = late
            rec.tell(now(), f"close-books started at its fixed time ({_duration(max(0.0, late))} late)")
        elif ctx.kind == "alert":
            rec.tell(now(), "alert runs: the failure handler of load (an on-failure dependency)")
        elif ctx.key == "cleanup":
            rec.tell(now(), "cleanup runs: it waits for load to end, however it ends")
        await clock.sleep(durations.get(ctx.kind, 0.1) * speed * rng.lognormvariate(0, 0.4))
        if ctx.kind == "load":
            rec.tell(now(), "load failed for good (Permanent: the warehouse rejected it): no retry")
            raise cronoq.Permanent("the warehouse rejected the load")
        if ctx.kind == "flaky" and ctx.attempt < 3:
            rec.tell(now(), f"flaky failed on attempt {ctx.attempt} (upstream 503): retried after a backoff")
            raise cronoq.Retryable(f"upstream 503 on attempt {ctx.attempt}")
        if ctx.kind == "flaky":
            rec.tell(now(), f"flaky succeeded on attempt {ctx.attempt}")
        rec.finished[ctx.id] = (now(), "succeeded")
        return {"ok": True, "attempt": ctx.attempt}

    async def ingest(ctx: cronoq.TaskContext, payload: Any) -> Any:
        # Each stage checkpoints its result; a retry skips what is checkpointed.
        rec.resumed_from.append(ctx.resumed_from)
        if ctx.resumed_from:
            rec.tell(now(), f"ingest attempt {ctx.attempt} resumes after its {ctx.resumed_from!r} checkpoint: "
                            f"only the stages left run")
        for stage in INGEST_STAGES:
            if stage in ctx.checkpoints:
                continue
            rec.stages.append((ctx.attempt, stage))
            await clock.sleep(0.3 * speed)
            if stage == "index" and ctx.attempt == 1:
                rec.tell(now(), "ingest failed in its index stage; chunk and embed are checkpointed")
                raise cronoq.Retryable("the search index is read-only for a moment")
            await ctx.checkpoint(stage, {"stage": stage, "doc": payload["doc"]})
        rec.finished[ctx.id] = (now(), "succeeded")
        return {"ok": True, "attempt": ctx.attempt, "stages": ctx.completed_stages}

    return run


def demo_scheduler(run: Any, *, seed: int, **options: Any) -> cronoq.Scheduler:
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


# ---------------------------------------------------------------- the live view


def _live_table(snap: Any) -> Any:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("pool", "workers", "desired", "busy", "queued", "done", "wait p50"):
        table.add_column(column, justify="left" if column == "pool" else "right", no_wrap=True)
    for p in snap.pools:
        table.add_row(p.name, str(p.capacity), str(p.desired), str(p.busy), str(p.pending), str(p.succeeded),
                      _duration(p.wait_p50))
    return table


def _story(lines: Any) -> Any:
    """Moments as a two-column grid: the time, and the text wrapping under itself."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right", style="dim", no_wrap=True)
    grid.add_column()
    for at, line in lines:
        grid.add_row(f"{at:.1f} s", line)
    return grid


def _paragraph(text: str, **style: Any) -> Any:
    from rich.padding import Padding
    from rich.text import Text

    return Padding(Text(text, **style), (0, 0, 0, 2), expand=False)


def _frame(snap: Any, rec: Recorder, elapsed: float, height: int) -> Any:
    from rich.console import Group
    from rich.text import Text

    header = Text.assemble(("cronoq demo", "bold"), f"  {elapsed:4.1f} s   {snap.live_tasks} live, "
                           f"{snap.running} running, {snap.totals['succeeded']} done, "
                           f"{snap.totals['retries']} retries")
    # The story gets what the terminal leaves (the frame never outgrows it, or each refresh would scroll).
    # (Story lines may wrap: count two rows each.)
    room = max(1, min(STORY_LINES, (height - 6 - len(snap.pools)) // 2))
    return Group(header, Text(""), _live_table(snap), Text(""), _story(list(rec.story)[-room:]))


# ---------------------------------------------------------------- the report


def _report(console: Any, snap: Any, rec: Recorder, seconds: float, elapsed: float, seed: int, window: float,
            kept_path: str | None, epoch: int | None) -> None:
    from rich.table import Table

    span = (f"the whole {elapsed:.0f} s run" if elapsed <= window
            else f"the last {window:.0f} s of the {elapsed:.0f} s run")
    console.rule(f"cronoq demo: {seconds:g} s of mixed work (seed {seed})")
    console.print("[bold]What happened[/]")
    console.print(_paragraph("") if not rec.story else _story(rec.story))

    pools = Table(title=f"pools, over {span}", title_justify="left", header_style="bold")
    for column in ("pool", "workers", "desired", "done", "adherence", "on time", "busy", "cost $"):
        pools.add_column(column, justify="left" if column == "pool" else "right", no_wrap=True)
    for p in snap.pools:
        pools.add_row(p.name, str(p.capacity), str(p.desired), str(p.succeeded), f"{p.priority_adherence:.0%}",
                      f"{p.fixed_start_hit_rate:.0%}", f"{p.utilization:.0%}", f"{p.cost:.4f}")
    console.print()
    console.print(pools)
    console.print(_paragraph(
        "workers: worker slots now; desired: what the autoscaler asks for (queue pressure, wait "
        "objectives, booked fixed starts); done: tasks that succeeded; adherence: the share of starts that "
        "kept priority order; on time: fixed starts begun within their tolerance; busy: the share of "
        "worker time spent running tasks; cost: worker-seconds times each pool's price since the start.",
        style="dim"))

    classes = Table(title="waits by class, whole run", title_justify="left", header_style="bold")
    for column in ("class", "tasks", "median", "p99", "longest"):
        classes.add_column(column, justify="left" if column == "class" else "right", no_wrap=True)
    waits = rec.waits_by_class()
    for name in CLASSES:
        values = waits.get(name, [])
        if values:
            classes.add_row(name, str(len(values)), _duration(_percentile(values, 0.5)),
                            _duration(_percentile(values, 0.99)), _duration(max(values)))
    console.print()
    console.print(classes)
    high, low = waits.get("high"), waits.get("low")
    console.print(_paragraph("A wait runs from a task's submission (its start time, for a fixed start) to "
                             "its first start; the pipeline's steps also wait for the steps before them.",
                             style="dim"))
    if high and low:
        console.print(_paragraph(
            f"High-priority work waited {_duration(_percentile(high, 0.5))} at the median, low-priority "
            f"{_duration(_percentile(low, 0.5))}: when workers are scarce, urgent work goes first, and waiting "
            f"work ages so that nothing starves."))

    met, total = rec.deadlines()
    totals = snap.totals
    console.print()
    console.print("[bold]Totals, whole run[/] (tasks, not attempts)")
    console.print(_paragraph(
        f"{totals['submitted']} submitted, {totals['succeeded']} succeeded, {totals['failed']} failed "
        f"(the pipeline's load step), {totals['skipped']} skipped, {totals['dead_lettered']} dead-lettered; "
        f"{totals['retries']} retries; deadlines met: {met} of {total}."))
    console.print(_paragraph(_ingest_line(rec)))
    epoch_text = f", leader epoch {epoch}" if epoch else ""
    if kept_path is None:
        console.print(_paragraph(f"State was kept in a temporary SQLite file{epoch_text}: every submission "
                                 f"was committed before it was acknowledged."))
    else:   # the path on a line of its own, never wrapped, so that it can be copied
        console.print(_paragraph(f"State was kept in this SQLite file{epoch_text}: every submission was "
                                 f"committed before it was acknowledged."))
        console.print(f"  {kept_path}", soft_wrap=True, markup=False)
    console.print()
    console.print("[bold]Next steps[/]")
    for what, where_ in NEXT_STEPS:
        console.print(_paragraph(f"{what}: {where_}"))


def _ingest_line(rec: Recorder) -> str:
    """What the checkpointed ingest ran, attempt by attempt."""
    parts = []
    for attempt, resumed in enumerate(rec.resumed_from, 1):
        ran = ", ".join(stage for a, stage in rec.stages if a == attempt) or "nothing"
        start = f"resumed after {resumed!r}" if resumed else "started fresh"
        parts.append(f"attempt {attempt} {start}, ran {ran}")
    return "checkpointed ingest: " + ("; ".join(parts) if parts else "did not run")


# ---------------------------------------------------------------- running it


async def _main(seconds: float, seed: int, speed: float, live: bool, store_path: str, kept: bool,
                record: str | None = None) -> int:
    from rich.console import Console

    rng = random.Random(seed)
    rec = Recorder(time.time())
    run = _executor(rec, rng, speed)
    console = Console(highlight=False)
    # Durable state: every submission is committed to a SQLite file before it
    # is acknowledged (payloads and results are JSON).
    store = cronoq.SqliteStore(store_path)
    sched = demo_scheduler(run, seed=seed, store=store)
    recorder = None
    if record is not None:
        from .whatif import TraceRecorder

        recorder = TraceRecorder(sched, record)   # before start: it times every attempt
    try:
        await _run(sched, rec, console, seconds, seed, rng, speed, live and console.is_terminal,
                   store_path if kept else None)
    finally:
        if recorder is not None:
            recorder.close()
            console.print(f"trace written to {record} (replay it: python -m cronoq.whatif {record})")
        await store.close()
    return 0


async def _run(sched: cronoq.Scheduler, rec: Recorder, console: Any, seconds: float, seed: int,
               rng: random.Random, speed: float, live: bool, kept_path: str | None) -> None:
    from rich.live import Live

    if not live:   # a pipe or a log: each moment once, as it happens
        rec.listeners.append(lambda line: console.print(_story([line])))
    async with sched:
        rec.began = time.time()
        work = asyncio.create_task(_workload(sched, rec, seconds, rng, speed))
        desired: dict[str, tuple[int, float]] = {}   # pool -> desired workers last told, and when
        with Live(console=console, refresh_per_second=4, transient=True, auto_refresh=live) as view:
            while not work.done() or (await sched.snapshot()).live_tasks:
                snap = await sched.snapshot()
                now = time.time()
                for pool in snap.pools:
                    told = desired.get(pool.name)
                    if told is None:
                        desired[pool.name] = (pool.desired, now)
                    elif pool.desired != told[0] and now - told[1] >= 3.0:   # (one line a few seconds at most)
                        way = "up" if pool.desired > told[0] else "down"
                        rec.tell(now, f"pool {pool.name} scales {way}: {told[0]} -> {pool.desired} workers desired")
                        desired[pool.name] = (pool.desired, now)
                if live:
                    view.update(_frame(snap, rec, time.time() - rec.began, console.height))
                if time.time() - rec.began > seconds + 30:
                    break   # a safety net: never run away
                await asyncio.sleep(0.25)
        await work
        snap = await sched.snapshot()
    window = CoreConfig().metrics_window_ns / 1e9   # (the demo keeps the default window)
    _report(console, snap, rec, seconds, time.time() - rec.began, seed, window, kept_path, sched.epoch)


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
