"""Listings of a scheduler's tasks and recurring schedules.

``Scheduler.list_tasks`` pages through tasks in id order: live ones from the
engine, finished ones from the engine's retained records and, with a store
that can list them (``list_finished``), from the store too, so a finished
task stays listed after the engine forgot it, as long as the store keeps it.
``Scheduler.recurring`` describes the registered cron schedules.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from ..core.errors import UnknownPool
from ..core.snapshot import TaskInfo
from ..core.types import NS, STATUSES, TERMINAL

if TYPE_CHECKING:
    from ..core.engine import Core
    from ..store.base import TaskRecord

__all__ = ["RecurringInfo", "list_tasks", "recurring"]


@dataclass(frozen=True)
class RecurringInfo:
    """A recurring schedule as ``Scheduler.recurring()`` describes it.

    ``next_at``: Unix seconds of the next occurrence not yet created (None
    when the expression has no further one); ``last_task_id``: the id of the
    last occurrence created (None before the first).
    """

    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    key: str | None
    overlap: str
    tolerance: float
    on_miss: str
    next_at: float | None
    last_task_id: int | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recurring(core: Core) -> list[RecurringInfo]:
    """Every schedule of ``core``, sorted by name."""
    out = []
    for name in sorted(core.recurring):
        rec = core.recurring[name]
        template = rec.template
        pool = template.pool if template.pool is not None else core.default_pool.name
        out.append(RecurringInfo(name, rec.cron.expr, rec.cron.tz, pool, template.kind, rec.key,
                                 rec.overlap, rec.tolerance_ns / NS, rec.on_miss,
                                 None if rec.next_start is None else rec.next_start / NS,
                                 rec.last_task))
    return out


def check_filters(core: Core, pools: Iterable[str] | None, statuses: Iterable[str] | None,
                  after: int, limit: int) -> tuple[frozenset[str] | None, frozenset[str] | None]:
    """The filters of ``list_tasks``, validated: unknown pools raise
    ``UnknownPool``, anything else invalid ``ValueError``."""
    pool_set = None
    if pools is not None:
        if isinstance(pools, str):
            raise ValueError("pools must be a list of pool names, not one string")
        pool_set = frozenset(pools)
        for name in pool_set:
            if not isinstance(name, str):
                raise ValueError(f"pools must hold pool names (strings), got {name!r}")
            if name not in core.pools:
                raise UnknownPool(f"no pool named {name!r}")
    status_set = None
    if statuses is not None:
        if isinstance(statuses, str):
            raise ValueError("statuses must be a list of statuses, not one string")
        status_set = frozenset(statuses)
        for status in status_set:
            if status not in STATUSES:
                raise ValueError(f"unknown status {status!r}; statuses are {', '.join(STATUSES)}")
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be a task id (an integer >= 0), got {after!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    return pool_set, status_set


def engine_tasks(core: Core, pools: frozenset[str] | None, statuses: frozenset[str] | None,
                 after: int, limit: int, newest_first: bool = False, before: int = 0) -> list[TaskInfo]:
    """The first ``limit`` matching tasks the engine knows (live or retained)
    with ids above ``after``; with ``newest_first``, the last ``limit`` with
    ids below ``before`` (0: no bound)."""
    found: list[TaskInfo] = []

    def in_range(task_id: int) -> bool:
        return task_id > after and (not before or task_id < before)

    pick = heapq.nlargest if newest_first else heapq.nsmallest
    if statuses is None or not statuses <= TERMINAL:
        live = (e for task_id, e in core.tasks.items() if in_range(task_id)
                and (pools is None or e.pool.name in pools) and (statuses is None or e.status in statuses))
        for e in pick(limit, live, key=lambda e: e.id):
            spec = e.spec
            found.append(TaskInfo(e.id, e.status, e.pool.name, e.key, e.kind, e.attempt, None,
                                  tenant=None if spec is None else spec.tenant,
                                  max_attempts=core.max_attempts(e)))
    if statuses is None or statuses & TERMINAL:
        ended = ((task_id, record) for task_id, record in core.retained.items() if in_range(task_id)
                 and (pools is None or record[1] in pools) and (statuses is None or record[0] in statuses))
        for task_id, record in pick(limit, ended, key=lambda item: item[0]):
            status, pool, key, kind, attempt, message, tenant, max_attempts = record
            found.append(TaskInfo(task_id, status, pool, key, kind, attempt, message, tenant=tenant,
                                  max_attempts=max_attempts))
    return found


def stored_max_attempts(record: TaskRecord, pool: Any) -> int | None:
    """The attempts a task known only to the store was allowed: its own
    policy's, else its pool's (``pool``: anything with a ``retry`` policy, or
    None for a pool no longer configured)."""
    if record.max_attempts is not None:
        return record.max_attempts
    return None if pool is None else int(pool.retry.max_attempts)


def merge(first: list[TaskInfo], more: Iterable[TaskInfo], limit: int,
          newest_first: bool = False) -> list[TaskInfo]:
    """Both lists in id order (descending with ``newest_first``), without
    repeating an id (``first`` wins), at most ``limit``."""
    seen = {info.id for info in first}
    merged = first + [info for info in more if info.id not in seen]
    merged.sort(key=lambda info: info.id, reverse=newest_first)
    return merged[:limit]


async def list_tasks(core: Core, store: Any, pools: Iterable[str] | None, statuses: Iterable[str] | None,
                     after: int, limit: int, newest_first: bool = False, before: int = 0) -> list[TaskInfo]:
    pool_set, status_set = check_filters(core, pools, statuses, after, limit)
    if isinstance(before, bool) or not isinstance(before, int) or before < 0:
        raise ValueError(f"before must be a task id (an integer >= 0), got {before!r}")
    found = engine_tasks(core, pool_set, status_set, after, limit, newest_first, before)
    list_finished = getattr(store, "list_finished", None)
    if list_finished is not None and (status_set is None or status_set & TERMINAL):
        records = await list_finished(
            pools=None if pool_set is None else sorted(pool_set),
            statuses=sorted(TERMINAL if status_set is None else status_set & TERMINAL),
            after=after, limit=limit, **({"before": before, "newest_first": True} if newest_first else {}))
        # The engine's view is the newer one: it wins for ids both know.
        found = merge(found, (TaskInfo(r.id, r.status, r.pool, r.key, r.kind, r.attempt, r.message, tenant=r.tenant,
                                       max_attempts=stored_max_attempts(r, core.pools.get(r.pool)))
                              for r in records), limit, newest_first)
    else:
        found = merge(found, (), limit, newest_first)
    return found
