"""The engine's fast paths against the general paths they shortcut.

``GeneralCore`` is the engine with its shortcuts replaced by the slow, obvious
version of the same rule:

- dispatch re-arming: after every call, every pool is offered its free slots
  (the engine marks a pool for dispatch only when something may have changed);
- admission: every submission goes through the planning path (the engine
  admits plain tasks straight into their queue);
- label groups: waiting labelled tasks are served by a scan of every ready
  task, oldest first (the engine compares the heads of its per-label lines,
  plus the few waiters that hold a slot).

The seeded simulation runs every seed through both, and the complete traces
(dispatches, aborts, events, scaling, completions, in order and with their
times) must be identical: a fast path that skips work, or does it in another
order, shows as a difference.
"""

from __future__ import annotations

import pytest

from cronoq.core import Core
from cronoq.core.engine import W_LABEL, W_NONE
from cronoq.core.types import READY
from test_simulation import World

SEEDS = 200


class GeneralCore(Core):
    __slots__ = ()

    def _offer_everything(self) -> None:
        for p in self.pools.values():
            if not p.dirty:
                p.dirty = True
                self._dirty.append(p)
        self._flush(self.now)

    def _then_offer(name):  # noqa: N805  (a decorator factory used in the class body)
        def call(self, *args, **kwargs):
            try:
                return getattr(Core, name)(self, *args, **kwargs)
            finally:
                self._offer_everything()
        call.__name__ = name
        return call

    complete = _then_offer("complete")
    heartbeat = _then_offer("heartbeat")
    cancel = _then_offer("cancel")
    set_capacity = _then_offer("set_capacity")
    set_group_capacity = _then_offer("set_group_capacity")
    advance = _then_offer("advance")
    add_recurring = _then_offer("add_recurring")
    remove_recurring = _then_offer("remove_recurring")

    def submit(self, now, spec):
        now = self._enter(now)
        try:
            return self._admit(now, (spec,), False)[0]
        finally:
            self._offer_everything()

    def submit_batch(self, now, specs):
        now = self._enter(now)
        specs = list(specs)
        try:
            return self._admit(now, specs, True) if specs else []
        finally:
            self._offer_everything()

    def _serve_labels(self, p, now) -> None:
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


def test_the_general_core_is_really_general():
    # The comparison means something only if the general path runs: a seed
    # whose workload parks labelled tasks goes through the scan.
    world = World(3, GeneralCore)
    calls = []
    original = GeneralCore._serve_labels

    def counting(self, p, now):
        calls.append(p.name)
        return original(self, p, now)

    GeneralCore._serve_labels = counting
    try:
        world.run()
    finally:
        GeneralCore._serve_labels = original
    assert calls


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fast_paths_match_the_general_paths(seed):
    fast = World(seed).run()
    general = World(seed, GeneralCore).run()
    assert len(fast) == len(general)
    for i, (a, b) in enumerate(zip(fast, general)):
        assert a == b, f"seed {seed}: the runs part at step {i}: fast {a} general {b}"


class CompactingCore(Core):
    """The engine compacting its timer heap at every chance, and checking that
    it drops only timers that are not live."""

    __slots__ = ()

    def _flush(self, now):
        self._timers_ended = len(self._timer_heap) + 1_000   # always past the threshold
        return Core._flush(self, now)

    def _timer_gone(self, kind, obj, token):
        gone = Core._timer_gone(self, kind, obj, token)
        assert not (gone and self._timer_live(kind, obj, token)), (kind, obj, token)
        return gone


@pytest.mark.parametrize("seed", range(0, SEEDS, 4))
def test_timer_compaction_changes_nothing(seed):
    plain = World(seed).run()
    compacting = World(seed, CompactingCore).run()
    assert len(plain) == len(compacting)
    for i, (a, b) in enumerate(zip(plain, compacting)):
        assert a == b, f"seed {seed}: the runs part at step {i}: plain {a} compacting {b}"
