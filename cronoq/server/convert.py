"""The conversions between the cronoq.v1 messages and the scheduler's values.

``TaskReader.options`` turns a wire ``TaskSpec`` into a payload and
``cronoq.Task`` options, within the [limits] and the caller's pool scope and
tenant; it walks the fields the message sets, each converted by the rule of
its kind in the task vocabulary (``cronoq.core.options``). The other way:
``info_message``, ``explanation_message``, ``result_message`` and
``checkpoint_message`` build the
answers, and the enum maps translate priorities, conditions, miss and
overlap policies and statuses. Nothing here calls the scheduler.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable

from .._proto import cronoq_pb2 as pb
from ..core.actions import StatusEvent
from ..core.errors import TaskFailed
from ..core.explain import Explanation
from ..core.options import CLASSES, DEFAULT_CLASS, OPTIONS, RETRY_FIELDS, TASK_OPTIONS, WIRE_ORDER, TaskOption
from ..core.snapshot import Checkpoint
from ..core.types import NS, Dep, RetryPolicy
from .codec import OCTETS, Blob, check_content_type
from .errors import Code, ServiceError

if TYPE_CHECKING:
    from .auth import Principal
    from .config import LimitsConfig, RecurringSection
    from .info import TaskMeta

__all__ = ["TaskReader", "status_enum", "status_name", "checkpoint_message", "info_message", "result_message",
           "recurring_options", "task_ref", "explanation_message", "event_message", "PRIORITY_IN", "OVERLAP_IN", "OVERLAP_OUT"]

PRIORITY_IN: dict[int, int] = {pb.PRIORITY_UNSPECIFIED: DEFAULT_CLASS, pb.PRIORITY_CRITICAL: 0, pb.PRIORITY_HIGH: 1,
                               pb.PRIORITY_NORMAL: 2, pb.PRIORITY_LOW: 3}
PRIORITY_OUT = (pb.PRIORITY_CRITICAL, pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW)
EDGE_IN = {pb.EDGE_COND_UNSPECIFIED: "success", pb.EDGE_COND_ON_SUCCESS: "success",
           pb.EDGE_COND_ON_FAILURE: "failure", pb.EDGE_COND_ON_COMPLETE: "complete"}
EDGE_OUT = {"success": pb.EDGE_COND_ON_SUCCESS, "failure": pb.EDGE_COND_ON_FAILURE,
            "complete": pb.EDGE_COND_ON_COMPLETE}
MISS_IN: dict[int, str | None] = {pb.MISS_POLICY_UNSPECIFIED: None, pb.MISS_POLICY_RUN_LATE: "run_late", pb.MISS_POLICY_SKIP: "skip",
                                  pb.MISS_POLICY_FAIL: "fail"}
OVERLAP_IN = {pb.OVERLAP_UNSPECIFIED: "skip", pb.OVERLAP_SKIP: "skip", pb.OVERLAP_ALLOW: "allow",
              pb.OVERLAP_QUEUE: "queue", pb.OVERLAP_QUEUE_ON_SUCCESS: "queue_on_success"}
OVERLAP_OUT = {"skip": pb.OVERLAP_SKIP, "allow": pb.OVERLAP_ALLOW, "queue": pb.OVERLAP_QUEUE,
               "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS}


def status_enum(status: str) -> pb.TaskStatus:
    return pb.TaskStatus.Value("TASK_STATUS_" + status.upper())   # type: ignore[return-value]


def status_name(value: int) -> str:
    return pb.TaskStatus.Name(value)[len("TASK_STATUS_"):].lower()


def _invalid(message: str, kind: str = "InvalidTask") -> ServiceError:
    return ServiceError(Code.INVALID_ARGUMENT, message, kind)


def check_text(value: str, field: str, limit: int) -> None:
    """No NUL, at most ``limit`` bytes of UTF-8."""
    if "\x00" in value:
        raise _invalid(f"{field} must not contain NUL characters")
    if len(value) * 4 > limit and len(value.encode("utf-8", "surrogatepass")) > limit:
        raise _invalid(f"{field} is longer than {limit} bytes (limits)")


def seconds(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise _invalid(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    return value


def task_ref(message: pb.TaskRef, what: str = "task") -> int | str:
    """The id or key a TaskRef names."""
    which = message.WhichOneof("ref")
    if which == "id":
        if message.id == 0:
            raise _invalid(f"{what}: ids start at 1")
        return int(message.id)
    if which == "key":
        if not message.key or "\x00" in message.key:
            raise _invalid(f"{what}: a key must be non-empty and without NUL")
        return message.key
    raise _invalid(f"{what}: give an id or a key")


# ---------------------------------------------------------------- wire task -> options


class _Reading:
    """One wire task being read: what the rules of its fields share."""

    __slots__ = ("reader", "caller", "spec", "options", "template")

    def __init__(self, reader: TaskReader, caller: Principal, spec: pb.TaskSpec, template: bool) -> None:
        self.reader = reader
        self.caller = caller
        self.spec = spec
        self.options: dict[str, Any] = {}
        self.template = template


Rule = Callable[[_Reading, TaskOption, Any], None]


def _name(r: _Reading, opt: TaskOption, value: str) -> None:
    check_text(value, opt.name, r.reader.limits.max_name_bytes)
    if opt.name == "tenant":
        pinned = r.caller.tenant
        if pinned is not None and value != pinned:
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential submits for tenant {pinned!r}, not {value!r}")
    r.options[opt.name] = value


def _key(r: _Reading, opt: TaskOption, value: str) -> None:
    check_text(value, opt.name, r.reader.limits.max_key_bytes)
    r.options[opt.name] = value


def _priority(r: _Reading, opt: TaskOption, value: int) -> None:
    index = PRIORITY_IN.get(value)
    if index is None:
        raise _invalid(f"unknown priority {value}")
    if index != DEFAULT_CLASS:
        r.options["priority"] = CLASSES[index]


def _on_miss(r: _Reading, opt: TaskOption, value: int) -> None:
    miss = MISS_IN.get(value, "?")
    if miss == "?":
        raise _invalid(f"unknown on_miss {value}")
    if miss is not None:
        r.options["on_miss"] = miss


def _one_form(r: _Reading, opt: TaskOption) -> None:
    """At most one form of a time, and none a recurring template may not set."""
    if opt.pair is None:
        return
    relative, absolute = _PAIRS[opt.pair]
    has_rel, has_abs = r.spec.HasField(relative.wire), r.spec.HasField(absolute.wire)
    if has_rel and has_abs:
        raise _invalid(f"give {relative.wire} or {absolute.wire}, not both")
    if r.template and not opt.template:
        raise _invalid(f"a recurring template may not set {opt.wire}: it describes every occurrence")


def _seconds(r: _Reading, opt: TaskOption, value: float) -> None:
    _one_form(r, opt)
    assert opt.wire is not None
    r.options[opt.name] = seconds(value, opt.wire)


def _time(r: _Reading, opt: TaskOption, value: int) -> None:
    _one_form(r, opt)
    r.options[opt.name] = value / NS


def _retry(r: _Reading, opt: TaskOption, value: pb.RetryPolicy) -> None:
    given: dict[str, Any] = {}
    for field in RETRY_FIELDS:
        if field.name == "max_attempts":   # a plain uint32: 0 is unset
            given[field.name] = value.max_attempts or field.default
        else:
            given[field.name] = getattr(value, field.wire) if value.HasField(field.wire) else field.default
    try:
        r.options["retry"] = RetryPolicy(**given)
    except ValueError as exc:
        raise _invalid(f"retry: {exc}") from None


def _units(r: _Reading, opt: TaskOption, value: Any) -> None:
    limits = r.reader.limits
    if len(value) > limits.max_resources:
        raise _invalid(f"at most {limits.max_resources} resources per task (limits)")
    for name in value:
        check_text(name, "resource name", limits.max_name_bytes)
    r.options[opt.name] = dict(value)


def _edges(r: _Reading) -> None:
    """The rules of after and deps together (checked at the first of them)."""
    if r.template:
        raise _invalid("a recurring template may not have dependencies")
    limit = r.reader.limits.max_deps
    if len(r.spec.after) + len(r.spec.deps) > limit:
        raise _invalid(f"at most {limit} dependencies per task (limits)")


def _refs(r: _Reading, opt: TaskOption, value: Any) -> None:
    _edges(r)
    r.options["after"] = [task_ref(ref, "after") for ref in value]


def _deps(r: _Reading, opt: TaskOption, value: Any) -> None:
    if not r.spec.after:
        _edges(r)
    r.options["deps"] = [Dep(task_ref(d.ref, "deps"), EDGE_IN.get(d.cond, "success")) for d in value]


def _pairs(r: _Reading, opt: TaskOption, value: Any) -> None:
    limits = r.reader.limits
    field = opt.name
    limit = limits.max_tags if field == "tags" else limits.max_labels
    if len(value) > limit:
        raise _invalid(f"at most {limit} {field} per task (limits)")
    for name, text in value.items():
        check_text(name, f"{field} name", limits.max_name_bytes)
        check_text(text, f"{field}[{name!r}]", limits.max_value_bytes)
    r.options[field] = dict(value)


def _stages(r: _Reading, opt: TaskOption, value: Any) -> None:
    r.options["stages"] = list(value)   # checked by TaskSpec (InvalidTask names the problem)


_RULES: dict[str, Rule] = {"name": _name, "key": _key, "seconds": _seconds, "time": _time, "retry": _retry,
                           "units": _units, "refs": _refs, "deps": _deps, "pairs": _pairs, "stages": _stages}
_CHOICES: dict[str, Rule] = {"priority": _priority, "on_miss": _on_miss}
# wire field -> (option, rule); the pool is read first, apart (its default, its scope)
_BY_WIRE: dict[str, tuple[TaskOption, Rule]] = {
    opt.wire: (opt, _CHOICES[opt.name] if opt.kind == "choice" else _RULES[opt.kind])
    for opt in TASK_OPTIONS if opt.wire is not None and opt.name != "pool"}
# (wire field, option, rule, whether the field tracks presence), in the message's field order
_FIELDS = tuple((opt.wire, opt, _BY_WIRE[opt.wire][1],
                 pb.TaskSpec.DESCRIPTOR.fields_by_name[opt.wire].has_presence)
                for opt in (OPTIONS[name] for name in WIRE_ORDER) if opt.wire in _BY_WIRE)
_PAIRS: dict[str, tuple[TaskOption, TaskOption]] = {
    pair: (next(o for o in TASK_OPTIONS if o.pair == pair and o.kind == "seconds"),
           next(o for o in TASK_OPTIONS if o.pair == pair and o.kind == "time"))
    for pair in {o.pair for o in TASK_OPTIONS if o.pair is not None}}


class TaskReader:
    """Reads wire tasks into ``cronoq.Task`` options within the [limits]
    and a caller's scope, over the configured pools."""

    def __init__(self, limits: LimitsConfig, pools: Collection[str], default_pool: str) -> None:
        self.limits = limits
        self.pools = pools
        self.default_pool = default_pool

    def options(self, caller: Principal, spec: pb.TaskSpec, *, template: bool = False
                ) -> tuple[Blob, dict[str, Any]]:
        """The payload and ``cronoq.Task`` options of a wire task, checked
        against the caller's scope and tenant and the [limits]."""
        try:
            content_type = check_content_type(spec.content_type) if spec.content_type else OCTETS
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        reading = _Reading(self, caller, spec, template)
        pool = spec.pool or self.default_pool
        check_text(pool, "pool", self.limits.max_name_bytes)
        if pool not in self.pools:
            raise ServiceError(Code.NOT_FOUND, f"no pool named {pool!r}", "UnknownPool")
        if not caller.sees(pool):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not submit into pool {pool!r}")
        if spec.pool and pool != self.default_pool:
            reading.options["pool"] = pool   # (the default pool is the engine's too: a plain task stays plain)
        has = spec.HasField
        for wire, opt, rule, optional in _FIELDS:   # (in field order: the order of the checks)
            if optional:
                if has(wire):
                    rule(reading, opt, getattr(spec, wire))
            else:
                value = getattr(spec, wire)
                if value:   # (proto3: an empty string, a zero enum, an empty list or map is unset)
                    rule(reading, opt, value)
        options = reading.options
        if caller.tenant is not None and "tenant" not in options:
            options["tenant"] = caller.tenant
        return Blob(bytes(spec.payload), content_type), options


