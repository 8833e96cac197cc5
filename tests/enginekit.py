"""Helpers shared by the engine tests."""

from __future__ import annotations

import pytest

from cronoq.core import COMPILED, NS, Abort, Core, CoreConfig, Dispatch, PoolConfig, StatusEvent, TaskSpec

S = NS  # one second in engine time


def raises_wrong_type(match: str):
    """An engine call given a value of another type than its annotation: the
    pure engine's own check raises ValueError (``match``); the compiled one
    (cronoq.core.COMPILED) refuses the argument itself, with TypeError."""
    if COMPILED:
        return pytest.raises(TypeError, match="object expected; got")
    return pytest.raises(ValueError, match=match)


def make_core(*pools: PoolConfig, resources=(), **config) -> Core:
    if not pools:
        pools = (PoolConfig("default", min=1, max=4, initial=1, autoscale=False),)
    return Core(CoreConfig(**config), list(pools), list(resources))


def drain(core: Core) -> list:
    out = []
    while True:
        action = core.poll_action()
        if action is None:
            return out
        out.append(action)


def dispatches(actions) -> list[Dispatch]:
    return [a for a in actions if isinstance(a, Dispatch)]


def events(actions) -> list[StatusEvent]:
    return [a for a in actions if isinstance(a, StatusEvent)]


def aborts(actions) -> list[Abort]:
    return [a for a in actions if isinstance(a, Abort)]


def occupy(core: Core, now: int = 0) -> int:
    """Submit a critical task that takes the only slot; returns its lease."""
    core.submit(now, TaskSpec("busy", priority="critical"))
    [d] = dispatches(drain(core))
    core.check_invariants()
    return d.lease


def free_slot_at(core: Core, now: int, lease: int) -> Dispatch:
    """Complete ``lease`` at ``now`` and return the one task dispatched instead."""
    assert core.complete(now, lease)
    core.check_invariants()
    [d] = dispatches(drain(core))
    return d


def run_to(core: Core, until: int) -> list:
    """Fire every timer up to ``until`` one at a time, as a driver would, then
    stand at ``until``. Returns [(time, action)]."""
    out = []
    while True:
        wake = core.next_wakeup()
        if wake is None or wake > until:
            break
        core.advance(wake)
        core.check_invariants()
        out.extend((wake, a) for a in drain(core))
    core.advance(until)
    core.check_invariants()
    out.extend((until, a) for a in drain(core))
    return out
