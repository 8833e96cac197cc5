"""``cronoq.Pool``: a pool's scheduling configuration plus its executor."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from ..core.types import AutoscaleConfig, PoolConfig, RetryPolicy
from .runner import RunnerFactory

__all__ = ["Pool"]


class Pool:
    """A pool of concurrency slots running one executor.

    ``executor(ctx, payload)`` may be an ``async def`` (run on the scheduler's
    loop) or a plain function (run on threads the pool owns, one per running
    attempt). The pool autoscales between ``min`` and ``max``;
    ``autoscale=False`` fixes its capacity at ``initial``.

    ``runner`` instead of an executor hands the pool's attempts to another
    runner (``cronoq.runtime.runner``): ``runner(link)`` makes it when the
    scheduler starts. The server's remote workers use it.

    ``external_capacity=True``: capacity comes only from ``set_capacity`` /
    ``set_group_capacity`` (workers managed elsewhere); the autoscaler still
    computes the capacity the pool wants (``desired`` in snapshots,
    ``Scheduler.on_desired``) but never applies it.
    """

    def __init__(self, name: str, executor: Callable[..., Any] | None = None, *,
                 runner: RunnerFactory | None = None, min: int = 1, max: int = 10,
                 initial: int | None = None, autoscale: AutoscaleConfig | bool | None = None,
                 lease_ttl: float | None = None, max_pending: int | Mapping[str, int] | None = None,
                 overflow: str = "wait", retry: RetryPolicy | None = None,
                 unknown_dependency: str = "reject", await_timeout: float | None = None,
                 default_duration: float = 1.0, reservable_fraction: float = 0.5,
                 tenant_weights: Mapping[str, float] | None = None, fair_share: bool = False,
                 external_capacity: bool = False) -> None:
        if (executor is None) == (runner is None):
            raise ValueError("give a pool an executor or a runner (one of them)")
        if executor is not None and not callable(executor):
            raise ValueError(f"executor must be callable, got {type(executor).__name__}")
        if runner is not None and not callable(runner):
            raise ValueError(f"runner must be a callable making a runner, got {type(runner).__name__}")
        self.config = PoolConfig(
            name, min=min, max=max, initial=initial, autoscale=autoscale, lease_ttl=lease_ttl,
            max_pending=max_pending, overflow=overflow, retry=retry,
            unknown_dependency=unknown_dependency, await_timeout=await_timeout,
            default_duration=default_duration, reservable_fraction=reservable_fraction,
            tenant_weights=tenant_weights, fair_share=fair_share, external_capacity=external_capacity)
        self.executor = executor
        self.runner = runner
        self.is_async = executor is not None and _is_async(executor)

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        cfg = self.config
        return f"Pool({cfg.name!r}, min={cfg.min}, max={cfg.max}, autoscale={cfg.autoscale is not None})"


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)
