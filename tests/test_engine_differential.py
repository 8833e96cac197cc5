"""The engine's fast paths against the general paths they shortcut.

``GeneralCore`` is the engine with every deliberate shortcut replaced by the
slow, obvious version of the same rule:

- ``fast_paths = False``: every submission, single or batch, goes through the
  planning path (the engine admits plain tasks straight into their queue),
  and every ending goes through ``_finish`` (``complete()`` ends a task with
  no extras and no dependents with the bookkeeping alone);
- dispatch re-arming: after every call, every pool is offered its free slots
  (the engine marks a pool for dispatch only when something may have changed);
- label groups: waiting labelled tasks are served by a scan of every ready
  task, oldest first (the engine compares the heads of its per-label lines,
  plus the few waiters that hold a slot);
- the ready queues: the next task is always chosen by comparing scores
  (``take`` pops the head of the only class with work without scoring).

The seeded simulation runs every seed through both, with persistence on for
half of them, and the complete traces must be identical: every raw action
(dispatches, aborts, events with their messages, persisted mutations,
scaling) in order, the driver's own record (completions, stale reports,
refusals) and a snapshot of the engine every ``SNAPSHOT_EVERY`` calls and at
the end. A fast path that skips work, or does it in another order, shows as
a difference.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from cronoq.core import COMPILED, Core
from cronoq.core import actions as act
from cronoq.core.model import W_LABEL, W_NONE, PoolState
from cronoq.core.persist import spec_record
from cronoq.core.queues import ReadyQueues
from cronoq.core.types import READY, PoolConfig
from test_simulation import World

SEEDS = 200
SNAPSHOT_EVERY = 20


class GeneralQueues(ReadyQueues):
    __slots__ = ()
    takes = 0   # calls the engine made (compiled, it reaches them only if the class allows Python subclasses)

    def take(self, now):
        GeneralQueues.takes += 1
        e = self._best(now) if self.total else None
        if e is not None:
            self.pop(e)
        return e


class GeneralCore(Core):
    __slots__ = ()
    fast_paths = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.pools.values():
            # New and empty, as the pool's own (a compiled object cannot change its class).
            cfg, config = self.config, p.config
            p.queues = GeneralQueues(cfg.priority, cfg.urgency, config.fair_share, config.tenant_weights)

    def _offer_everything(self) -> None:
        for p in self.pools.values():
            self._mark_dirty(p)
        self._flush(self.now)

    def _general(name):  # noqa: N805  (a decorator factory used in the class body)
        def call(self, *args, **kwargs):
            try:
                return getattr(Core, name)(self, *args, **kwargs)
            finally:
                self._offer_everything()
        call.__name__ = name
        return call

    submit = _general("submit")
    submit_batch = _general("submit_batch")
    complete = _general("complete")
    give_back = _general("give_back")
    heartbeat = _general("heartbeat")
    cancel = _general("cancel")
    set_capacity = _general("set_capacity")
    set_group_capacity = _general("set_group_capacity")
    advance = _general("advance")
    add_recurring = _general("add_recurring")
    remove_recurring = _general("remove_recurring")

    def _serve_labels(self, p: PoolState, now: int) -> None:
        while p.label_waiting:
            free = p.capacity - p.busy - p.held > 0
            waiting = sorted((e for e in self.tasks.values()
                              if e.pool is p and e.status is READY and e.where == W_LABEL),
                             key=lambda e: e.id)
            for e in waiting:
                if free or (e.x is not None and e.x.hold):
                    group = self._group_for(p, e.spec.labels)
                    if group is not None:
                        break
            else:
                return
            p.label_waiters[e.spec.labels].remove(e)
            if e in p.held_label_waiters:
                p.held_label_waiters.remove(e)
            p.label_waiting -= 1
            e.where = W_NONE
            if e.spec.resources and not self._acquire(e, now):
                continue
            self._release_hold(p, e)
            self._start(p, e, now, group)


def comparable(value: Any) -> Any:
    """Actions and snapshots as plain data (entries by id, specs by their record)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [comparable(item) for item in value]
    if isinstance(value, dict):
        return [[comparable(k), comparable(v)] for k, v in value.items()]
    if isinstance(value, frozenset):
        return sorted(repr(comparable(item)) for item in value)
    name = type(value).__name__
    if name == "Entry":
        return ["entry", value.id]
    if name == "TaskSpec":
        return ["spec", comparable(spec_record(value, 0)), comparable(value.payload)]
    if name == "Recurring":
        return ["recurring", value.name, value.next_start, value.last_task]
    raise AssertionError(f"no comparable form for {value!r}")


