"""What a replay (or the live run a trace recorded) did: figures per variant.

The same figures come from a replay's results and from a trace's own record
of the live run, so the two can be set side by side:

- waits per class: from submission (or the fixed start, if later) to the
  first attempt's start, p50/p90/p99 and max (nearest rank);
- deadline misses: tasks with a deadline that did not succeed by it;
- fixed-start hit rate: fixed starts whose first attempt began within their
  tolerance (default 1 s) of the start time;
- priority adherence and utilization per pool, over the whole replay (the
  engine's own measures); worker-seconds and cost from the start of the
  trace to the end of the replay;
- how tasks ended: succeeded, failed, dead-lettered, cancelled, skipped,
  missed, shed, refused at admission, or never.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Sequence

from ..core.types import CLASSES, NS
from .replay import DUPLICATE, REFUSED, ReplayResult
from .trace import Trace

__all__ = ["Waits", "PoolFigures", "Figures", "figures_of", "live_figures", "Report", "percentile",
           "ENDINGS"]

ENDINGS = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed", REFUSED,
           DUPLICATE, "unfinished")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile of sorted ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class Waits:
    """Waits of one class, in seconds."""

    tasks: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: list[float]) -> Waits:
        values.sort()
        return cls(len(values), percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99),
                   values[-1] if values else 0.0, math.fsum(values) / len(values) if values else 0.0)


@dataclass
class PoolFigures:
    name: str
    dispatched: int
    priority_adherence: float
    utilization: float
    worker_seconds: float
    cost: float


@dataclass
class Figures:
    """One column of the report: a variant's replay, or the live run."""

    name: str
    waits: dict[str, Waits]             # per class that had tasks, and "all"
    deadline_tasks: int
    deadline_misses: int
    fixed_starts: int
    fixed_start_hits: int
    endings: dict[str, int]
    attempts: int
    retries: int
    makespan: float                     # seconds from the trace's start to the last end
    pools: list[PoolFigures] | None     # None for the live run (the trace does not measure them)
    worker_seconds: float | None
    cost: float | None
    durations: str | None = None
    seed: int | None = None
    start_delay: float | None = None
    modelled_attempts: int = 0
    wall_seconds: float | None = None
    policy: dict[str, Any] | None = None
    timeline: dict[str, Any] = field(default_factory=dict)

    @property
    def deadline_miss_rate(self) -> float:
        return self.deadline_misses / self.deadline_tasks if self.deadline_tasks else 0.0

    @property
    def fixed_start_hit_rate(self) -> float:
        return self.fixed_start_hits / self.fixed_starts if self.fixed_starts else 1.0

    @property
    def priority_adherence(self) -> float | None:
        if self.pools is None:
            return None
        dispatched = sum(p.dispatched for p in self.pools)
        if not dispatched:
            return 1.0
        return sum(p.priority_adherence * p.dispatched for p in self.pools) / dispatched

    @property
    def utilization(self) -> float | None:
        if self.pools is None:
            return None
        capacity = sum(p.worker_seconds for p in self.pools)
        if not capacity:
            return 0.0
        return sum(p.utilization * p.worker_seconds for p in self.pools) / capacity

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["deadline_miss_rate"] = self.deadline_miss_rate
        out["fixed_start_hit_rate"] = self.fixed_start_hit_rate
        out["priority_adherence"] = self.priority_adherence
        out["utilization"] = self.utilization
        return out


class _Static:
    """What the figures need of a trace, computed once for every variant."""

    def __init__(self, trace: Trace) -> None:
        t0 = trace.t0_ns
        self.t0 = t0
        self.classes: list[int] = []
        self.ready: list[int] = []        # when the task could first start: submission or fixed start
        self.deadline: list[int | None] = []
        self.fixed: list[tuple[int, int] | None] = []   # (start, tolerance)
        for t in trace.tasks:
            spec = t.spec
            submitted = t0 + t.at_ns
            self.classes.append(spec.priority)
            start = spec.start_at_ns
            if start is None and spec.start_in_ns is not None:
                start = submitted + spec.start_in_ns
            self.ready.append(submitted if start is None else max(submitted, start))
            deadline = spec.deadline_at_ns
            if deadline is None and spec.deadline_in_ns is not None:
                deadline = submitted + spec.deadline_in_ns
            self.deadline.append(deadline)
            self.fixed.append(None if start is None else
                              (start, spec.tolerance_ns if spec.tolerance_ns is not None else NS))


