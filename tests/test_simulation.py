"""Seeded randomized simulation of the engine under virtual time.

Every seed builds a ``Core`` with one to three randomly configured pools and a
few resources, then drives it through a random workload: microtasks and
heavy-tailed jobs of all four classes, deadlines, fixed starts, DAG batches
with keys and every edge condition, awaited keys, retryable and permanent
failures with ``retry_after``, timeouts, leases without heartbeats,
cancellations, capacity and worker-group changes, bounded queues with every
overflow policy, and invalid submissions. ``check_invariants()`` runs after
every engine call. At the end everything is drained and end-to-end
properties are checked: every task ended exactly once, parents ended before
their children started (successfully for on-success edges), skips propagate,
plain tasks of one class start in submission order, attempts count up from
one, leases are dispatched, aborted and completed at most once, fixed starts
respect their start and miss policy, and the same seed gives the same run.

The driver is a small loop of its own (rather than ``cronoq.simulation``) so
that it can also send stale completions and heartbeats and check the answers.
"""

from __future__ import annotations

import heapq
import random

import pytest

from cronoq.core import (
    CANCELLED_OUTCOME, NS, PERMANENT, RETRYABLE, SUCCESS, TERMINAL, AdmissionError, AutoscaleConfig,
    Core, CoreConfig, Dep, PoolConfig, ResourceConfig, RetryPolicy, TaskSpec, UnknownTask,
)
from cronoq.core import actions as act
from cronoq.core.engine import W_DUE, W_LABEL

CI_SEEDS = 1000
SLOW_SEEDS = 10_000

LABEL_SETS = ({"gpu": "x"}, {"zone": "a"}, {"gpu": "x", "zone": "a"})
FULL_LABELS = {"gpu": "x", "zone": "a"}
TENANTS = ("t0", "t1", "t2")
SATISFIES = {"success": {"succeeded"}, "failure": {"failed", "dead_lettered"}, "complete": set(TERMINAL)}
MAX_STEPS = 200_000
LONG_RETENTION = 1e8       # seconds: longer than any run, drain included


class Behaviour:
    """How the attempts of one task behave (drawn at dispatch, in order)."""

    __slots__ = ("shape", "scale", "p_retry", "p_perm", "p_cancel", "p_after")

    def __init__(self, rng: random.Random, plain: bool) -> None:
        self.shape = rng.choice(("micro", "micro", "exp", "pareto", "lognormal"))
        self.scale = rng.choice((0.05, 0.3, 1.0))
        if plain and rng.random() < 0.7:
            self.p_retry = self.p_perm = self.p_cancel = 0.0
        else:
            self.p_retry = rng.choice((0.0, 0.1, 0.4))
            self.p_perm = rng.choice((0.0, 0.0, 0.1))
            self.p_cancel = rng.choice((0.0, 0.0, 0.0, 0.05))
        self.p_after = rng.choice((0.0, 0.5))

    def draw(self, rng: random.Random) -> tuple[int, str, int | None]:
        shape = self.shape
        if shape == "micro":
            seconds = rng.uniform(0.000001, 0.001)
        elif shape == "exp":
            seconds = rng.expovariate(1 / self.scale)
        elif shape == "pareto":
            seconds = min(self.scale * 0.2 * rng.paretovariate(1.3), 120.0)
        else:
            seconds = min(rng.lognormvariate(-2.0, 1.5) * self.scale, 120.0)
        u = rng.random()
        retry_after = None
        if u < self.p_retry:
            outcome = RETRYABLE
            if rng.random() < self.p_after:
                retry_after = int(rng.choice((0.5, 2.0, 5.0)) * NS)
        elif u < self.p_retry + self.p_perm:
            outcome = PERMANENT
        elif u < self.p_retry + self.p_perm + self.p_cancel:
            outcome = CANCELLED_OUTCOME
        else:
            outcome = SUCCESS
        return max(0, int(seconds * NS)), outcome, retry_after


