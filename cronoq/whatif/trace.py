"""Traces: what a workload submitted and how its attempts ran, as JSON lines.

A trace is a text file of JSON objects, one a line (docs/whatif.md has the
full format). Times are seconds: instants are counted from the trace's
start ``t0`` (Unix seconds, in the header), durations are plain seconds.

- the header (first line, optional in a hand-written trace):
  ``{"cronoq_trace": 1, "t0": 1767225600.0, "policy": {...}}``;
- a submission: ``{"task": 7, "at": 0.25, "pool": "app", "kind": "click",
  "priority": "high", "deadline": 1.25}`` with any task option (times in
  seconds; ``deadline`` and ``start`` are instants, ``deadline_in`` and
  ``start_in`` are relative to ``at``). ``batch`` groups tasks submitted
  together; ``refused`` marks a submission the live scheduler refused;
- an attempt: ``{"attempt": 7, "n": 1, "start": 0.26, "seconds": 0.031,
  "outcome": "success"}`` (or inline, ``"attempts": [...]`` in the task line,
  or ``"seconds": 0.031`` for one successful attempt);
- the end of a task, as the live scheduler reported it:
  ``{"end": 7, "at": 0.291, "status": "succeeded"}``;
- a cancellation by a user: ``{"cancel": 7, "at": 3.0}`` (an ``end`` line with
  status ``cancelled`` whose last attempt did not end ``cancelled`` is one too).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from typing import IO, Any, Iterable, Iterator, Mapping

from ..core.errors import InvalidTask
from ..core.types import (
    CANCELLED_OUTCOME, CLASSES, KEY_LIMIT, MAX_SECONDS, NS, PERMANENT, RETRYABLE, STATUSES, SUCCESS, Dep,
    RetryPolicy, TaskSpec, check_length, check_name,
)

__all__ = ["TRACE_VERSION", "DEFAULT_T0", "TraceError", "TracedAttempt", "TracedTask", "Trace", "task_line",
           "OUTCOMES", "ABORTED"]

TRACE_VERSION = 1
DEFAULT_T0 = 1_767_225_600.0   # 2026-01-01T00:00:00Z: where a trace without a header starts

ABORTED = "aborted"   # an attempt the scheduler gave up (timeout, cancellation): it reported nothing
OUTCOMES: dict[str, str] = {"success": SUCCESS, "retryable": RETRYABLE, "permanent": PERMANENT,
                            "cancelled": CANCELLED_OUTCOME, ABORTED: ABORTED}
_STATUS_NAMES = frozenset(str(s) for s in STATUSES)

# Fields of a task line besides the task's options.
_BOOKKEEPING = ("task", "at", "batch", "attempts", "seconds", "outcome", "status", "end", "refused")
_OPTIONS = ("pool", "kind", "priority", "key", "deadline", "deadline_in", "start", "start_in", "duration_hint",
            "timeout", "tolerance", "on_miss", "retry", "resources", "deps", "after", "tenant", "labels")
_TASK_FIELDS = frozenset(_BOOKKEEPING + _OPTIONS)
_ATTEMPT_FIELDS = frozenset(("attempt", "n", "start", "seconds", "outcome", "retry_after"))
_INLINE_ATTEMPT_FIELDS = frozenset(("start", "seconds", "outcome", "retry_after"))


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line and the field."""


class TracedAttempt:
    """One recorded attempt: its run time (None when unknown, as in a trace
    built from a store), how it ended, and when it started (seconds from t0)."""

    __slots__ = ("seconds", "outcome", "retry_after", "start")

    def __init__(self, seconds: float | None, outcome: str, retry_after: float | None = None,
                 start: float | None = None) -> None:
        self.seconds = seconds
        self.outcome = outcome
        self.retry_after = retry_after
        self.start = start

    def __repr__(self) -> str:
        return f"TracedAttempt(seconds={self.seconds!r}, outcome={self.outcome!r})"