def _figures(name: str, static: _Static, first_start: Sequence[int], end: Sequence[int],
             status: Sequence[str | None], attempts: Sequence[int], bins: int) -> Figures:
    per_class: list[list[float]] = [[], [], [], []]
    by_time: list[tuple[int, int, float]] = []
    misses = with_deadline = fixed = hits = 0
    endings = dict.fromkeys(ENDINGS, 0)
    last = static.t0
    total_attempts = retries = 0
    classes, ready, deadlines, fixed_starts = static.classes, static.ready, static.deadline, static.fixed
    for i, started in enumerate(first_start):
        ended = status[i]
        endings[ended if ended is not None else "unfinished"] += 1
        if end[i] > last:
            last = end[i]
        n = attempts[i]
        total_attempts += n
        if n > 1:
            retries += n - 1
        if started >= 0:
            wait = max(0, started - ready[i]) / NS
            per_class[classes[i]].append(wait)
            by_time.append((ready[i], classes[i], wait))
        deadline = deadlines[i]
        if deadline is not None and ended not in (REFUSED, DUPLICATE):
            with_deadline += 1
            if not (ended == "succeeded" and end[i] <= deadline):
                misses += 1
        booking = fixed_starts[i]
        if booking is not None and ended not in (REFUSED, DUPLICATE):
            fixed += 1
            if started >= 0 and abs(started - booking[0]) <= booking[1]:
                hits += 1
    everything = [w for waits in per_class for w in waits]
    waits = {CLASSES[c]: Waits.of(per_class[c]) for c in range(4) if per_class[c]}
    waits["all"] = Waits.of(everything)
    return Figures(name, waits, with_deadline, misses, fixed, hits, endings, total_attempts, retries,
                   (last - static.t0) / NS, None, None, None, timeline=_wait_timeline(by_time, static.t0, bins))