def recurring_options(section: RecurringSection) -> dict[str, Any]:
    """``cronoq.Task`` options of a configured schedule's template (its
    fields are named as on the wire)."""
    from .config import RetrySection

    options: dict[str, Any] = {}
    for key, value in section.task.items():
        if isinstance(value, RetrySection):
            value = RetryPolicy(**{f.name: getattr(value, f.wire) for f in RETRY_FIELDS})
        options[_OPTION_OF_WIRE.get(key, key)] = value
    return options


_OPTION_OF_WIRE = {opt.wire: opt.name for opt in TASK_OPTIONS if opt.wire is not None}


# ---------------------------------------------------------------- answers


def checkpoint_message(checkpoint: Checkpoint) -> pb.StageCheckpoint:
    """A checkpoint on the wire: the data and content type the worker sent."""
    out = pb.StageCheckpoint(stage=checkpoint.stage, attempt=checkpoint.attempt,
                             saved_unix_ns=int(round(checkpoint.at * NS)))
    data = checkpoint.data
    if isinstance(data, Blob):
        out.data = data.data
        out.content_type = data.content_type
    return out


def result_message(handle: Any) -> pb.TaskResult:
    """The TaskResult of a finished task's handle."""
    result = pb.TaskResult(id=handle.id)
    try:
        output = handle.result()
    except TaskFailed as exc:
        if exc.status == "shutdown":
            raise ServiceError(Code.UNAVAILABLE, "the server stopped serving while waiting; "
                                                 "wait again (on the new leader)") from None
        result.status = status_enum(exc.status)
        if exc.message:
            result.message = exc.message
        return result
    result.status = pb.TASK_STATUS_SUCCEEDED
    result.output_available = True
    if isinstance(output, Blob):
        result.output = output.data
        result.content_type = output.content_type
    return result