class TracedTask:
    """One submission of a trace and what became of it live.

    ``at_ns``, ``end_ns`` and ``cancel_ns`` are nanoseconds from the trace's
    start; ``spec`` is the task as the replay submits it (its payload is the
    task's index in the trace; an int dependency names another task's ``id``).
    """

    __slots__ = ("id", "at_ns", "spec", "batch", "attempts", "status", "end_ns", "refused", "cancel_ns")

    def __init__(self, id: int | str, at_ns: int, spec: TaskSpec, batch: object = None,
                 attempts: list[TracedAttempt] | None = None, status: str | None = None,
                 end_ns: int | None = None, refused: str | None = None, cancel_ns: int | None = None) -> None:
        self.id = id
        self.at_ns = at_ns
        self.spec = spec
        self.batch = batch
        self.attempts = attempts
        self.status = status
        self.end_ns = end_ns
        self.refused = refused
        self.cancel_ns = cancel_ns

    @property
    def priority(self) -> str:
        return CLASSES[self.spec.priority]

    def __repr__(self) -> str:
        return f"TracedTask(id={self.id!r}, at={self.at_ns / NS:g}, kind={self.spec.kind!r})"


# ---------------------------------------------------------------- reading

def _seconds(value: object, name: str, where: str, *, allow_negative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{where}: {name} must be a number of seconds, got {value!r}")
    if (value < 0 and not allow_negative) or abs(value) > MAX_SECONDS:
        raise TraceError(f"{where}: {name} must be a number of seconds in [0, {MAX_SECONDS}], got {value!r}")
    return float(value)


def _ns(seconds: float) -> int:
    return round(seconds * NS)


def _ident(value: object, name: str, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TraceError(f"{where}: {name} must be an integer or a string, got {value!r}")
    return value


def _attempt(obj: Mapping[str, Any], where: str) -> TracedAttempt:
    given = obj.get("outcome", "success")
    outcome = OUTCOMES.get(given) if isinstance(given, str) else None
    if outcome is None:
        raise TraceError(f"{where}: outcome must be one of {', '.join(OUTCOMES)}, got {obj.get('outcome')!r}")
    seconds = obj.get("seconds")
    if seconds is not None and (type(seconds) is not float or not 0.0 <= seconds <= MAX_SECONDS):
        seconds = _seconds(seconds, "seconds", where)
    retry_after = obj.get("retry_after")
    start = obj.get("start")
    return TracedAttempt(
        seconds, outcome, None if retry_after is None else _seconds(retry_after, "retry_after", where),
        None if start is None else _seconds(start, "start", where, allow_negative=True))


def _refs(value: object, where: str) -> list[tuple[int | str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    return [(_ident(ref, "after", where), "success") for ref in value]


def _deps(value: object, where: str) -> list[tuple[int | str, str]]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: deps must be a list of [ref, on] pairs, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, Mapping):
            ref, on = item.get("ref"), item.get("on", "success")
        elif isinstance(item, list) and len(item) == 2:
            ref, on = item
        else:
            raise TraceError(f"{where}: each of deps must be [ref, on] or {{\"ref\": ..., \"on\": ...}}, "
                             f"got {item!r}")
        out.append((_ident(ref, "a dependency's ref", where), on))
    return out


def _spec(obj: Mapping[str, Any], index: int, t0_ns: int, at_ns: int, where: str) -> TaskSpec:
    """The task of a submission line (its payload: ``index``)."""
    options: dict[str, Any] = {}
    for name in ("pool", "kind", "key", "tenant", "on_miss", "resources", "labels"):
        value = obj.get(name)
        if value is not None:
            options[name] = value
    priority = obj.get("priority")
    if priority is not None:
        if isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority < 4:
            priority = CLASSES[priority]
        options["priority"] = priority
    for name in ("duration_hint", "timeout", "tolerance"):
        value = obj.get(name)
        if value is not None:
            options[name] = _seconds(value, name, where)
    retry = obj.get("retry")
    if retry is not None:
        try:
            options["retry"] = RetryPolicy(*retry) if isinstance(retry, list) else RetryPolicy(**retry)
        except (TypeError, InvalidTask) as exc:
            raise TraceError(f"{where}: retry: {exc}") from None
    edges = _refs(obj.get("after"), where)
    if "deps" in obj:
        edges += _deps(obj["deps"], where)
    try:
        if edges:
            options["deps"] = [Dep(ref, on) for ref, on in edges]
        spec = TaskSpec(index, **options)
    except (InvalidTask, TypeError) as exc:
        raise TraceError(f"{where}: {exc}") from None
    _times(spec, obj, t0_ns, at_ns, where)
    return spec


def _times(spec: TaskSpec, obj: Mapping[str, Any], t0_ns: int, at_ns: int, where: str) -> None:
    # Instants are set in nanoseconds (as a store's records are): no float rounding.
    for instant, relative, attr in (("deadline", "deadline_in", "deadline_at_ns"),
                                    ("start", "start_in", "start_at_ns")):
        if instant in obj and relative in obj:
            raise TraceError(f"{where}: give {instant} or {relative}, not both")
        if obj.get(instant) is not None:
            setattr(spec, attr, t0_ns + _ns(_seconds(obj[instant], instant, where, allow_negative=True)))
            spec.plain = False
        elif obj.get(relative) is not None:
            setattr(spec, attr, t0_ns + at_ns + _ns(_seconds(obj[relative], relative, where)))
            spec.plain = False


# Options that shape a task apart from its key and times: tasks that share
# them share one validated prototype, copied for each (reading a million-task
# trace would otherwise spend most of its time validating the same options).
_SHAPE = frozenset(("pool", "kind", "priority", "tenant", "on_miss", "duration_hint", "timeout", "tolerance",
                    "retry", "resources", "labels"))
_SHAPES_KEPT = 10_000


class _SpecMaker:
    def __init__(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        self.prototypes: dict[tuple[Any, ...], TaskSpec] = {}

    def make(self, obj: dict[str, Any], index: int, at_ns: int, where: str) -> TaskSpec:
        if "deps" in obj or "after" in obj:
            return _spec(obj, index, self.t0_ns, at_ns, where)
        g = obj.get
        shape: tuple[Any, ...] = (g("pool"), g("kind"), g("priority"), g("tenant"), g("on_miss"),
                                  g("duration_hint"), g("timeout"), g("tolerance"))
        for name in ("retry", "resources", "labels"):
            value = g(name)
            if value is not None:
                shape += (name, repr(value))
        # (True == 1: a bool must not find the prototype of a number; it is refused below.)
        try:
            prototype = None if bool in (type(shape[2]), type(shape[5]), type(shape[6]), type(shape[7])) \
                else self.prototypes.get(shape)
        except TypeError:   # a list or an object where a name belongs: refused below
            prototype = None
            shape = ()
        if prototype is None:
            prototype = _spec({k: v for k, v in obj.items() if k in _SHAPE}, 0, self.t0_ns, 0, where)
            if shape and len(self.prototypes) < _SHAPES_KEPT:
                self.prototypes[shape] = prototype
        spec = TaskSpec.__new__(TaskSpec)
        fields = prototype.__dict__.copy()
        fields["payload"] = index
        spec.__dict__ = fields
        key = obj.get("key")
        if key is not None:
            try:
                fields["key"] = check_length(check_name(key, "key"), "key", KEY_LIMIT)
            except InvalidTask as exc:
                raise TraceError(f"{where}: {exc}") from None
        if "deadline" in obj or "deadline_in" in obj or "start" in obj or "start_in" in obj:
            _times(spec, obj, self.t0_ns, at_ns, where)
        return spec


class Trace:
    """A workload to replay: its submissions in time order (``tasks``), the
    policy it ran with live (``policy``, from the header; None if unknown),
    and per-kind run times to fall back on (``kind_durations``)."""

    def __init__(self, t0_ns: int, tasks: list[TracedTask], *, policy: dict[str, Any] | None = None,
                 kind_durations: dict[str, float] | None = None, meta: dict[str, Any] | None = None) -> None:
        self.t0_ns = t0_ns
        self.tasks = tasks
        self.policy = policy
        self.kind_durations = dict(kind_durations or {})
        self.meta = dict(meta or {})
        # The live pools over time, as the recorder sampled them:
        # (ns from the start, {pool: (capacity, desired, busy, pending)}).
        self.samples: list[tuple[int, dict[str, tuple[int, ...]]]] = []

    def __len__(self) -> int:
        return len(self.tasks)

    def __repr__(self) -> str:
        return f"<Trace of {len(self.tasks)} tasks over {self.span_ns / NS:g} s>"

    @property
    def span_ns(self) -> int:
        """From the start to the last submission."""
        return self.tasks[-1].at_ns if self.tasks else 0

    @property
    def has_live_record(self) -> bool:
        """Whether the trace recorded when attempts started live (then the
        live run's figures can be set beside the replays')."""
        return any(t.attempts and t.attempts[0].start is not None for t in self.tasks)

    # -------------------------------------------------------------- reading

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace file (``TraceError`` names the line of any problem)."""
        name = os.fspath(path)
        try:
            with open(name, encoding="utf-8") as f:
                return cls.from_lines(f, name)
        except OSError as exc:
            raise TraceError(f"cannot read the trace {name!r}: {exc.strerror}") from None

    @classmethod
    def loads(cls, text: str, where: str = "trace") -> Trace:
        return cls.from_lines(text.splitlines(), where)

    @classmethod
    def from_lines(cls, lines: Iterable[str], where: str = "trace") -> Trace:
        t0_ns: int | None = None
        policy: dict[str, Any] | None = None
        kind_durations: dict[str, float] = {}
        meta: dict[str, Any] = {}
        tasks: list[TracedTask] = []
        numbers: list[int] = []
        seen: set[Any] = set()
        maker: _SpecMaker | None = None
        attempts: dict[Any, list[tuple[int, TracedAttempt]]] = defaultdict(list)
        ends: dict[Any, tuple[int, str]] = {}
        cancels: dict[Any, int] = {}
        samples: list[tuple[int, dict[str, tuple[int, ...]]]] = []
        loads = json.loads
        first = True
        for number, line in enumerate(lines, 1):
            if not line or line.isspace():
                continue
            spot = f"{where}:{number}"
            try:
                obj = loads(line)
            except ValueError as exc:
                raise TraceError(f"{spot}: not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{spot}: each line must be a JSON object, got {type(obj).__name__}")
            if first:
                first = False
                if "cronoq_trace" in obj:
                    t0_ns, policy, kind_durations, meta = _header(obj, spot)
                    continue
                t0_ns = _ns(DEFAULT_T0)
            if "task" in obj:
                if maker is None:
                    maker = _SpecMaker(t0_ns if t0_ns is not None else _ns(DEFAULT_T0))
                task = _task(obj, len(tasks), maker, spot)
                if task.id in seen:
                    raise TraceError(f"{spot}: task {task.id!r} appears twice")
                seen.add(task.id)
                tasks.append(task)
                numbers.append(number)
            elif "attempt" in obj:
                unknown = obj.keys() - _ATTEMPT_FIELDS
                if unknown:
                    raise TraceError(f"{spot}: unknown field{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(sorted(unknown))} in an attempt line")
                n = obj.get("n", 1)
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise TraceError(f"{spot}: n (the attempt's number) must be an integer >= 1, got {n!r}")
                attempts[_ident(obj["attempt"], "attempt", spot)].append((n, _attempt(obj, spot)))
            elif "end" in obj:
                status = obj.get("status")
                if not isinstance(status, str) or status not in _STATUS_NAMES:
                    raise TraceError(f"{spot}: status must be one of {', '.join(sorted(_STATUS_NAMES))}, "
                                     f"got {status!r}")
                ends[_ident(obj["end"], "end", spot)] = (
                    _ns(_seconds(obj.get("at"), "at", spot, allow_negative=True)), status)
            elif "cancel" in obj:
                cancels[_ident(obj["cancel"], "cancel", spot)] = _ns(
                    _seconds(obj.get("at"), "at", spot, allow_negative=True))
            elif "sample" in obj:
                pools = obj.get("pools")
                if not isinstance(pools, dict) or not all(
                        isinstance(v, list) and len(v) == 4 for v in pools.values()):
                    raise TraceError(f"{spot}: a sample's pools must map each pool to "
                                     f"[capacity, desired, busy, pending]")
                samples.append((_ns(_seconds(obj["sample"], "sample", spot, allow_negative=True)),
                                {k: tuple(v) for k, v in pools.items()}))
            elif "end_of_trace" in obj:
                meta.update({k: v for k, v in obj.items() if k != "end_of_trace"})
            else:
                raise TraceError(f"{spot}: a line is a header, or has one of the fields task, attempt, "
                                 f"end, cancel, end_of_trace")
        if t0_ns is None:
            t0_ns = _ns(DEFAULT_T0)
        if any(tasks[i].at_ns > tasks[i + 1].at_ns for i in range(len(tasks) - 1)):
            # Time order (stable: a batch's tasks keep theirs); the index is the task's payload.
            order = sorted(range(len(tasks)), key=lambda i: (tasks[i].at_ns, numbers[i]))
            tasks = [tasks[i] for i in order]
            for index, task in enumerate(tasks):
                task.spec.payload = index
        _attach(tasks, attempts, ends, cancels)
        orphans = sum(len(v) for v in attempts.values())   # (what _attach left: no such task)
        if orphans:
            meta["attempts_of_unknown_tasks"] = orphans
        trace = cls(t0_ns, tasks, policy=policy, kind_durations=kind_durations, meta=meta)
        trace.samples = samples
        return trace

    # -------------------------------------------------------------- writing

    def header(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cronoq_trace": TRACE_VERSION, "t0": self.t0_ns / NS}
        if self.policy is not None:
            out["policy"] = self.policy
        if self.kind_durations:
            out["kind_durations"] = self.kind_durations
        for key, value in self.meta.items():
            out.setdefault(key, value)
        return out

    def lines(self) -> Iterator[str]:
        """The trace as JSON lines (the header first)."""
        dumps = json.dumps
        yield dumps(self.header())
        t0 = self.t0_ns
        for task in self.tasks:
            line = task_line(task.id, task.at_ns, task.spec, t0, task.batch)
            if task.refused is not None:
                line["refused"] = task.refused
            if task.attempts:
                line["attempts"] = [_attempt_dict(a) for a in task.attempts]
            if task.status is not None and task.end_ns is not None:
                line["status"] = task.status
                line["end"] = task.end_ns / NS
            yield dumps(line, separators=(",", ":"))
            if task.cancel_ns is not None and not (task.status == "cancelled" and task.end_ns == task.cancel_ns):
                yield dumps({"cancel": task.id, "at": task.cancel_ns / NS})
        for at, pools in self.samples:
            yield dumps({"sample": at / NS, "pools": {k: list(v) for k, v in pools.items()}},
                        separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            self.write(f)

    def write(self, f: IO[str]) -> None:
        for line in self.lines():
            f.write(line)
            f.write("\n")


def _attempt_dict(a: TracedAttempt) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if a.start is not None:
        out["start"] = a.start
    if a.seconds is not None:
        out["seconds"] = a.seconds
    out["outcome"] = str(a.outcome)
    if a.retry_after is not None:
        out["retry_after"] = a.retry_after
    return out


def _header(obj: Mapping[str, Any], spot: str) -> tuple[int, dict[str, Any] | None, dict[str, float], dict[str, Any]]:
    version = obj["cronoq_trace"]
    if version != TRACE_VERSION:
        raise TraceError(f"{spot}: this cronoq reads trace version {TRACE_VERSION}, not {version!r}")
    t0 = obj.get("t0", DEFAULT_T0)
    if isinstance(t0, bool) or not isinstance(t0, (int, float)) or not math.isfinite(t0):
        raise TraceError(f"{spot}: t0 must be Unix seconds, got {t0!r}")
    policy = obj.get("policy")
    if policy is not None and not isinstance(policy, dict):
        raise TraceError(f"{spot}: policy must be an object, got {type(policy).__name__}")
    kinds = obj.get("kind_durations") or {}
    if not isinstance(kinds, dict):
        raise TraceError(f"{spot}: kind_durations must be an object of kind -> seconds")
    durations = {str(k): _seconds(v, f"kind_durations[{k!r}]", spot) for k, v in kinds.items()}
    meta = {k: v for k, v in obj.items() if k not in ("cronoq_trace", "t0", "policy", "kind_durations")}
    return _ns(float(t0)), policy, durations, meta


def _task(obj: dict[str, Any], index: int, maker: _SpecMaker, spot: str) -> TracedTask:
    """A task line as a task (what other lines say of it is attached later)."""
    if not obj.keys() <= _TASK_FIELDS:
        unknown = obj.keys() - _TASK_FIELDS
        raise TraceError(f"{spot}: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(sorted(unknown))} in a task line")
    task_id = obj["task"]
    if type(task_id) is not int and type(task_id) is not str:
        _ident(task_id, "task", spot)
    at_ns = _ns(_at_of(obj, spot))
    spec = maker.make(obj, index, at_ns, spot)
    runs: list[TracedAttempt] | None = None
    if "attempts" in obj:
        inline = obj["attempts"]
        if not isinstance(inline, list):
            raise TraceError(f"{spot}: attempts must be a list")
        runs = []
        for item in inline:
            if not isinstance(item, dict) or not item.keys() <= _INLINE_ATTEMPT_FIELDS:
                raise TraceError(f"{spot}: each attempt is an object with seconds, outcome, retry_after "
                                 f"and start, got {item!r}")
            runs.append(_attempt(item, spot))
    elif "seconds" in obj:
        runs = [_attempt({"seconds": obj["seconds"], "outcome": obj.get("outcome", "success")}, spot)]
    elif "outcome" in obj:
        raise TraceError(f"{spot}: outcome without seconds (write attempts, or seconds and outcome)")
    status, end_ns = obj.get("status"), None
    if status is not None:
        if not isinstance(status, str) or status not in _STATUS_NAMES:
            raise TraceError(f"{spot}: status must be one of {', '.join(sorted(_STATUS_NAMES))}, got {status!r}")
        if obj.get("end") is None:
            raise TraceError(f"{spot}: a status needs the time it was reached: end")
        end_ns = _ns(_seconds(obj["end"], "end", spot, allow_negative=True))
    refused = obj.get("refused")
    if refused is not None and not isinstance(refused, str):
        raise TraceError(f"{spot}: refused must be the error's text, got {refused!r}")
    return TracedTask(task_id, at_ns, spec, obj.get("batch"), runs, status, end_ns, refused)


def _attach(tasks: list[TracedTask], attempts: dict[Any, list[tuple[int, TracedAttempt]]],
            ends: dict[Any, tuple[int, str]], cancels: dict[Any, int]) -> None:
    """Give each task its attempt, end and cancel lines (taken out of the dicts)."""
    for task in tasks:
        task_id = task.id
        if attempts:
            listed = attempts.pop(task_id, None)
            if listed:
                listed.sort(key=lambda item: item[0])
                task.attempts = (task.attempts or []) + [a for _, a in listed]
        if ends:
            ended = ends.pop(task_id, None)
            if ended is not None:
                task.end_ns, task.status = ended
        if cancels:
            task.cancel_ns = cancels.pop(task_id, None)
        runs = task.attempts
        if task.cancel_ns is None and task.status == "cancelled" and task.end_ns is not None and (
                not runs or runs[-1].outcome != CANCELLED_OUTCOME):
            task.cancel_ns = task.end_ns   # not the executor's doing: somebody cancelled it


def _at_of(obj: Mapping[str, Any], spot: str) -> float:
    return _seconds(obj.get("at"), "at", spot, allow_negative=True)


# ---------------------------------------------------------------- writing a submission

def task_line(task_id: int | str, at_ns: int, spec: TaskSpec, t0_ns: int, batch: object = None) -> dict[str, Any]:
    """The trace line of a submission at ``at_ns`` (from the trace's start)
    of ``spec``: its options without payload or tags."""
    line: dict[str, Any] = {"task": task_id, "at": at_ns / NS}
    if batch is not None:
        line["batch"] = batch
    if spec.pool is not None:
        line["pool"] = spec.pool
    if spec.kind != "default":
        line["kind"] = spec.kind
    line["priority"] = CLASSES[spec.priority]
    if spec.key is not None:
        line["key"] = spec.key
    if spec.plain:
        return line
    submitted = t0_ns + at_ns
    deadline = spec.deadline_at_ns
    if deadline is None and spec.deadline_in_ns is not None:
        deadline = submitted + spec.deadline_in_ns
    if deadline is not None:
        line["deadline"] = (deadline - t0_ns) / NS
    start = spec.start_at_ns
    if start is None and spec.start_in_ns is not None:
        start = submitted + spec.start_in_ns
    if start is not None:
        line["start"] = (start - t0_ns) / NS
    for name, attr in (("duration_hint", "duration_hint_ns"), ("timeout", "timeout_ns"),
                       ("tolerance", "tolerance_ns")):
        value = getattr(spec, attr)
        if value is not None:
            line[name] = value / NS
    if spec.on_miss != "run_late":
        line["on_miss"] = spec.on_miss
    if spec.retry is not None:
        r = spec.retry
        line["retry"] = {"max_attempts": r.max_attempts, "initial_backoff": r.initial_backoff,
                         "multiplier": r.multiplier, "max_backoff": r.max_backoff, "jitter": r.jitter}
    if spec.resources:
        line["resources"] = dict(spec.resources)
    if spec.edges:
        line["deps"] = [[ref, on] for ref, on in spec.edges]
    if spec.tenant is not None:
        line["tenant"] = spec.tenant
    if spec.labels:
        line["labels"] = dict(spec.labels)
    return line