def _wait_timeline(rows: list[tuple[int, int, float]], t0: int, bins: int) -> dict[str, Any]:
    """p90 of the waits of each class, by when the tasks became ready, in ``bins`` slices."""
    if not rows or bins <= 0:
        return {}
    last = max(r[0] for r in rows)
    width = max(1, (last - t0) // bins + 1)
    slices: dict[int, list[list[float]]] = {}
    for at, c, wait in rows:
        slices.setdefault(c, [[] for _ in range(bins)])[min(bins - 1, max(0, (at - t0) // width))].append(wait)
    out: dict[str, Any] = {"bin_seconds": width / NS, "wait_p90": {}}
    for c, columns in sorted(slices.items()):
        out["wait_p90"][CLASSES[c]] = [percentile(sorted(col), 0.9) if col else None for col in columns]
    return out


def figures_of(trace: Trace, result: ReplayResult, *, bins: int = 60, static: _Static | None = None) -> Figures:
    """The figures of one variant's replay."""
    static = static or _Static(trace)
    out = _figures(result.variant.name, static, result.first_start, result.end, result.status,
                   result.attempts, bins)
    out.pools = [PoolFigures(p.name, p.dispatched, p.priority_adherence, p.utilization, p.worker_seconds, p.cost)
                 for p in result.pools]
    out.worker_seconds = sum(p.worker_seconds for p in result.pools)
    out.cost = sum(p.cost for p in result.pools)
    out.durations = result.durations
    out.seed = result.seed
    out.start_delay = result.start_delay
    out.modelled_attempts = result.modelled_attempts
    out.wall_seconds = result.wall_seconds
    out.policy = result.variant.changes
    if result.samples:
        names = list(result.samples[0][1])
        out.timeline["pools"] = {
            name: {"t": [(t - static.t0) / NS for t, _ in result.samples],
                   "capacity": [row[name][0] for _, row in result.samples],
                   "desired": [row[name][1] for _, row in result.samples],
                   "busy": [row[name][2] for _, row in result.samples],
                   "pending": [row[name][3] for _, row in result.samples]}
            for name in names}
    return out


def live_figures(trace: Trace, *, bins: int = 60, static: _Static | None = None) -> Figures | None:
    """The live run's figures, from what the trace recorded (None if it recorded no runs)."""
    if not trace.has_live_record:
        return None
    static = static or _Static(trace)
    t0 = trace.t0_ns
    n = len(trace.tasks)
    first_start = [-1] * n
    end = [-1] * n
    status: list[str | None] = [None] * n
    attempts = [0] * n
    for i, t in enumerate(trace.tasks):
        runs = t.attempts or []
        attempts[i] = len(runs)
        if runs and runs[0].start is not None:
            first_start[i] = t0 + round(runs[0].start * NS)
        if t.refused is not None:
            status[i] = REFUSED
            end[i] = t0 + t.at_ns
        elif t.status is not None and t.end_ns is not None:
            status[i] = t.status
            end[i] = t0 + t.end_ns
    out = _figures("live (recorded)", static, first_start, end, status, attempts, bins)
    usage = trace.meta.get("usage")
    if isinstance(usage, dict):
        out.worker_seconds = usage.get("worker_seconds")
        out.cost = usage.get("cost")
    return out


class Report:
    """Every variant's figures, and the live run's when the trace has them."""

    def __init__(self, trace: Trace, results: Sequence[ReplayResult], *, bins: int = 60) -> None:
        static = _Static(trace)
        self.trace = trace
        self.results = list(results)
        self.variants = [figures_of(trace, r, bins=bins, static=static) for r in results]
        self.live = live_figures(trace, bins=bins, static=static)

    @property
    def columns(self) -> list[Figures]:
        return ([self.live] if self.live is not None else []) + self.variants

    def as_dict(self) -> dict[str, Any]:
        trace = self.trace
        return {
            "trace": {"tasks": len(trace.tasks), "t0": trace.t0_ns / NS, "span_seconds": trace.span_ns / NS,
                      "recorded_policy": trace.policy is not None, "meta": trace.meta},
            "live": None if self.live is None else self.live.as_dict(),
            "variants": [v.as_dict() for v in self.variants],
        }

    def to_json(self, f: IO[str] | None = None, *, timelines: bool = True) -> str:
        data = self.as_dict()
        if not timelines:
            for column in [data["live"], *data["variants"]]:
                if column is not None:
                    column.pop("timeline", None)
        text = json.dumps(data, indent=2, sort_keys=False)
        if f is not None:
            f.write(text)
            f.write("\n")
        return text

    # -------------------------------------------------------------- the terminal tables

    def tables(self) -> list[Any]:
        """rich tables: waits by class, outcomes, capacity and cost."""
        from rich.table import Table

        waits = Table(title="waits by class, seconds (submission or fixed start -> first start)")
        for column in ("variant", "class", "tasks", "p50", "p90", "p99", "max"):
            waits.add_column(column, justify="left" if column in ("variant", "class") else "right")
        for fig in self.columns:
            for name in (*CLASSES, "all"):
                w = fig.waits.get(name)
                if w is None or not w.tasks:
                    continue
                waits.add_row(fig.name, name, str(w.tasks), f"{w.p50:.3f}", f"{w.p90:.3f}", f"{w.p99:.3f}",
                              f"{w.max:.3f}")
            waits.add_section()
        summary = Table(title="outcomes")
        for column in ("variant", "deadline misses", "fixed-start hits", "retries", "failed+dead", "shed",
                       "refused", "unfinished", "makespan s"):
            summary.add_column(column, justify="left" if column == "variant" else "right")
        usage = Table(title="capacity and cost")
        for column in ("variant", "priority adherence", "utilization", "worker-s", "cost $"):
            usage.add_column(column, justify="left" if column == "variant" else "right")
        for fig in self.columns:
            e = fig.endings
            summary.add_row(
                fig.name,
                f"{fig.deadline_misses}/{fig.deadline_tasks}" if fig.deadline_tasks else "-",
                f"{fig.fixed_start_hit_rate:.0%} of {fig.fixed_starts}" if fig.fixed_starts else "-",
                str(fig.retries), str(e["failed"] + e["dead_lettered"]), str(e["shed"]), str(e[REFUSED]),
                str(e["unfinished"]), f"{fig.makespan:.1f}")
            usage.add_row(
                fig.name,
                "-" if fig.priority_adherence is None else f"{fig.priority_adherence:.3f}",
                "-" if fig.utilization is None else f"{fig.utilization:.0%}",
                "-" if fig.worker_seconds is None else f"{fig.worker_seconds:.0f}",
                "-" if fig.cost is None else f"{fig.cost:.4f}")
        return [waits, summary, usage]

    def print(self, console: Any = None) -> None:
        from rich.console import Console

        console = console or Console()
        for table in self.tables():
            console.print(table)
        notes = self.notes()
        for note in notes:
            console.print(f"note: {note}")

    def notes(self) -> list[str]:
        out = []
        for fig in self.variants:
            if fig.modelled_attempts:
                out.append(f"{fig.name}: {fig.modelled_attempts} attempts had no recorded run time; they ran "
                           f"for the kind's figure ([durations] in the policy file, the trace's estimate, "
                           f"or the kind's median), else the task's duration_hint or the pool's default_duration")
        from .policy import with_live_capacity

        _, live = with_live_capacity(self.trace.policy, self.trace.samples)
        for pool, capacity in live.items():
            out.append(f"pool {pool!r} does not autoscale itself: its capacity came from outside the engine "
                       f"live (workers, set_capacity), and the replays start it at {capacity}, its median "
                       f"recorded capacity while it had work (set pools.{pool}.initial in the policy file to "
                       f"choose, or external_capacity = false to let its autoscaler set it)")
        if self.trace.meta.get("durations_estimated"):
            out.append("the trace was built from a store, which keeps no run times: the per-kind run times "
                       "are estimates (the median time from submission to end of tasks that succeeded at once)")
        dropped = self.trace.meta.get("dropped")
        if dropped:
            out.append(f"the recorder dropped {dropped} records (its buffer was full): the trace is incomplete")
        return out
