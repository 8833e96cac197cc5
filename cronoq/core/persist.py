"""The durable form of tasks and schedules, and what recovery hands back.

A store keeps a task as its options (a JSON-able dict), its encoded payload
and its state. Relative times are resolved against the submission time before
they are stored, so a recovered task keeps the deadline and start it had.
Everything here is pure data; the stores decide how to write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .types import RetryPolicy, TaskSpec

if TYPE_CHECKING:
    from .recurring import Recurring

__all__ = ["spec_record", "spec_from_record", "RestoredTask", "RestoredSchedule", "schedule_record"]

RECORD_VERSION = 1


def spec_record(spec: TaskSpec, submitted_ns: int) -> dict[str, Any]:
    """The options of ``spec`` as JSON-able data (the payload is kept apart)."""
    out: dict[str, Any] = {"v": RECORD_VERSION, "kind": spec.kind, "priority": spec.priority}
    if spec.pool is not None:
        out["pool"] = spec.pool
    if spec.key is not None:
        out["key"] = spec.key
    deadline = spec.deadline_at_ns
    if deadline is None and spec.deadline_in_ns is not None:
        deadline = submitted_ns + spec.deadline_in_ns
    if deadline is not None:
        out["deadline_ns"] = deadline
    start = spec.start_at_ns
    if start is None and spec.start_in_ns is not None:
        start = submitted_ns + spec.start_in_ns
    if start is not None:
        out["start_ns"] = start
    for name in ("duration_hint_ns", "timeout_ns", "tolerance_ns", "tenant"):
        value = getattr(spec, name)
        if value is not None:
            out[name] = value
    if spec.on_miss != "run_late":
        out["on_miss"] = spec.on_miss
    if spec.retry is not None:
        r = spec.retry
        out["retry"] = [r.max_attempts, r.initial_backoff, r.multiplier, r.max_backoff, r.jitter]
    if spec.resources:
        out["resources"] = dict(spec.resources)
    if spec.edges:
        out["edges"] = [[ref, cond] for ref, cond in spec.edges]
    if spec.labels:
        out["labels"] = dict(spec.labels)
    if spec.tags:
        out["tags"] = dict(spec.tags)
    if spec.stages:
        out["stages"] = list(spec.stages)
    return out


def spec_from_record(record: dict[str, Any], payload: Any) -> TaskSpec:
    """Rebuild a TaskSpec (with absolute times) from ``spec_record`` data.

    Raises ``ValueError`` (or a subclass) for data that does not validate, so
    recovery can quarantine the row.
    """
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
        raise ValueError(f"unsupported task record version {record.get('v') if isinstance(record, dict) else record!r}")
    from .types import CLASSES
    options: dict[str, Any] = {
        "pool": record.get("pool"),
        "kind": record.get("kind"),
        "priority": CLASSES[record["priority"]],
        "key": record.get("key"),
        "tenant": record.get("tenant"),
        "on_miss": record.get("on_miss"),
        "resources": record.get("resources"),
        "labels": record.get("labels"),
        "tags": record.get("tags"),
        "stages": record.get("stages"),
    }
    if "retry" in record:
        options["retry"] = RetryPolicy(*record["retry"])
    if "edges" in record:
        from .types import Dep
        options["deps"] = [Dep(ref, cond) for ref, cond in record["edges"]]
    spec = TaskSpec(payload, **options)
    # Times are stored in ns; set them directly rather than round-tripping floats.
    for name, attr in (("deadline_ns", "deadline_at_ns"), ("start_ns", "start_at_ns"),
                       ("duration_hint_ns", "duration_hint_ns"), ("timeout_ns", "timeout_ns"),
                       ("tolerance_ns", "tolerance_ns")):
        value = record.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or (value < 0 and name != "deadline_ns"):
                raise ValueError(f"task record field {name} must be an integer of nanoseconds, got {value!r}")
            setattr(spec, attr, value)
            spec.plain = False
    return spec


def schedule_record(rec: Recurring) -> dict[str, Any]:
    """A recurring schedule (``cronoq.core.recurring.Recurring``) as JSON-able data."""
    return {
        "v": RECORD_VERSION,
        "name": rec.name,
        "cron": rec.cron.expr,
        "tz": rec.cron.tz,
        "overlap": rec.overlap,
        "tolerance_ns": rec.tolerance_ns,
        "on_miss": rec.on_miss,
        "key": rec.key,
        "template": _template_record(rec.template),
        "deadline_in_ns": rec.template.deadline_in_ns,
        "next_start_ns": rec.next_start,
        "last_task": rec.last_task,
        "last_start_ns": rec.last_start,
    }


def _template_record(template: TaskSpec) -> dict[str, Any]:
    record = spec_record(template, 0)
    record.pop("deadline_ns", None)   # a template's deadline is relative: deadline_in_ns
    return record


SPEC_PAYLOAD: Any = object()   # RestoredTask.payload: the spec's own


@dataclass(slots=True)
class RestoredTask:
    """A task as a store recovered it.

    Tasks with the same options may share one ``spec`` (read-only); each then
    carries its own ``payload``.
    """

    id: int
    pool: str
    spec: TaskSpec | None          # None when the row could not be decoded
    submitted_ns: int
    status: str
    attempt: int = 0
    message: str | None = None
    finished_ns: int | None = None
    error: str | None = None       # why the row could not be decoded
    payload: Any = SPEC_PAYLOAD   # the task's payload, when not ``spec.payload``


@dataclass
class RestoredSchedule:
    """A recurring schedule as a store recovered it."""

    name: str
    cron: str
    tz: str
    overlap: str
    tolerance_ns: int
    on_miss: str
    key: str | None
    template: TaskSpec | None
    next_start_ns: int | None
    last_task: int | None
    last_start_ns: int | None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
