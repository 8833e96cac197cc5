"""Recovery: what a new leader loads from the store, as the engine restores it.

The stored rows are decoded one at a time (a row, its record and its payload
bytes are freed as the next is read), with the cyclic garbage collector off:
millions of objects are made here and all of them live on.
"""

from __future__ import annotations

import copy
import gc
import logging
from typing import Any, Iterable, Iterator, Sequence, TypeVar

from ..core.engine import Core
from ..core.persist import RestoredSchedule, RestoredTask, spec_from_record
from ..core.errors import SchedulerError
from ..core.types import READY, STATUSES, CoreConfig, ResourceConfig, Status, TaskSpec, shard_of
from ..store.base import Store, StoredSchedule, StoredTask
from ..store.codec import Codec
from .checkpoints import CheckpointBook

__all__ = ["recover", "decode_tasks", "decode_schedule"]

log = logging.getLogger("cronoq.scheduler")

_T = TypeVar("_T")
_STATUS: dict[str, Status] = {status: status for status in STATUSES}


async def recover(store: Store, codec: Codec, config: CoreConfig, epoch: int, pools: Sequence[Any],
                  resources: Sequence[ResourceConfig], now_ns: int, checkpoints: CheckpointBook) -> Core:
    """A new engine for ``epoch``, holding what ``store`` keeps (tasks,
    schedules, checkpoints into ``checkpoints``)."""
    log.info("leadership acquired (epoch %d)", epoch, extra={"epoch": epoch, "action": "leader"})
    config = copy.copy(config)
    config.epoch = epoch
    config.persist = True
    # The store's retention (finished tasks kept for dependencies and keys) applies in memory too.
    config.retention_ns = max(config.retention_ns, int(store.retention_ns))
    core = Core(config, [p.config for p in pools], resources, now=now_ns)
    recovered = await store.recover(now_ns, config.retention_ns)
    if config.shard:
        _check_shard(config.shard, recovered.high_water)
    # Millions of objects are made here and all of them live on: the cyclic
    # collector would scan the growing heap again and again for nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        tasks = decode_tasks(codec, recovered.tasks)
        if config.shard:
            tasks = _of_shard(config.shard, tasks)
        recovered.tasks = []   # the rows go as they are decoded
        schedules = [decode_schedule(codec, row) for row in recovered.schedules]
        quarantined = core.restore(now_ns, tasks, schedules, recovered.high_water)
    finally:
        if collecting:
            gc.enable()
    restored = checkpoints.restore(
        (c.task_id, c.stage, c.data, c.attempt, c.saved_ns) for c in await store.load_checkpoints())
    if restored:
        log.info("recovered %d checkpoints", restored, extra={"action": "recovered", "count": restored})
    if quarantined:
        log.warning("%d stored tasks were quarantined at recovery", len(quarantined),
                    extra={"action": "quarantine", "count": len(quarantined)})
    log.info("recovered %d live tasks and %d schedules", len(core.tasks), len(core.recurring),
             extra={"action": "recovered", "epoch": epoch})
    return core


def _check_shard(shard: int, task_id: int) -> None:
    # Unsharded ids (top bits 0) are let through: the book warns they are not always recognised.
    other = shard_of(task_id)
    if other not in (0, shard):
        raise SchedulerError(f"the store holds tasks of shard number {other}, not of this server's shard "
                           f"(number {shard}): check store.path / store.schema")


def _of_shard(shard: int, tasks: Iterable[RestoredTask]) -> Iterator[RestoredTask]:
    for task in tasks:
        _check_shard(shard, task.id)
        yield task


def _consume(rows: Iterable[_T]) -> Iterator[_T]:
    """The items of ``rows``; a list is emptied as it is read (its rows freed)."""
    if isinstance(rows, list):
        freed: list[Any] = rows   # holds None where a row was read
        for i in range(len(rows)):
            row = rows[i]
            freed[i] = None
            yield row
        rows.clear()
    else:
        yield from rows


def decode_tasks(codec: Codec, rows: Iterable[StoredTask]) -> Iterator[RestoredTask]:
    """The stored rows as the engine restores them, one at a time (a row,
    its record and its payload bytes are freed as the next is read).

    Rows whose record is one shared dict (equal options: the store shares
    them) share one read-only spec; each carries its own payload.
    """
    decode = codec.decode
    shared: dict[int, tuple[dict[str, Any], TaskSpec]] = {}
    for row in _consume(rows):
        record = row.record
        hit = shared.get(id(record))
        status = _STATUS.get(row.status)
        if hit is not None and hit[0] is record and status is not None and row.payload is not None:
            try:
                payload = decode(row.payload)
            except Exception as exc:  # any decoding problem quarantines the row
                yield _undecodable(row, status, exc)
                continue
            yield RestoredTask(row.id, row.pool, hit[1], row.submitted_ns, status, row.attempt,
                               row.message, row.finished_ns, None, payload)
            continue
        task = _decode_task(codec, row)
        if task.spec is not None and isinstance(record, dict) and "key" not in record \
                and len(shared) < 4096:
            shared[id(record)] = (record, task.spec)
        yield task

def _undecodable(row: StoredTask, status: str, exc: Exception) -> RestoredTask:
    return RestoredTask(row.id, row.pool, None, row.submitted_ns, status, row.attempt,
                        row.message, row.finished_ns, error=f"cannot decode the stored task: {exc}")

def _decode_task(codec: Codec, row: StoredTask) -> RestoredTask:
    # The engine compares statuses by identity: map the store's strings to its constants.
    status = _STATUS.get(row.status)
    try:
        if status is None:
            status = READY
            raise ValueError(f"unknown status {row.status!r}")
        if row.record is None or row.payload is None:
            raise ValueError("the stored record is unreadable")
        spec = spec_from_record(row.record, codec.decode(row.payload))
        return RestoredTask(row.id, row.pool, spec, row.submitted_ns, status, row.attempt,
                            row.message, row.finished_ns)
    except Exception as exc:  # any decoding problem quarantines the row
        assert status is not None   # set to READY above when unknown
        return _undecodable(row, status, exc)

def decode_schedule(codec: Codec, row: StoredSchedule) -> RestoredSchedule:
    record = row.record or {}
    try:
        if row.payload is None:
            raise ValueError("the stored payload is unreadable")
        template = spec_from_record(record["template"], codec.decode(row.payload))
        if record.get("deadline_in_ns") is not None:
            template.deadline_in_ns = record["deadline_in_ns"]
            template.plain = False
        return RestoredSchedule(row.name, record["cron"], record.get("tz", "UTC"),
                                record.get("overlap", "skip"), record["tolerance_ns"],
                                record.get("on_miss", "run_late"), record.get("key"), template,
                                record.get("next_start_ns"), record.get("last_task"),
                                record.get("last_start_ns"))
    except Exception as exc:
        return RestoredSchedule(row.name, record.get("cron", ""), record.get("tz", "UTC"), "skip", 0,
                                "run_late", None, None, None, None, None,
                                error=f"cannot decode the stored schedule: {exc}")
