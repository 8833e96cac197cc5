"""Helpers shared by the engine tests."""

from __future__ import annotations

from cronoq.core import NS, Abort, Core, CoreConfig, Dispatch, PoolConfig, StatusEvent

S = NS  # one second in engine time


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