class World:
    """One seeded simulation: configuration, workload, driver and checks."""

    def __init__(self, seed: int, core_class: type[Core] = Core) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.t0 = rng.choice((0, 1_767_225_600 * NS))
        self.now = self.t0
        # ------------------------------------------------------------ configuration
        pools = []
        for i in range(rng.randint(1, 3)):
            hi = rng.randint(1, 6)
            lo = rng.randint(0, hi)
            autoscale = False
            if rng.random() < 0.3:
                autoscale = AutoscaleConfig(
                    interval=rng.choice((0.5, 1.0, 2.0)), cooldown=rng.choice((0.0, 5.0, 30.0)),
                    stabilization_window=rng.choice((0.0, 10.0, 60.0)),
                    slo=rng.choice((None, {"high": 2.0}, {"critical": 0.5, "low": 60.0})),
                    reservation_horizon=rng.choice((0.0, 60.0)))
            max_pending = None
            if rng.random() < 0.3:
                max_pending = rng.choice((rng.randint(2, 25), {"low": rng.randint(1, 5), "normal": 8},
                                          {"critical": 3}))
            fairness = {}
            roll = rng.random()
            if roll < 0.15:
                fairness = {"fair_share": True}
            elif roll < 0.3:
                fairness = {"tenant_weights": {"t0": 3.0, "t1": 1.0, "t2": 0.5}}
            await_ = rng.random() < 0.3
            pools.append(PoolConfig(
                f"p{i}", min=lo, max=hi, initial=rng.randint(0, hi), autoscale=autoscale,
                lease_ttl=rng.choice((None, None, None, 0.5, 3.0)),
                max_pending=max_pending,
                overflow=rng.choice(("wait", "reject", "shed_lowest", "shed_oldest")),
                retry=RetryPolicy(max_attempts=rng.randint(1, 4), initial_backoff=rng.choice((0.0, 0.1, 1.0)),
                                  multiplier=rng.choice((1.0, 2.0)), max_backoff=rng.choice((0.5, 10.0)),
                                  jitter=rng.random() < 0.5),
                unknown_dependency="await" if await_ else "reject",
                await_timeout=rng.choice((None, 5.0, 30.0)) if await_ else None,
                default_duration=rng.choice((0.1, 1.0)),
                reservable_fraction=rng.choice((0.0, 0.5, 1.0)),
                **fairness))
        self.pool_configs = {p.name: p for p in pools}
        resources = [ResourceConfig.semaphore("s0", rng.randint(1, 3))]
        if rng.random() < 0.5:
            resources.append(ResourceConfig.semaphore("s1", rng.randint(1, 2)))
        resources.append(ResourceConfig.token_bucket("b0", rate=rng.choice((0.5, 2.0, 20.0)),
                                                     burst=rng.randint(1, 4)))
        self.resource_configs = {r.name: r for r in resources}
        short_retention = rng.random() < 0.2
        self.config = CoreConfig(
            seed=seed, emit_transitions=rng.random() < 0.5,
            retention=5.0 if short_retention else LONG_RETENTION,
            retention_max=rng.choice((10, 1000)) if short_retention else 1_000_000,
            metrics_window=rng.choice((1.0, 60.0)), metrics_buckets=rng.choice((1, 12)),
            max_hold=rng.choice((300.0, 2.0)),
            max_pending_total=rng.choice((None, None, None, None, rng.randint(10, 40))))
        self.core = core_class(self.config, pools, resources, now=self.t0)

        # ------------------------------------------------------------ driver state
        self.running: list[tuple] = []          # heap (end, seq, lease)
        self.plans: dict[int, tuple] = {}       # lease -> (outcome, retry_after)
        self.seq = 0
        self.steps = 0
        self.trace: list[tuple] = []
        self.lease_state: dict[int, str] = {}   # lease -> live / aborted / completed
        self.lease_task: dict[int, int] = {}
        self.live_leases: dict[int, int] = {}   # task id -> its live lease
        self.stale_sent = 0
        # ------------------------------------------------------------ model of the tasks
        self.admitted: dict[int, dict] = {}     # id -> facts at admission
        self.behaviour: dict[int, Behaviour] = {}
        self.dispatches: dict[int, list] = {}   # id -> [(seq, attempt, lease, now)]
        self.terminal: dict[int, tuple] = {}    # id -> (seq, status, now)
        self.edges: list[list] = []             # [child id, parent id or None, cond, awaited key]
        self.awaiting: dict[str, list] = {}     # key -> [edge]
        self.plain_starts: dict[tuple, list] = {}
        self.known_keys: list[str] = []
        self.key_counter = 0
        self.cancelled_by_call: set[int] = set()
        self.given_back: set[int] = set()       # tasks with a dispatch the driver gave back

    # ================================================================ driver

    def check(self) -> None:
        core = self.core
        core.check_invariants()
        for r in core.resources.values():
            if not r.semaphore:
                assert r.tokens >= -1e-6, f"bucket {r.name} below zero: {r.tokens}"
        # Beyond check_invariants: a ready task is found where it says it waits.
        for p in core.pools.values():
            if p.due_n != [0, 0, 0, 0]:
                due = {item[2].id for item in p.due}
                for e in core.tasks.values():
                    if e.pool is p and e.status == "ready" and e.where == W_DUE:
                        assert e.id in due, f"{e} is due but missing from its pool's due queue"
            if p.label_waiting:
                waiting = {e.id for q in p.label_waiters.values() for e in q}
                for e in core.tasks.values():
                    if e.pool is p and e.status == "ready" and e.where == W_LABEL:
                        assert e.id in waiting, f"{e} waits for labels but is in no label queue"

    def pump(self) -> None:
        core = self.core
        actions = core.actions
        now = self.now
        self.lane_starts = []
        while actions:
            raw = actions.popleft()
            self.seq += 1
            kind = raw[0]
            if kind == act.DISPATCH:
                e, lease, attempt = raw[1], raw[2], raw[3]
                self.on_dispatch(e, lease, attempt, now)
            elif kind == act.ABORT:
                lease, task_id = raw[1], raw[2]
                assert self.lease_state.get(lease) == "live", f"abort of lease {lease} that is not live"
                assert self.lease_task[lease] == task_id
                self.lease_state[lease] = "aborted"
                del self.live_leases[task_id]
                self.plans.pop(lease, None)
                self.trace.append(("abort", lease, task_id, raw[3], now))
            elif kind == act.EVENT:
                task_id, status, attempt, at = raw[1], raw[4], raw[5], raw[6]
                assert at == now, (at, now)
                assert task_id in self.admitted, f"event for unknown task {task_id}"
                assert task_id not in self.terminal, f"task {task_id} has an event after it ended: {status}"
                self.trace.append(("event", task_id, status, attempt, now))
                if status in TERMINAL:
                    assert task_id not in self.live_leases, f"task {task_id} ended {status} with a live lease"
                    self.terminal[task_id] = (self.seq, status, now)
                    assert attempt == len(self.dispatches.get(task_id, ())), (task_id, attempt)
            elif kind == act.SCALE:
                self.trace.append(("scale", raw[1], raw[2], now))
            else:
                raise AssertionError(f"unexpected action {raw!r}")
        if self.lane_starts:
            self.check_lane_order()

    def check_lane_order(self) -> None:
        """FIFO within a class: a lane task that started left no older task
        of its pool and class waiting in the lane (retried and woken tasks
        return to their place by submission order)."""
        oldest: dict[tuple, int] = {}
        admitted = self.admitted
        for task_id, e in self.core.tasks.items():
            if e.status == "ready" and admitted[task_id]["lane"]:
                k = (e.pool.name, e.cls)
                if task_id < oldest.get(k, task_id + 1):
                    oldest[k] = task_id
        for pool, cls, task_id in self.lane_starts:
            waiting = oldest.get((pool, cls))
            assert waiting is None or waiting > task_id, \
                f"pool {pool} class {cls}: task {task_id} started while the older {waiting} waited"

    def on_dispatch(self, e, lease: int, attempt: int, now: int) -> None:
        task_id = e.id
        assert task_id in self.admitted and task_id not in self.terminal, task_id
        assert lease not in self.lease_state, f"lease {lease} dispatched twice"
        assert task_id not in self.live_leases, f"task {task_id} dispatched while running"
        history = self.dispatches.setdefault(task_id, [])
        assert attempt == len(history) + 1, f"task {task_id}: attempt {attempt} after {len(history)}"
        facts = self.admitted[task_id]
        assert attempt <= facts["max_attempts"], (task_id, attempt)
        if facts["labels"]:
            assert facts["labels"] <= e.group.labels, f"task {task_id} ran on a group without its labels"
        start = facts["start"]
        if start is not None and attempt == 1:
            assert now >= start, f"fixed start {task_id} ran {start - now} ns early"
            if facts["on_miss"] != "run_late" and facts["at"] <= start + facts["tolerance"]:
                # (Admitted already past its tolerance, a task may still start at
                # admission: the miss applies from the next step. Not checked.)
                assert now <= start + facts["tolerance"], f"fixed start {task_id} ran after its miss"
        history.append((self.seq, attempt, lease, now))
        if facts["lane"]:
            self.lane_starts.append((facts["pool"], facts["cls"], task_id))
        if attempt == 1 and facts["plain"]:
            self.plain_starts.setdefault((facts["pool"], facts["cls"]), []).append(task_id)
        self.lease_state[lease] = "live"
        self.lease_task[lease] = task_id
        self.live_leases[task_id] = lease
        duration, outcome, retry_after = self.behaviour[task_id].draw(self.rng)
        self.plans[lease] = (outcome, retry_after)
        heapq.heappush(self.running, (now + duration, self.seq, lease))
        self.trace.append(("dispatch", task_id, lease, attempt, now))

    def call(self, fn, *args, pump: bool = True):
        """One engine call at the current time, then its actions and the checks."""
        try:
            return fn(self.now, *args)
        finally:
            self.steps += 1
            assert self.steps < MAX_STEPS, "the simulation does not settle"
            if pump:
                self.pump()
                self.check()

    def run_until(self, limit: int) -> None:
        """Complete attempts and fire timers in time order up to ``limit``
        (timers first at equal times, as the engine fires them on entry)."""
        while True:
            wake = self.core.next_wakeup()
            end = self.running[0][0] if self.running else None
            t = end if wake is None else wake if end is None else min(wake, end)
            if t is None or t > limit:
                break
            self.now = max(self.now, t)
            if wake is not None and wake <= self.now:
                self.call(self.core.advance)
            else:
                _, _, lease = heapq.heappop(self.running)
                self.finish_attempt(lease)
        if limit > self.now:
            self.now = limit
            self.call(self.core.advance)

    def finish_attempt(self, lease: int) -> None:
        state = self.lease_state[lease]
        rng = self.rng
        if state != "live":
            # The engine gave this attempt up: a late report must be refused.
            if rng.random() < 0.5:
                self.stale_sent += 1
                assert self.call(self.core.complete, lease, SUCCESS) is False
                self.trace.append(("stale", lease, self.now))
            return
        outcome, retry_after = self.plans.pop(lease)
        task_id = self.lease_task[lease]
        if rng.random() < 0.02 and self.admitted[task_id]["start"] is None:
            self.give_back(lease, task_id)
            return
        # Mark first: the events of this very call must see the lease closed.
        self.lease_state[lease] = "completed"
        del self.live_leases[task_id]
        message = None if outcome == SUCCESS else f"{outcome} in attempt {self.dispatches[task_id][-1][1]}"
        accepted = self.call(self.core.complete, lease, outcome, None, message, retry_after)
        assert accepted is True, f"live lease {lease} refused"
        self.trace.append(("complete", lease, outcome, self.now))
        if rng.random() < 0.05:
            self.stale_sent += 1
            assert self.call(self.core.complete, lease, SUCCESS) is False, "a lease completed twice"

    def give_back(self, lease: int, task_id: int) -> None:
        """The driver could not start this attempt: it never happened."""
        self.lease_state[lease] = "given_back"
        del self.live_leases[task_id]
        seq, attempt, _, _ = self.dispatches[task_id].pop()
        starts = self.plain_starts.get((self.admitted[task_id]["pool"], self.admitted[task_id]["cls"]))
        if attempt == 1 and starts is not None and task_id in starts:
            starts.remove(task_id)
        self.given_back.add(task_id)
        delay = self.rng.choice((0, 0, int(0.5 * NS)))
        assert self.call(self.core.give_back, lease, delay) is True
        self.trace.append(("give_back", lease, task_id, delay, self.now))
        assert self.call(self.core.give_back, lease) is False, "a lease given back twice"

    # ================================================================ workload

    def new_key(self) -> str:
        self.key_counter += 1
        return f"k{self.key_counter}"

    def pick_ref(self, allow_unknown: bool):
        """A dependency reference: a known key or id, sometimes an unknown one."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.5 and self.known_keys:
            return rng.choice(self.known_keys)
        if roll < 0.85 and self.admitted:
            return rng.choice(list(self.admitted)[-40:])
        if allow_unknown:
            return f"later{rng.randint(1, 6)}" if rng.random() < 0.8 else 10 ** 9 + rng.randint(0, 5)
        return None

    def make_spec(self, *, plain_ok: bool = True, key: str | None = None,
                  edges=()) -> tuple[TaskSpec, Behaviour]:
        rng = self.rng
        pools = list(self.pool_configs)
        pool = rng.choice(pools)
        if rng.random() < 0.01:
            pool = "nope"
        priority = rng.choice(("critical", "high", "normal", "low"))
        kind = rng.choice(("a", "b", "default"))
        if plain_ok and key is None and not edges and rng.random() < 0.45:
            return TaskSpec(None, pool=pool, priority=priority, kind=kind), Behaviour(rng, True)
        options: dict = {}
        if key is None and rng.random() < 0.35:
            roll = rng.random()
            if roll < 0.25 and self.known_keys:
                key = rng.choice(self.known_keys)          # a duplicate, or a key reused after expiry
            elif roll < 0.35:
                key = f"later{rng.randint(1, 6)}"          # a key that others may be awaiting
            else:
                key = self.new_key()
        if key is not None:
            options["key"] = key
        if rng.random() < 0.3:
            if rng.random() < 0.8:
                options["deadline_in"] = rng.uniform(0.0, 60.0)
            else:
                options["deadline_at"] = self.now / NS + rng.uniform(-5.0, 60.0)   # Unix seconds
        if rng.random() < 0.2:
            options["duration_hint"] = rng.choice((0.0, 0.01, 0.5, 5.0))
        if rng.random() < 0.15:
            options["timeout"] = rng.choice((0.0005, 0.05, 0.5, 3.0))
        if rng.random() < 0.2:
            options["retry"] = rng.choice((RetryPolicy.none(),
                                           RetryPolicy(max_attempts=3, initial_backoff=0.2),
                                           RetryPolicy(max_attempts=5, initial_backoff=0.0, jitter=False)))
        if rng.random() < 0.25:
            resources = {}
            if rng.random() < 0.6:
                resources[rng.choice(list(n for n in self.resource_configs if n.startswith("s")))] = 1
            if rng.random() < 0.5:
                burst = self.resource_configs["b0"].burst
                resources["b0"] = rng.randint(1, burst + (1 if rng.random() < 0.05 else 0))
            if rng.random() < 0.02:
                resources["nope"] = 1
            if resources:
                options["resources"] = resources
        after, deps = [], []
        for ref, cond in edges:
            (after.append(ref) if cond == "success" and rng.random() < 0.5 else deps.append(Dep(ref, cond)))
        if not edges and rng.random() < 0.2:
            for _ in range(rng.randint(1, 2)):
                ref = self.pick_ref(allow_unknown=rng.random() < 0.3)
                if ref is not None:
                    deps.append(Dep(ref, rng.choice(("success", "success", "failure", "complete"))))
        if after:
            options["after"] = after
        if deps:
            options["deps"] = deps
        if rng.random() < 0.1:
            if rng.random() < 0.8:
                options["start_in"] = rng.choice((0.0, rng.uniform(0.0, 30.0)))
            else:
                options["start_at"] = self.now // NS + rng.randint(-2, 20)         # whole Unix seconds
            options["tolerance"] = rng.choice((0.0, 0.5, 1.0, 5.0))
            options["on_miss"] = rng.choice(("run_late", "skip", "fail"))
        if rng.random() < 0.3:
            options["tenant"] = rng.choice(TENANTS)
        if rng.random() < 0.1:
            options["labels"] = rng.choice(LABEL_SETS)
        if rng.random() < 0.1:
            options["tags"] = {"seed": str(self.seed)}
        return TaskSpec(None, pool=pool, priority=priority, kind=kind, **options), Behaviour(rng, False)

    @staticmethod
    def resolve(ref, known: dict, batch_keys: dict[str, int]):
        """The task a reference names at admission: (id, None) or (None, awaited
        key). ``known`` maps keys to the tasks they named just before it."""
        if isinstance(ref, int):
            return ref, None
        if known.get(ref) is not None:
            return known[ref], None
        if ref in batch_keys:
            return batch_keys[ref], None
        return None, ref

    def admit(self, specs: list[TaskSpec], behaviours: list[Behaviour], batch: bool) -> bool:
        core = self.core
        # Fire what is due first, so that an admission error must change nothing.
        self.call(core.advance)
        before = (dict(core.totals), len(core.tasks), core.pending, len(core.running))
        known = {}
        for spec in specs:
            for key in [spec.key] + [ref for ref, _ in spec.edges if isinstance(ref, str)]:
                if key is not None and key not in known:
                    try:
                        known[key] = core.info(key).id
                    except UnknownTask:
                        known[key] = None
        try:
            # The actions wait until the new tasks are registered below.
            if batch:
                results = self.call(core.submit_batch, specs, pump=False)
            else:
                results = [self.call(core.submit, specs[0], pump=False)]
        except AdmissionError as exc:
            assert (dict(core.totals), len(core.tasks), core.pending, len(core.running)) == before, \
                f"a refused admission changed the engine ({exc!r})"
            assert not core.actions, f"a refused admission queued actions ({exc!r})"
            self.check()
            if batch:
                assert 0 <= exc.index < len(specs)
            self.trace.append(("refused", type(exc).__name__, self.now))
            return False
        assert len(results) == len(specs)
        batch_keys: dict[str, int] = {}
        fresh = []
        for spec, behaviour, (task_id, duplicate) in zip(specs, behaviours, results):
            if duplicate:
                if spec.key is not None and known.get(spec.key) is not None:
                    assert task_id == known[spec.key], "a duplicate key answered with another id"
                else:
                    assert batch and batch_keys.get(spec.key) == task_id
                continue
            assert task_id not in self.admitted
            if spec.key is not None:
                assert known.get(spec.key) is None
                batch_keys[spec.key] = task_id
                if spec.key not in self.known_keys:
                    self.known_keys.append(spec.key)
            fresh.append((spec, behaviour, task_id))
        for spec, behaviour, task_id in fresh:
            pc = self.pool_configs[spec.pool]
            retry = spec.retry if spec.retry is not None else pc.retry
            start = spec.start_at_ns
            if spec.start_in_ns is not None:
                start = self.now + spec.start_in_ns
            self.admitted[task_id] = {
                "pool": spec.pool, "cls": spec.priority, "plain": spec.plain and spec.key is None,
                "max_attempts": retry.max_attempts, "labels": spec.labels or frozenset(),
                "start": start, "tolerance": spec.tolerance_ns if spec.tolerance_ns is not None else NS,
                "on_miss": spec.on_miss, "at": self.now, "key": spec.key,
                # Waits in its class's FIFO lane whenever it is ready:
                "lane": (spec.deadline_in_ns is None and spec.deadline_at_ns is None and not spec.resources
                         and spec.labels is None and start is None and not pc.fair_share),
            }
            self.behaviour[task_id] = behaviour
            for ref, cond in spec.edges:
                parent, awaited = self.resolve(ref, known, batch_keys)
                edge = [task_id, parent, cond, awaited]
                self.edges.append(edge)
                if awaited is not None:
                    self.awaiting.setdefault(awaited, []).append(edge)
        # Tasks awaiting a key that was defined now depend on its task.
        for spec, _, task_id in fresh:
            if spec.key is not None and spec.key in self.awaiting:
                for edge in self.awaiting.pop(spec.key):
                    if edge[0] != task_id and edge[0] not in self.terminal:
                        edge[1] = task_id
        self.trace.append(("admitted", tuple(r[0] for r in results), self.now))
        self.pump()
        self.check()
        return True

    def op_submit(self) -> None:
        spec, behaviour = self.make_spec()
        self.admit([spec], [behaviour], batch=False)

    def op_batch(self) -> None:
        rng = self.rng
        if rng.random() < 0.25:
            self.op_plain_batch()
            return
        n = rng.randint(2, 6)
        keys = [self.new_key() for _ in range(n)]
        if rng.random() < 0.1:
            keys[-1] = keys[0]          # an in-batch duplicate
        specs, behaviours = [], []
        for i in range(n):
            edges = []
            for j in rng.sample(range(i), min(i, rng.randint(0, 2))):
                edges.append((keys[j], rng.choice(("success", "success", "success", "failure", "complete"))))
            if i + 1 < n and rng.random() < 0.04:
                edges.append((keys[rng.randint(i + 1, n - 1)], "complete"))   # maybe a cycle
            if rng.random() < 0.15:
                ref = self.pick_ref(allow_unknown=rng.random() < 0.2)
                if ref is not None and ref != keys[i]:
                    edges.append((ref, rng.choice(("success", "complete"))))
            spec, behaviour = self.make_spec(plain_ok=False, key=keys[i], edges=edges)
            specs.append(spec)
            behaviours.append(behaviour)
        self.admit(specs, behaviours, batch=True)

    def op_plain_batch(self) -> None:
        """A batch of tasks without options (the engine admits them unplanned,
        unless a pool is bounded or unknown)."""
        rng = self.rng
        specs, behaviours = [], []
        for _ in range(rng.randint(1, 8)):
            pool = rng.choice(list(self.pool_configs)) if rng.random() < 0.98 else "nope"
            specs.append(TaskSpec(None, pool=pool, priority=rng.choice(("critical", "high", "normal", "low")),
                                  kind=rng.choice(("a", "b", "default"))))
            behaviours.append(Behaviour(rng, True))
        self.admit(specs, behaviours, batch=True)

    def op_cancel(self) -> None:
        rng = self.rng
        core = self.core
        roll = rng.random()
        if roll < 0.6 and self.admitted:
            live = [t for t in self.admitted if t not in self.terminal]
            ref = rng.choice(live) if live and rng.random() < 0.8 else rng.choice(list(self.admitted))
        elif roll < 0.9 and self.known_keys:
            ref = rng.choice(self.known_keys)
        else:
            ref = 10 ** 9 + rng.randint(0, 9)
        self.call(core.advance)     # what is due now happens first, not inside cancel
        task_id = ref
        if isinstance(ref, str):
            try:
                task_id = core.info(ref).id
            except UnknownTask:
                task_id = None
        was_live = task_id is not None and task_id in self.admitted and task_id not in self.terminal
        try:
            result = self.call(core.cancel, ref)
        except UnknownTask:
            assert not was_live, f"cancel({ref!r}) did not find a live task"
            self.trace.append(("cancel", ref, "unknown", self.now))
            return
        assert result is was_live, (ref, result, was_live)
        if result:
            assert self.terminal[task_id][1] == "cancelled"
            self.cancelled_by_call.add(task_id)
        self.trace.append(("cancel", ref, result, self.now))

    def op_capacity(self) -> None:
        rng = self.rng
        # Fire what is due first: an autoscaler evaluation at this instant would
        # change the groups between the check below and the call.
        self.call(self.core.advance)
        name = rng.choice(list(self.pool_configs))
        limit = self.pool_configs[name].max
        p = self.core.pools[name]
        if rng.random() < 0.7:
            labels, capacity = None, rng.randint(0, limit)
        else:
            labels, capacity = rng.choice(LABEL_SETS), rng.randint(0, 2)
        group = p.groups.get(frozenset(labels.items()) if labels else frozenset())
        others = p.capacity - (group.capacity if group is not None else 0)
        if others + capacity > limit:
            # The pool's max bounds all its groups together: refused, nothing changes.
            capacity = max(0, limit - others) if rng.random() < 0.8 else capacity
        call = (self.core.set_capacity, name) if labels is None else \
            (self.core.set_group_capacity, name, dict(labels))
        if others + capacity > limit:
            before = {key: g.capacity for key, g in p.groups.items()}
            with pytest.raises(ValueError, match=f"above its max of {limit}"):
                self.call(*call, capacity)
            assert {key: g.capacity for key, g in p.groups.items()} == before
            self.trace.append(("capacity refused", name, capacity, self.now))
        else:
            self.call(*call, capacity)

    def op_heartbeat(self) -> None:
        rng = self.rng
        if not self.lease_state:
            return
        self.call(self.core.advance)
        lease = rng.choice(list(self.live_leases.values())) if self.live_leases and rng.random() < 0.8 \
            else rng.choice(list(self.lease_state))
        expected = self.lease_state[lease] == "live"
        assert self.call(self.core.heartbeat, lease) is expected

    def workload(self) -> None:
        rng = self.rng
        ops = rng.randint(100, 400)
        rate = rng.choice((1.0, 5.0, 20.0))
        weights = [("submit", 50), ("batch", 12), ("cancel", 8), ("capacity", 6), ("heartbeat", 6)]
        names = [w[0] for w in weights]
        cum = [w[1] for w in weights]
        for _ in range(ops):
            if rng.random() < 0.8:
                self.run_until(self.now + int(rng.expovariate(rate) * NS))
            op = rng.choices(names, cum)[0]
            getattr(self, "op_" + op)()

    def drain(self) -> None:
        """Give every pool and label group a slot, define every awaited key,
        and run until the engine has nothing left to do."""
        core = self.core
        self.run_until(self.now + NS)
        full = frozenset(FULL_LABELS.items())
        for name, config in self.pool_configs.items():
            p = core.pools[name]
            # One slot in the group with every label serves any task; make room
            # for it under the pool's max, taking slots from the other groups.
            for labels, group in list(p.groups.items()):
                excess = p.capacity - (p.groups[full].capacity if full in p.groups else 0) + 1 - config.max
                if excess > 0 and labels != full and group.capacity:
                    self.call(core.set_group_capacity, name, dict(labels), max(0, group.capacity - excess))
            self.call(core.set_group_capacity, name, dict(FULL_LABELS), 1)
            if p.unlabeled.capacity == 0 and p.capacity < config.max:
                self.call(core.set_capacity, name, 1)
        for key in sorted(self.awaiting):
            for _ in range(100):
                if not any(edge[0] not in self.terminal for edge in self.awaiting.get(key, ())):
                    break
                spec = TaskSpec(None, key=key, pool=self.rng.choice(list(self.pool_configs)))
                if self.admit([spec], [Behaviour(self.rng, True)], batch=False):
                    break
                self.run_until(self.now + 10 * NS)   # a bounded pool is full: let it drain
        end = self.now + 10 ** 6 * NS
        self.run_until(end)
        assert self.now == end
        assert core.next_wakeup() is None, "the engine is still timed after draining"
        assert not self.running or all(self.lease_state[lease] != "live" for _, _, lease in self.running)

    # ================================================================ end-to-end checks

    def verify(self) -> None:
        core = self.core
        # Every admitted task ended, exactly once; the engine holds nothing live.
        missing = [t for t in self.admitted if t not in self.terminal]
        assert not missing, f"tasks that never ended: {missing[:10]} " \
                            f"{[core.tasks[t] for t in missing[:5] if t in core.tasks]}"
        assert not core.tasks and not core.running and core.pending == 0
        assert not self.live_leases
        totals = core.totals
        assert totals["submitted"] == len(self.admitted)
        ended = sum(totals[s] for s in TERMINAL)
        assert ended == len(self.admitted), (ended, len(self.admitted))
        given_back = sum(1 for state in self.lease_state.values() if state == "given_back")
        assert totals["dispatched"] == sum(len(v) for v in self.dispatches.values()) + given_back
        for r in core.resources.values():
            if r.semaphore:
                assert r.available == r.capacity
        for name, p in core.pools.items():
            assert p.busy == 0 and p.held == 0 and p.pending_total == 0, name
            assert len(p.calendar) == 0, f"pool {name} kept reservations"
        # The engine agrees with the events (where it still retains the task).
        short_retention = self.config.retention_ns < LONG_RETENTION * NS
        retained = 0
        for task_id, (_, status, _) in self.terminal.items():
            try:
                info = core.info(task_id)
            except UnknownTask:
                assert short_retention, f"task {task_id} forgotten"
                continue
            retained += 1
            assert info.status == status, (task_id, info.status, status)
            assert info.attempt == len(self.dispatches.get(task_id, ()))
        # Attempts: dead-lettered tasks used all of theirs; cancellations stuck.
        for task_id, (_, status, _) in self.terminal.items():
            n = len(self.dispatches.get(task_id, ()))
            if status == "dead_lettered":
                assert n == self.admitted[task_id]["max_attempts"], (task_id, n)
            if status == "succeeded":
                assert n >= 1
            if status in ("skipped", "missed"):
                assert n == 0, (task_id, status, n)
        for task_id in self.cancelled_by_call:
            assert self.terminal[task_id][1] == "cancelled"
        # Dependencies: parents ended before their children started, satisfying the edge;
        # a child whose edge can no longer be satisfied is skipped.
        for child, parent, cond, awaited in self.edges:
            started = self.dispatches.get(child)
            if parent is None:
                assert not started, f"task {child} ran while awaiting key {awaited!r}"
                assert self.terminal[child][1] != "succeeded"
                continue
            if parent not in self.terminal:
                # Ended before admission and forgotten since: only retained parents are accepted.
                assert parent not in self.admitted
                continue
            p_seq, p_status, _ = self.terminal[parent]
            c_seq, c_status, _ = self.terminal[child]
            if started:
                assert p_seq < started[0][0], f"task {child} started before its parent {parent} ended"
                assert p_status in SATISFIES[cond], \
                    f"task {child} ran although its parent {parent} ended {p_status} (on {cond})"
            if p_status not in SATISFIES[cond] and c_seq > p_seq:
                assert c_status == "skipped", \
                    f"task {child} ended {c_status} after its parent {parent} ended {p_status} (on {cond})"
        # A skipped task has a reason: an edge that can no longer be satisfied,
        # or an awaited key that never came.
        reasons: dict[int, bool] = {}
        for child, parent, cond, awaited in self.edges:
            if parent is None or (parent in self.terminal
                                  and self.terminal[parent][1] not in SATISFIES[cond]):
                reasons[child] = True
        for task_id, (_, status, _) in self.terminal.items():
            if status == "skipped":
                assert reasons.get(task_id), f"task {task_id} was skipped without a reason"
        # FIFO within a class for plain tasks of a pool without fair sharing.
        for (pool, cls), ids in self.plain_starts.items():
            if self.pool_configs[pool].fair_share:
                continue
            ids = [i for i in ids if i not in self.given_back]   # a delayed give-back waits like a retry
            assert ids == sorted(ids), f"pool {pool} class {cls}: plain tasks started out of order {ids}"
        # Leases: each dispatched once, then completed or aborted at most once.
        assert len(self.lease_state) == sum(len(v) for v in self.dispatches.values()) + given_back
        assert all(state in ("aborted", "completed", "given_back") for state in self.lease_state.values())
        assert totals["stale_completions"] == self.stale_sent

    def run(self) -> list[tuple]:
        self.check()
        self.workload()
        self.drain()
        self.verify()
        return self.trace


def run_seed(seed: int) -> None:
    World(seed).run()


@pytest.mark.parametrize("seed", range(CI_SEEDS))
def test_simulation(seed):
    run_seed(seed)


def pytest_generate_tests(metafunc):
    # The long sweep's seeds exist only with --runslow (one skipped item otherwise).
    if metafunc.function.__name__ == "test_simulation_more_seeds":
        last = SLOW_SEEDS if metafunc.config.getoption("--runslow") else CI_SEEDS + 1
        metafunc.parametrize("seed", range(CI_SEEDS, last))


@pytest.mark.slow
def test_simulation_more_seeds(seed):
    run_seed(seed)


@pytest.mark.parametrize("seed", [7, 1234])
def test_same_seed_same_run(seed):
    first = World(seed).run()
    second = World(seed).run()
    assert len(first) > 50
    assert first == second
    assert World(seed + 1).run() != first