def explanation_message(explanation: Explanation | None, info: Any, meta: TaskMeta | None) -> pb.Explanation:
    """The wire form of the engine's explanation of a task; with none (the
    engine no longer retains the task), its status from ``info`` and no reasons."""
    if explanation is None:
        out = pb.Explanation(id=info.id, status=status_enum(info.status), pool=info.pool,
                             summary=f"It is not waiting: it ended {info.status}.",
                             at_unix_ns=time.time_ns())
        if info.key is not None:
            out.key = info.key
    else:
        out = pb.Explanation(id=explanation.id, status=status_enum(explanation.status), pool=explanation.pool,
                             summary=explanation.summary, queued=explanation.queued,
                             at_unix_ns=round(explanation.at * NS))
        if explanation.priority in CLASSES:
            out.priority = PRIORITY_OUT[CLASSES.index(explanation.priority)]
        if explanation.key is not None:
            out.key = explanation.key
        if explanation.tenant:
            out.tenant = explanation.tenant
        if explanation.score is not None:
            out.score = explanation.score
        if explanation.position is not None:
            out.position = explanation.position
        for reason in explanation.reasons:
            out.reasons.add(code=reason.code, message=reason.message,
                            detail_json=json.dumps(reason.detail, separators=(",", ":"), sort_keys=True))
    if not out.priority and meta is not None:   # (the engine's record of an ended task keeps no class)
        out.priority = PRIORITY_OUT[meta.priority]
    if not out.tenant and getattr(info, "tenant", None):
        out.tenant = info.tenant
    return out


