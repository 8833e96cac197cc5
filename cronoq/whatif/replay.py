"""Replay a trace through the real engine under virtual time.

The driver plays the runtime's part without a clock: it submits each task of
the trace at its recorded time, runs every dispatched attempt for the time
the duration model gives, reports its outcome when that virtual time comes,
cancels what a user cancelled, and jumps straight to the next submission,
completion or engine timer. It reads the engine's raw action tuples (the fast
way ``cronoq.core.actions`` describes), as ``cronoq.simulation`` does.

Everything that varies is seeded: the engine's retry jitter and the duration
model's draws both come from the variant's seed, so the same trace, policy
and seed give the same replay, bit for bit.
"""

from __future__ import annotations

import heapq
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core import actions as act
from ..core.engine import Core
from ..core.errors import AdmissionError, QueueFull, UnknownTask
from ..core.snapshot import PoolSnapshot
from ..core.types import NS, RETRYABLE, SUCCESS, TERMINAL, TaskSpec
from .policy import DURATION_MODES, PolicyError, Variant
from .trace import ABORTED, Trace

__all__ = ["ReplayResult", "ReplayError", "replay", "REFUSED", "DUPLICATE"]

REFUSED = "refused"       # the replay's scheduler refused the submission (an AdmissionError)
DUPLICATE = "duplicate"   # its key named a task the replay still knew: no new task
_BIG = 1 << 126
_ABORT_MARGIN_NS = 1_000_000   # an aborted attempt runs this much past what stopped it live


class ReplayError(RuntimeError):
    """A replay that could not finish (it ran past its step limit)."""


@dataclass
class ReplayResult:
    """What became of every task of a trace under one variant. Lists are
    indexed like ``trace.tasks``; times are Unix nanoseconds (-1: never)."""

    variant: Variant
    durations: str
    seed: int
    first_start: list[int]
    end: list[int]
    status: list[str | None]       # a terminal status, REFUSED, DUPLICATE, or None (never ended)
    attempts: list[int]
    pools: list[PoolSnapshot]      # at the end (window metrics cover the whole replay)
    totals: dict[str, int]
    finished_ns: int               # virtual time when the replay ended
    samples: list[tuple[int, dict[str, tuple[int, int, int, int]]]] = field(default_factory=list)
    # (time, {pool: (capacity, desired, busy, pending)}) at regular steps
    modelled_attempts: int = 0     # attempts whose run time came from the fallbacks, not the trace
    wall_seconds: float = 0.0      # how long the replay took


class _Model:
    """Run time and outcome of each attempt a replay dispatches."""

    def __init__(self, trace: Trace, mode: str, seed: int, kind_durations: Mapping[str, float],
                 pool_defaults: Mapping[str, int], default_pool: str) -> None:
        self.mode = mode
        self.rng = random.Random(f"cronoq.whatif/{seed}")
        self.fallbacks = 0
        tasks = trace.tasks
        self.kinds = [t.spec.kind for t in tasks]
        self.runs: list[tuple[tuple[int | None, str, int | None], ...] | None] = []
        samples: dict[str, list[list[tuple[int, str, int | None]]]] = {}
        for t in tasks:
            if not t.attempts:
                self.runs.append(None)
                continue
            timeout = t.spec.timeout_ns or 0
            runs: list[tuple[int | None, str, int | None]] = []
            for n, a in enumerate(t.attempts, 1):
                retry = None if a.retry_after is None else round(a.retry_after * NS)
                if a.seconds is None:
                    runs.append((None, a.outcome if a.outcome != ABORTED else RETRYABLE, retry))
                    continue
                seconds = round(a.seconds * NS)
                run: tuple[int, str, int | None]
                if a.outcome == ABORTED:
                    # Stopped live before it ended (a timeout, a cancellation): it
                    # runs until the replay stops it too, and ends as lost if not.
                    run = (max(seconds, timeout) + _ABORT_MARGIN_NS, RETRYABLE, None)
                else:
                    run = (seconds, a.outcome, retry)
                runs.append(run)
                per_attempt = samples.setdefault(t.spec.kind, [])
                while len(per_attempt) < n:
                    per_attempt.append([])
                per_attempt[n - 1].append(run)
            self.runs.append(tuple(runs))
        self.samples = samples
        # Run time for an attempt the trace does not time: the policy file's
        # figure for the kind, the trace's, the kind's median, the task's hint, the pool's default.
        self.fixed: dict[str, int] = {}
        for kind in {t.spec.kind for t in tasks}:
            if kind in kind_durations:
                self.fixed[kind] = round(kind_durations[kind] * NS)
            elif kind in trace.kind_durations:
                self.fixed[kind] = round(trace.kind_durations[kind] * NS)
            elif kind in samples:
                self.fixed[kind] = int(statistics.median_low(r[0] for rows in samples[kind] for r in rows))
        self.hints = [t.spec.duration_hint_ns for t in tasks]
        self.pool_default = [pool_defaults.get(t.spec.pool or default_pool, NS) for t in tasks]

    def _fallback(self, index: int) -> int:
        self.fallbacks += 1
        fixed = self.fixed.get(self.kinds[index])
        if fixed is not None:
            return fixed
        hint = self.hints[index]
        return hint if hint is not None else self.pool_default[index]

    def _sample(self, index: int, attempt: int) -> tuple[int, str, int | None] | None:
        per_attempt = self.samples.get(self.kinds[index])
        if not per_attempt:
            return None
        rows = per_attempt[min(attempt, len(per_attempt)) - 1] or per_attempt[0]
        return rows[int(self.rng.random() * len(rows))]

    def run(self, index: int, attempt: int) -> tuple[int, str, int | None]:
        if self.mode == "trace":
            runs = self.runs[index]
            if runs is not None:
                # Past the recorded attempts, the last one repeats.
                run = runs[attempt - 1] if attempt <= len(runs) else runs[-1]
                if run[0] is None:
                    return (self._fallback(index), run[1], run[2])
                return run   # type: ignore[return-value]
        sampled = self._sample(index, attempt)
        if sampled is not None:
            return sampled
        return (self._fallback(index), SUCCESS, None)