class RecordingWorld(World):
    """The simulation, recording every raw action and periodic snapshots."""

    def __init__(self, seed: int, core_class: type[Core] = Core) -> None:
        self.record: list = []

        def make(config, pools, resources, now):
            config.persist = seed % 2 == 0   # the persisted mutations are compared too
            return core_class(config, pools, resources, now=now)

        super().__init__(seed, make)

    def pump(self) -> None:
        actions = self.core.actions
        self.record.extend(comparable(raw) for raw in actions)
        kept = [raw for raw in actions if raw[0] != act.PERSIST]   # (the driver has no store)
        actions.clear()
        actions.extend(kept)
        super().pump()

    def call(self, fn, *args, pump: bool = True):
        try:
            return super().call(fn, *args, pump=pump)
        finally:
            if pump and self.steps % SNAPSHOT_EVERY == 0:
                self.snapshot()

    def snapshot(self) -> None:
        snap = self.core.snapshot(self.now)
        self.pump()
        self.check()
        self.record.append(("snapshot", comparable(snap.as_dict())))

    def run(self) -> list:
        trace = super().run()
        self.snapshot()
        return comparable(trace) + self.record


@pytest.mark.skipif(COMPILED, reason="the compiled engine calls its own methods natively, past the counting "
                                     "wrappers set on its class (the pure run checks this; the test below, "
                                     "that the general core's overrides are reached)")
def test_the_general_core_is_really_general():
    # The comparison means something only if the general paths run where the
    # fast core takes its shortcuts: labelled tasks served by the scan, plain
    # successes ended by _finish, plain submissions and batches admitted by
    # planning.
    calls = {"scan": 0, "general_end": 0, "fast_end": 0, "plain": 0, "plain_batch": 0}
    originals = (GeneralCore._serve_labels, Core._finish, Core._ended, Core._admit, Core._admit_plain,
                 Core.submit_batch)
    labels, finish, ended, admit, admit_plain, submit_batch = originals
    planned = []

    def counting_labels(self, p, now):
        calls["scan"] += 1
        return labels(self, p, now)

    def counting_finish(self, e, status, now, message):
        if type(self) is GeneralCore and e.x is None and e.children is None and status == "succeeded":
            calls["general_end"] += 1
        return finish(self, e, status, now, message)

    def counting_ended(self, e, status, now, message):
        if sys._getframe(1).f_code.co_name == "complete":
            assert type(self) is not GeneralCore, "the general core ended a task without _finish"
            calls["fast_end"] += 1
        return ended(self, e, status, now, message)

    def counting_admit(self, now, specs, batch):
        planned.append(1)
        return admit(self, now, specs, batch)

    def counting_admit_plain(self, p, spec, key, now):
        assert type(self) is not GeneralCore, "the general core admitted a task unplanned"
        calls["plain"] += 1
        return admit_plain(self, p, spec, key, now)

    def counting_submit_batch(self, now, specs):
        planned.clear()
        results = submit_batch(self, now, specs)
        if results and not planned:
            assert type(self) is not GeneralCore, "the general core admitted a batch unplanned"
            calls["plain_batch"] += 1
        return results

    (GeneralCore._serve_labels, Core._finish, Core._ended, Core._admit, Core._admit_plain,
     Core.submit_batch) = (counting_labels, counting_finish, counting_ended, counting_admit,
                           counting_admit_plain, counting_submit_batch)
    try:
        for seed in range(4):
            RecordingWorld(seed, GeneralCore).run()
            RecordingWorld(seed).run()
    finally:
        (GeneralCore._serve_labels, Core._finish, Core._ended, Core._admit, Core._admit_plain,
         Core.submit_batch) = originals
    assert all(calls.values()), calls


def test_the_general_engine_runs_its_own_paths():
    # Compiled (cronoq.core.COMPILED), the engine calls the overrides only
    # if it was built to allow Python subclasses: else the comparison below
    # would compare the fast paths with themselves.
    takes = GeneralQueues.takes
    RecordingWorld(0, GeneralCore).run()
    assert GeneralQueues.takes > takes
    core = GeneralCore(pools=[PoolConfig("default")])
    assert not core._fast and type(core.default_pool.queues) is GeneralQueues


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fast_paths_match_the_general_paths(seed):
    fast = RecordingWorld(seed).run()
    general = RecordingWorld(seed, GeneralCore).run()
    assert len(fast) == len(general)
    for i, (a, b) in enumerate(zip(fast, general)):
        assert a == b, f"seed {seed}: the runs part at step {i}: fast {a} general {b}"


class CompactingCore(Core):
    """The engine compacting its timer heap at every chance, and checking that
    it drops only timers that are not live."""

    __slots__ = ()
    flushes = 0

    def _flush(self, now):
        CompactingCore.flushes += 1
        self._timers_ended = len(self.timer_heap) + 1_000   # always past the threshold
        return Core._flush(self, now)

    def _timer_gone(self, kind, obj, token):
        gone = Core._timer_gone(self, kind, obj, token)
        assert not (gone and self._timer_live(kind, obj, token)), (kind, obj, token)
        return gone


@pytest.mark.parametrize("seed", range(0, SEEDS, 4))
def test_timer_compaction_changes_nothing(seed):
    plain = RecordingWorld(seed).run()
    flushes = CompactingCore.flushes
    compacting = RecordingWorld(seed, CompactingCore).run()
    assert CompactingCore.flushes > flushes   # (the engine's own calls reach the override)
    assert len(plain) == len(compacting)
    for i, (a, b) in enumerate(zip(plain, compacting)):
        assert a == b, f"seed {seed}: the runs part at step {i}: plain {a} compacting {b}"