def dep_messages(edges: Iterable[tuple[int | str, str]]) -> list[pb.Dep]:
    """A task's dependencies as submitted ((ref, condition) pairs) as Dep messages."""
    return [pb.Dep(ref=pb.TaskRef(id=ref) if isinstance(ref, int) else pb.TaskRef(key=ref), cond=EDGE_OUT[cond])
            for ref, cond in edges]


def info_message(info: Any, meta: TaskMeta | None, details: bool = False) -> pb.TaskInfo:
    """The TaskInfo of the engine's (or the store's) record of a task, with
    what the leader's info cache remembers of it (``meta``); ``details`` (Get's,
    not a listing's): with the payload preview and the attempts' tracebacks."""
    out = pb.TaskInfo(id=info.id, status=status_enum(info.status), pool=info.pool, kind=info.kind or "",
                      attempt=info.attempt)
    if info.key is not None:
        out.key = info.key
    if info.message:
        out.message = info.message
    record = info if hasattr(info, "has_output") else None
    out.output_available = info.status == "succeeded" and (record is None or record.has_output)
    # The engine's policy while the task lives (it also knows the tasks this
    # server did not submit: schedule occurrences, another process's); else the cache's.
    max_attempts = getattr(info, "max_attempts", None) or (meta.max_attempts if meta is not None else 0)
    if max_attempts:
        out.max_attempts = max_attempts
    if meta is not None:
        out.priority = PRIORITY_OUT[meta.priority]
        out.created_unix_ns = meta.created_ns
        if meta.started_ns is not None:
            out.started_unix_ns = meta.started_ns
        if meta.finished_ns is not None:
            out.finished_unix_ns = meta.finished_ns
        if meta.tenant:
            out.tenant = meta.tenant
        if meta.tags:
            out.tags.update(meta.tags)
        if meta.labels:
            out.labels.update(dict(meta.labels))
        out.deps.extend(dep_messages(meta.edges))
        for number, ended, message, started_ns, ended_ns, traceback, worker_id, worker_name in (
                meta.attempts or ()):
            item = out.attempts.add(attempt=number, message=message, started_unix_ns=started_ns)
            if worker_id is not None:
                item.worker_id = worker_id
                item.worker_name = worker_name
            if ended is not None:
                item.status = status_enum(ended)
            if ended_ns is not None:
                item.ended_unix_ns = ended_ns
            if traceback and details:
                item.traceback = traceback
        if details and meta.payload_preview is not None:
            out.payload_preview = meta.payload_preview
            out.payload_size = meta.payload_size
            out.content_type = meta.payload_type
    elif record is not None:
        out.priority = PRIORITY_OUT[record.priority]
        out.created_unix_ns = record.submitted_ns
        if record.finished_ns is not None:
            out.finished_unix_ns = record.finished_ns
    if not out.tenant and info.tenant:
        out.tenant = info.tenant
    stages = getattr(info, "stages", None)   # (a store's record has neither)
    if stages:
        out.stages.extend(stages)
    for checkpoint in getattr(info, "checkpoints", ()):
        out.checkpoints.append(checkpoint_message(checkpoint))
    return out


def event_message(event: StatusEvent) -> pb.StatusEvent:
    """The StatusEvent message of one of the scheduler's status events."""
    message = pb.StatusEvent(id=event.id, pool=event.pool, status=status_enum(event.status),
                             attempt=event.attempt, at_unix_ns=int(round(event.at * NS)))
    if event.key is not None:
        message.key = event.key
    if event.message:
        message.message = event.message
    if event.stage is not None:
        message.stage = event.stage
    if event.max_attempts is not None:
        message.max_attempts = event.max_attempts
    return message