def _groups(trace: Trace) -> list[tuple[int, int, int]]:
    """Submissions as (time, first index, count): a batch is one submission."""
    out: list[tuple[int, int, int]] = []
    tasks = trace.tasks
    t0 = trace.t0_ns
    i, n = 0, len(tasks)
    while i < n:
        task = tasks[i]
        j = i + 1
        if task.batch is not None:
            while j < n and tasks[j].batch == task.batch:
                j += 1
        out.append((t0 + task.at_ns, i, j - i))
        i = j
    return out


def replay(trace: Trace, variant: Variant, *, durations: str | None = None, seed: int | None = None,
           kind_durations: Mapping[str, float] | None = None, samples: int = 240,
           max_steps: int | None = None) -> ReplayResult:
    """Replay ``trace`` with ``variant``'s policy. ``durations`` ("trace" or
    "sampled") and ``seed`` default to the variant's; ``kind_durations``
    (seconds per kind) time attempts the trace does not; ``samples`` is how
    many points of the pools' capacity, busy and pending to keep (0: none)."""
    mode = variant.durations if durations is None else durations
    if mode not in DURATION_MODES:
        raise PolicyError(f"durations must be one of {', '.join(DURATION_MODES)}, got {mode!r}")
    seed = variant.seed if seed is None else seed
    started = time.perf_counter()
    config, pools, resources = variant.build()
    config.seed = seed
    t0 = trace.t0_ns
    core = Core(config, pools, resources, now=t0)
    default_pool = core.default_pool.name
    model = _Model(trace, mode, seed, kind_durations or {}, {p.name: p.default_duration_ns for p in pools},
                   default_pool)
    tasks = trace.tasks
    n = len(tasks)
    specs: list[TaskSpec] = [t.spec for t in tasks]
    # Dependencies on ids name trace tasks: they get the replay's ids.
    by_trace_id = {t.id: i for i, t in enumerate(tasks)} if any(
        isinstance(ref, int) for t in tasks for ref, _ in t.spec.edges) else None
    first_start = [-1] * n
    end = [-1] * n
    status: list[str | None] = [None] * n
    attempts = [0] * n
    replay_id = [0] * n
    index_of: dict[int, int] = {}
    groups = _groups(trace)
    cancels = sorted((t0 + t.cancel_ns, i) for i, t in enumerate(tasks) if t.cancel_ns is not None)
    span = max(trace.span_ns, 1)
    step = max(span // samples, NS // 10) if samples else 0
    next_sample = t0 if samples else _BIG
    sampled: list[tuple[int, dict[str, tuple[int, int, int, int]]]] = []
    limit = max_steps if max_steps is not None else 50 * n + 1_000_000

    actions = core.actions
    popleft = actions.popleft
    heap: list[tuple[int, int, int]] = []
    running: dict[int, tuple[int, str, int | None]] = {}
    push, pop = heapq.heappush, heapq.heappop
    run_of = model.run
    DISPATCH, EVENT, ABORT = act.DISPATCH, act.EVENT, act.ABORT
    terminal = TERMINAL
    waiting: dict[Any, deque[int]] = {}   # (pool, class) -> submissions waiting for room
    seq = 0
    now = t0

    def submit(g: int, at: int) -> str | None:
        """Admit submission ``g``: None, or "wait" when it must wait for room."""
        _, first, count = groups[g]
        chosen = specs[first:first + count]
        if by_trace_id is not None:
            chosen = [_with_replay_ids(s, by_trace_id, replay_id) for s in chosen]
        try:
            if count == 1:
                results = [core.submit(at, chosen[0])]
            else:
                results = core.submit_batch(at, chosen)
        except QueueFull as exc:
            index = exc.index or 0
            if core.overflow_policy(chosen[index].pool) == "wait" and not exc.never:
                return "wait"
            for k in range(first, first + count):
                status[k] = REFUSED
                end[k] = at
            return None
        except AdmissionError:
            for k in range(first, first + count):
                status[k] = REFUSED
                end[k] = at
            return None
        for k, (task_id, duplicate) in zip(range(first, first + count), results):
            if duplicate:
                status[k] = DUPLICATE
                end[k] = at
            else:
                index_of[task_id] = k
                replay_id[k] = task_id
        return None

    def admit_waiting(at: int) -> None:
        for line in list(waiting):
            queue = waiting[line]
            while queue:
                if submit(queue[0], at) == "wait":
                    break
                queue.popleft()
            if not queue:
                del waiting[line]

    g, n_groups = 0, len(groups)
    c, n_cancels = 0, len(cancels)
    timer_heap = core.timer_heap
    steps = 0
    while True:
        steps += 1
        if steps > limit:
            raise ReplayError(f"the replay of variant {variant.name!r} did not settle within {limit} steps")
        t_arrive = groups[g][0] if g < n_groups else _BIG
        t_done = heap[0][0] if heap else _BIG
        t_timer = _BIG
        if timer_heap:
            wake = core.next_wakeup()
            if wake is not None:
                t_timer = wake
        t_cancel = cancels[c][0] if c < n_cancels else _BIG
        t = min(t_done, t_timer, t_arrive, t_cancel)
        if t == _BIG:
            break
        if next_sample < t:
            snap = core.snapshot(next_sample)
            sampled.append((next_sample, {p.name: (p.capacity, p.desired, p.busy, p.pending) for p in snap.pools}))
            now = next_sample
            next_sample += step
        elif t_done == t:
            lease = pop(heap)[2]
            run = running.pop(lease, None)
            if run is None:
                continue   # aborted: it reports nothing
            now = t
            core.complete(t, lease, run[1], None, None, run[2])
        elif t_timer == t:
            now = t
            core.advance(t)
        elif t_cancel == t:
            now = t
            index = cancels[c][1]
            c += 1
            if replay_id[index]:
                try:
                    core.cancel(t, replay_id[index])
                except UnknownTask:
                    pass   # ended and forgotten
        else:
            now = t
            if submit(g, t) == "wait":
                spec = specs[groups[g][1]]
                waiting.setdefault((spec.pool, spec.priority), deque()).append(g)
            g += 1
        while actions:
            raw = popleft()
            kind = raw[0]
            if kind == DISPATCH:
                index = raw[1].payload
                attempt = raw[3]
                if attempt == 1:
                    first_start[index] = now
                attempts[index] = attempt
                run = run_of(index, attempt)
                seq += 1
                push(heap, (now + run[0], seq, raw[2]))
                running[raw[2]] = (index, run[1], run[2])
            elif kind == EVENT:
                if raw[4] in terminal:
                    index = index_of[raw[1]]
                    status[index] = raw[4]
                    end[index] = raw[6]
            elif kind == ABORT:
                running.pop(raw[1], None)
        if waiting:
            admit_waiting(now)
            while actions:   # what the admissions queued (rare: a full queue under "wait")
                raw = popleft()
                if raw[0] == DISPATCH:
                    index = raw[1].payload
                    if raw[3] == 1:
                        first_start[index] = now
                    attempts[index] = raw[3]
                    run = run_of(index, raw[3])
                    seq += 1
                    push(heap, (now + run[0], seq, raw[2]))
                    running[raw[2]] = (index, run[1], run[2])
                elif raw[0] == EVENT and raw[4] in terminal:
                    index = index_of[raw[1]]
                    status[index] = raw[4]
                    end[index] = raw[6]
                elif raw[0] == ABORT:
                    running.pop(raw[1], None)
    snap = core.snapshot(now)
    return ReplayResult(variant, mode, seed, first_start, end, status, attempts, snap.pools, snap.totals,
                        now, sampled, model.fallbacks, time.perf_counter() - started)


def _with_replay_ids(spec: TaskSpec, by_trace_id: dict[Any, int], replay_id: list[int]) -> TaskSpec:
    """``spec`` with its dependencies on trace ids turned to the replay's ids
    (a dependency on a task not in the trace, or not admitted, is dropped)."""
    if not any(isinstance(ref, int) for ref, _ in spec.edges):
        return spec
    edges = []
    for ref, on in spec.edges:
        if isinstance(ref, int):
            index = by_trace_id.get(ref)
            if index is None or not replay_id[index]:
                continue
            ref = replay_id[index]
        edges.append((ref, on))
    copy = TaskSpec.__new__(TaskSpec)
    copy.__dict__.update(spec.__dict__)
    copy.edges = tuple(edges)
    return copy
