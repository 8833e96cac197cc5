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
from .trace import ABORTED, Trace, TracedAttempt

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
    start_delay: float = 0.0       # seconds from each dispatch to its attempt's start


class _Model:
    """Run time and outcome of each attempt a replay dispatches."""

    def __init__(self, trace: Trace, mode: str, seed: int, kind_durations: Mapping[str, float],
                 pool_defaults: Mapping[str, int], default_pool: str) -> None:
        self.mode = mode
        self.trace = trace
        self.rng = random.Random(f"cronoq.whatif/{seed}")
        self.fallbacks = 0
        self.attempts = [t.attempts for t in trace.tasks]
        self.kind_durations = kind_durations
        self.pool_defaults = pool_defaults
        self.default_pool = default_pool
        self._samples: dict[str, list[list[tuple[int, str, int | None]]]] | None = None
        self._fixed: dict[str, int | None] = {}

    @staticmethod
    def _of(a: TracedAttempt, timeout: int | None) -> tuple[int | None, str, int | None]:
        retry = None if a.retry_after is None else round(a.retry_after * NS)
        if a.outcome == ABORTED:
            if a.seconds is None:
                return (None, RETRYABLE, None)
            # Stopped live before it ended (a timeout, a cancellation): it runs
            # until the replay stops it too, and ends as lost if nothing does.
            return (max(round(a.seconds * NS), timeout or 0) + _ABORT_MARGIN_NS, RETRYABLE, None)
        return (None if a.seconds is None else round(a.seconds * NS), a.outcome, retry)

    @property
    def samples(self) -> dict[str, list[list[tuple[int, str, int | None]]]]:
        """The timed attempts of each kind, by attempt number (made when first needed)."""
        if self._samples is None:
            samples: dict[str, list[list[tuple[int, str, int | None]]]] = {}
            for t in self.trace.tasks:
                if not t.attempts:
                    continue
                per_attempt = samples.setdefault(t.spec.kind, [])
                for n, a in enumerate(t.attempts, 1):
                    run = self._of(a, t.spec.timeout_ns)
                    if run[0] is None:
                        continue
                    while len(per_attempt) < n:
                        per_attempt.append([])
                    per_attempt[n - 1].append(run)   # type: ignore[arg-type]
            self._samples = {kind: rows for kind, rows in samples.items() if any(rows)}
        return self._samples

    def _fallback(self, index: int, counted: bool = False) -> int:
        """Run time for an attempt the trace does not time: the policy file's
        figure for the kind, the trace's, the kind's median, the task's hint,
        the pool's default."""
        if not counted:
            self.fallbacks += 1
        spec = self.trace.tasks[index].spec
        kind = spec.kind
        if kind not in self._fixed:
            fixed: int | None = None
            if kind in self.kind_durations:
                fixed = round(self.kind_durations[kind] * NS)
            elif kind in self.trace.kind_durations:
                fixed = round(self.trace.kind_durations[kind] * NS)
            elif kind in self.samples:
                fixed = int(statistics.median_low(r[0] for rows in self.samples[kind] for r in rows))
            self._fixed[kind] = fixed
        fixed = self._fixed[kind]
        if fixed is not None:
            return fixed
        if spec.duration_hint_ns is not None:
            return spec.duration_hint_ns
        return self.pool_defaults.get(spec.pool or self.default_pool, NS)

    def _sample(self, index: int, attempt: int) -> tuple[int, str, int | None] | None:
        per_attempt = self.samples.get(self.trace.tasks[index].spec.kind)
        if not per_attempt:
            return None
        rows = per_attempt[min(attempt, len(per_attempt)) - 1] or [r for rows in per_attempt for r in rows]
        return rows[int(self.rng.random() * len(rows))]

    def run(self, index: int, attempt: int) -> tuple[int, str, int | None]:
        if self.mode == "trace":
            recorded = self.attempts[index]
            if recorded:
                # Past the recorded attempts, the last one repeats.
                a = recorded[attempt - 1] if attempt <= len(recorded) else recorded[-1]
                if a.seconds is not None and a.outcome != ABORTED:
                    return (round(a.seconds * NS), a.outcome,
                            None if a.retry_after is None else round(a.retry_after * NS))
                run = self._of(a, self.trace.tasks[index].spec.timeout_ns)
                if run[0] is None:
                    return (self._fallback(index), run[1], run[2])
                return run   # type: ignore[return-value]
            self.fallbacks += 1   # never ran live: like the kind's recorded runs
        sampled = self._sample(index, attempt)
        if sampled is not None:
            return sampled
        if self.mode != "trace":
            self.fallbacks += 1
        return (self._fallback(index, counted=True), SUCCESS, None)


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
           start_delay: float | None = None, max_steps: int | None = None) -> ReplayResult:
    """Replay ``trace`` with ``variant``'s policy. ``durations`` ("trace" or
    "sampled") and ``seed`` default to the variant's; ``kind_durations``
    (seconds per kind) time attempts the trace does not; ``samples`` is how
    many points of the pools' capacity, busy and pending to keep (0: none);
    ``start_delay`` (seconds, default the variant's) passes between each
    dispatch and the start of its attempt, holding the slot (what a durable
    store's commit and the event loop add to a live run)."""
    mode = variant.durations if durations is None else durations
    if mode not in DURATION_MODES:
        raise PolicyError(f"durations must be one of {', '.join(DURATION_MODES)}, got {mode!r}")
    seed = variant.seed if seed is None else seed
    start_delay = variant.start_delay if start_delay is None else start_delay
    if isinstance(start_delay, bool) or not isinstance(start_delay, (int, float)) or not 0 <= start_delay < 3600:
        raise PolicyError(f"start_delay must be a number of seconds in [0, 3600), got {start_delay!r}")
    started = time.perf_counter()
    config, pools, resources = variant.build()
    config.seed = seed
    t0 = trace.t0_ns
    core = Core(config, pools, resources, now=t0)
    model = _Model(trace, mode, seed, kind_durations or {}, {p.name: p.default_duration_ns for p in pools},
                   core.default_pool.name)
    tasks = trace.tasks
    n = len(tasks)
    specs: list[TaskSpec] = [t.spec for t in tasks]
    # Dependencies on ids name trace tasks: they get the replay's ids.
    by_trace_id = {t.id: i for i, t in enumerate(tasks)} if any(
        isinstance(ref, int) for t in tasks if t.spec.edges for ref, _ in t.spec.edges) else None
    first_start = [-1] * n
    end = [-1] * n
    status: list[str | None] = [None] * n
    attempts = [0] * n
    replay_id = [0] * n
    index_of: dict[int, int] = {}
    groups = _groups(trace)
    group_at = [at for at, _, _ in groups]
    cancels = sorted((t0 + t.cancel_ns, i) for i, t in enumerate(tasks) if t.cancel_ns is not None)
    span = max(trace.span_ns, 1)
    step = max(span // samples, NS // 10) if samples else 0
    next_sample = t0 if samples else _BIG
    sampled: list[tuple[int, dict[str, tuple[int, int, int, int]]]] = []
    limit = max_steps if max_steps is not None else 50 * n + 1_000_000
    delay = round(start_delay * NS)

    actions = core.actions
    popleft = actions.popleft
    heap: list[tuple[int, int, int]] = []
    running: dict[int, tuple[str, int | None]] = {}   # lease -> (outcome, retry_after)
    push, pop = heapq.heappush, heapq.heappop
    run_of = model.run
    core_submit, core_complete, next_wakeup = core.submit, core.complete, core.next_wakeup
    DISPATCH, EVENT, ABORT = act.DISPATCH, act.EVENT, act.ABORT
    terminal = TERMINAL
    waiting: dict[Any, deque[int]] = {}   # (pool, class) -> submissions waiting for room
    seq = 0
    now = t0

    def refuse(first: int, count: int, at: int, state: str) -> None:
        for k in range(first, first + count):
            status[k] = state
            end[k] = at

    def submit(g: int, at: int) -> bool:
        """Admit submission ``g``; False when it must wait for room."""
        _, first, count = groups[g]
        chosen = specs[first:first + count]
        if by_trace_id is not None:
            chosen = [_with_replay_ids(s, by_trace_id, replay_id) for s in chosen]
        try:
            results = [core_submit(at, chosen[0])] if count == 1 else core.submit_batch(at, chosen)
        except QueueFull as exc:
            if core.overflow_policy(chosen[exc.index or 0].pool) == "wait" and not exc.never:
                return False
            refuse(first, count, at, REFUSED)
            return True
        except AdmissionError:
            refuse(first, count, at, REFUSED)
            return True
        k = first
        for task_id, duplicate in results:
            if duplicate:
                refuse(k, 1, at, DUPLICATE)
            else:
                index_of[task_id] = k
                replay_id[k] = task_id
            k += 1
        return True

    def admit_waiting(at: int) -> None:
        for line in list(waiting):
            queue = waiting[line]
            while queue and submit(queue[0], at):
                queue.popleft()
            if not queue:
                del waiting[line]

    g, n_groups = 0, len(groups)
    c, n_cancels = 0, len(cancels)
    timer_heap = core.timer_heap
    simple = by_trace_id is None
    steps = 0
    while True:
        steps += 1
        if steps > limit:
            raise ReplayError(f"the replay of variant {variant.name!r} did not settle within {limit} steps")
        t_arrive = group_at[g] if g < n_groups else _BIG
        t_done = heap[0][0] if heap else _BIG
        t_cancel = cancels[c][0] if c < n_cancels else _BIG
        t = t_done if t_done < t_arrive else t_arrive
        if t_cancel < t:
            t = t_cancel
        t_timer = _BIG
        if timer_heap and timer_heap[0][0] <= t:
            wake = next_wakeup()   # (skips timers that no longer matter)
            if wake is not None:
                t_timer = wake
                if wake < t:
                    t = wake
        if t == _BIG or (t == t_timer and not heap and g == n_groups and c == n_cancels and not waiting
                         and not core.tasks):
            break   # every task ended: what is left is the autoscaler winding down
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
            core_complete(t, lease, run[0], None, None, run[1])
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
            first = groups[g][1]
            if simple and groups[g][2] == 1:
                try:
                    task_id, duplicate = core_submit(t, specs[first])
                except AdmissionError:
                    if not submit(g, t):   # (the general path says what to do)
                        spec = specs[first]
                        waiting.setdefault((spec.pool, spec.priority), deque()).append(g)
                else:
                    if duplicate:
                        refuse(first, 1, t, DUPLICATE)
                    else:
                        index_of[task_id] = first
                        replay_id[first] = task_id
            elif not submit(g, t):
                spec = specs[first]
                waiting.setdefault((spec.pool, spec.priority), deque()).append(g)
            g += 1
        while True:
            while actions:
                raw = popleft()
                kind = raw[0]
                if kind == DISPATCH:
                    index = raw[1].payload
                    attempt = raw[3]
                    if attempt == 1:
                        first_start[index] = now + delay
                    attempts[index] = attempt
                    seconds, outcome, retry = run_of(index, attempt)
                    seq += 1
                    push(heap, (now + delay + seconds, seq, raw[2]))
                    running[raw[2]] = (outcome, retry)
                elif kind == EVENT:
                    if raw[4] in terminal:
                        index = index_of[raw[1]]
                        status[index] = raw[4]
                        end[index] = raw[6]
                elif kind == ABORT:
                    running.pop(raw[1], None)
            if not waiting:
                break
            admit_waiting(now)   # (rare: a full queue under "wait"; room may have come)
            if not actions:
                break
    snap = core.snapshot(now)
    return ReplayResult(variant, mode, seed, first_start, end, status, attempts, snap.pools, snap.totals,
                        now, sampled, model.fallbacks, time.perf_counter() - started, float(start_delay))


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
