"""Value types of the engine: priorities, statuses, task specs and configuration.

Everything here validates on construction, so a bad value raises where it is
written, with the field's name in the message. Durations are given in seconds
(finite, >= 0, at most ``MAX_SECONDS``) and stored as integer nanoseconds;
absolute times accept an aware ``datetime`` (a naive one means UTC) or Unix
seconds within the years a ``datetime`` holds (1 to 9999).
"""

from __future__ import annotations

import datetime as _dt
import enum
import inspect
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import InvalidTask
from .options import (
    CLASSES, CONDITIONS, KEY_LIMIT, MAX_SECONDS, MAX_STAGES, MISS_POLICIES, NAME_LIMIT, OVERFLOW_POLICIES,
    RETRY_DEFAULTS, TASK_OPTIONS, UNKNOWN_DEPENDENCY_POLICIES, VALUE_LIMIT,
)

__all__ = [
    "Priority",
    "Status",
    "Outcome",
    "ID_EPOCH_BITS", "ID_SHARD_BITS", "shard_of", "first_id",
    "CLASSES",
    "BLOCKED",
    "SCHEDULED",
    "READY",
    "RUNNING",
    "RETRYING",
    "SUCCEEDED",
    "FAILED",
    "DEAD_LETTERED",
    "CANCELLED",
    "SKIPPED",
    "MISSED",
    "SHED",
    "SHUTDOWN",
    "TERMINAL",
    "STATUSES",
    "SUCCESS",
    "RETRYABLE",
    "PERMANENT",
    "CANCELLED_OUTCOME",
    "Dep",
    "RetryPolicy",
    "TaskSpec",
    "PriorityConfig",
    "UrgencyConfig",
    "AutoscaleConfig",
    "ResourceConfig",
    "PoolConfig",
    "CoreConfig",
    "NS",
    "MAX_SECONDS",
    "to_ns",
    "time_to_ns",
    "check_name",
    "check_length",
    "KEY_LIMIT",
    "NAME_LIMIT",
    "VALUE_LIMIT",
    "MAX_STAGES",
    "RECURRING_KEY_LIMIT",
]

NS = 1_000_000_000
_MIN_UNIX = -62_135_596_800        # 0001-01-01T00:00:00Z, the earliest datetime
_MAX_UNIX = 253_402_300_799        # 9999-12-31T23:59:59Z, the latest


class Priority(enum.IntEnum):
    """The four classes; a smaller value is more important."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    def __str__(self) -> str:
        return self.name.lower()


_CLASS_BY_NAME = {name: i for i, name in enumerate(CLASSES)}

class Status(enum.StrEnum):
    """A task's status. Members are strings (``Status.READY == "ready"``), so
    events and snapshots need no translation; the engine compares them by
    identity, so a status read from a store must be mapped to its member
    first (``Status(text)``)."""

    BLOCKED = "blocked"
    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    MISSED = "missed"
    SHED = "shed"
    SHUTDOWN = "shutdown"  # handles only: the scheduler stopped first


BLOCKED = Status.BLOCKED
SCHEDULED = Status.SCHEDULED
READY = Status.READY
RUNNING = Status.RUNNING
RETRYING = Status.RETRYING
SUCCEEDED = Status.SUCCEEDED
FAILED = Status.FAILED
DEAD_LETTERED = Status.DEAD_LETTERED
CANCELLED = Status.CANCELLED
SKIPPED = Status.SKIPPED
MISSED = Status.MISSED
SHED = Status.SHED
SHUTDOWN = Status.SHUTDOWN
TERMINAL: frozenset[Status] = frozenset({SUCCEEDED, FAILED, DEAD_LETTERED, CANCELLED, SKIPPED, MISSED, SHED})
STATUSES: tuple[Status, ...] = (BLOCKED, SCHEDULED, READY, RUNNING, RETRYING, SUCCEEDED, FAILED,
                                DEAD_LETTERED, CANCELLED, SKIPPED, MISSED, SHED)


class Outcome(enum.StrEnum):
    """How an attempt ended, as reported to ``Core.complete`` (plain strings work too)."""

    SUCCESS = "success"
    RETRYABLE = "retryable"
    PERMANENT = "permanent"
    CANCELLED = "cancelled"


SUCCESS = Outcome.SUCCESS
RETRYABLE = Outcome.RETRYABLE
PERMANENT = Outcome.PERMANENT
CANCELLED_OUTCOME = Outcome.CANCELLED

ID_EPOCH_BITS = 44   # task ids and leases carry the store's epoch above these bits
ID_SHARD_BITS = 56   # and, with shards, the shard's number (1-255) in the top 8 bits
_SHARD_EPOCHS = (1 << (ID_SHARD_BITS - ID_EPOCH_BITS)) - 1


def shard_of(task_id: int) -> int:
    """The shard number a task id carries (0: an unsharded scheduler's id)."""
    return task_id >> ID_SHARD_BITS


def first_id(shard: int, epoch: int) -> int:
    """The first id (and lease) of a leader of ``shard`` in ``epoch``. With a
    shard, the epoch keeps 12 bits; ids stay increasing across a wrap because
    a recovered leader starts above the highest id its store has seen."""
    if shard:
        return (shard << ID_SHARD_BITS) | ((epoch & _SHARD_EPOCHS) << ID_EPOCH_BITS) | 1
    return (epoch << ID_EPOCH_BITS) + 1

_EDGE_CONDITIONS = CONDITIONS
_MISS_POLICIES = MISS_POLICIES
_OVERFLOW_POLICIES = OVERFLOW_POLICIES
_UNKNOWN_DEP_POLICIES = UNKNOWN_DEPENDENCY_POLICIES


# ---------------------------------------------------------------- validation

def check_name(value: object, field: str, *, error: type[Exception] = InvalidTask) -> str:
    """A non-empty string without NUL characters."""
    if not isinstance(value, str):
        raise error(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise error(f"{field} must not be empty")
    if "\x00" in value:
        raise error(f"{field} must not contain NUL characters")
    return value


# ---------------------------------------------------------------- length limits
# (KEY_LIMIT, NAME_LIMIT, VALUE_LIMIT and MAX_STAGES are declared in options.py.)
# Each occurrence of a recurring schedule gets the key "<key>@YYYY-MM-DDTHH:MM:SSZ".
RECURRING_KEY_LIMIT = KEY_LIMIT - len("@2000-01-01T00:00:00Z")


_LENGTH_CHECKED = (("pool", NAME_LIMIT), ("kind", NAME_LIMIT), ("tenant", NAME_LIMIT), ("key", KEY_LIMIT))


def check_length(value: str, field: str, limit: int, *, error: type[Exception] = InvalidTask) -> str:
    """``value`` if it takes at most ``limit`` bytes in UTF-8."""
    if len(value) * 4 > limit:   # shorter strings fit whatever their characters
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise error(f"{field} is {size} bytes long in UTF-8; the limit is {limit} bytes")
    return value


def _check_lengths(spec: TaskSpec) -> None:
    """The length limits of a task's options (see KEY_LIMIT and friends)."""
    options = spec.__dict__
    for field, limit in _LENGTH_CHECKED:
        value = options.get(field)
        if value is not None and len(value) * 4 > limit:   # (shorter ones always fit)
            check_length(value, field, limit)
    if spec.edges:
        for ref, _ in spec.edges:
            if isinstance(ref, str):
                check_length(ref, "a dependency's key", KEY_LIMIT)
    if spec.resources:
        for name in spec.resources:
            check_length(name, "resource name", NAME_LIMIT)
    if spec.labels:
        for name, value in spec.labels:
            check_length(name, "labels name", NAME_LIMIT)
            check_length(value, f"labels[{name!r}]", VALUE_LIMIT)
    if spec.tags:
        for name, value in spec.tags.items():
            check_length(name, "tags name", NAME_LIMIT)
            check_length(value, f"tags[{name!r}]", VALUE_LIMIT)


def check_stages(stages: object, *, error: type[Exception] = InvalidTask) -> tuple[str, ...]:
    """Declared stages: a non-empty sequence of distinct stage names, in order."""
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence):
        raise error(f"stages must be a list of stage names, got {type(stages).__name__}")
    if not stages:
        raise error("stages must name at least one stage (leave it out for a task without stages)")
    if len(stages) > MAX_STAGES:
        raise error(f"stages names {len(stages)} stages; the limit is {MAX_STAGES}")
    seen: set[str] = set()
    for i, stage in enumerate(stages):
        check_length(check_name(stage, f"stages[{i}]", error=error), f"stages[{i}]", NAME_LIMIT, error=error)
        if stage in seen:
            raise error(f"stages names {stage!r} twice")
        seen.add(stage)
    return tuple(stages)


def _check_text(value: object, field: str, error: type[Exception]) -> str:
    # Like check_name, but the empty string is allowed (tag values).
    if not isinstance(value, str):
        raise error(f"{field} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise error(f"{field} must not contain NUL characters")
    return value


def to_ns(value: object, field: str, *, error: type[Exception] = InvalidTask) -> int:
    """Seconds (finite, >= 0) as integer nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{field} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise error(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    if value > MAX_SECONDS:
        raise error(f"{field} must be at most {MAX_SECONDS} seconds (100 years), got {value!r}")
    if isinstance(value, int):
        return value * NS
    return round(value * NS)


def time_to_ns(value: object, field: str, *, error: type[Exception] = InvalidTask) -> int:
    """An absolute time (datetime, or Unix seconds) as Unix nanoseconds."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
        return (delta.days * 86400 + delta.seconds) * NS + delta.microseconds * 1000
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{field} must be a datetime or Unix seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise error(f"{field} must be finite, got {value!r}")
    if not _MIN_UNIX <= value <= _MAX_UNIX:
        raise error(f"{field} must be a Unix time within the years 1 to 9999 "
                    f"({_MIN_UNIX} to {_MAX_UNIX} seconds), got {value!r}")
    if isinstance(value, int):
        return value * NS
    return round(value * NS)


def _positive_number(value: object, field: str, *, allow_zero: bool = False,
                     error: type[Exception] = ValueError) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{field} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise error(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def _seconds(value: object, field: str, *, allow_zero: bool = False) -> float:
    """A configured duration in seconds: positive (or zero) and at most MAX_SECONDS."""
    value = _positive_number(value, field, allow_zero=allow_zero)
    if value > MAX_SECONDS:
        raise ValueError(f"{field} must be at most {MAX_SECONDS} seconds (100 years), got {value!r}")
    return value


def _int_at_least(value: object, field: str, low: int, error: type[Exception] = ValueError) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{field} must be an integer, got {value!r}")
    if value < low:
        raise error(f"{field} must be >= {low}, got {value}")
    return value


def parse_priority(value: object, field: str = "priority", error: type[Exception] = InvalidTask) -> int:
    """A class index (0 critical .. 3 low) from a Priority or its name."""
    if isinstance(value, Priority):
        return int(value)
    if isinstance(value, str):
        index = _CLASS_BY_NAME.get(value.lower())
        if index is not None:
            return index
    raise error(f"{field} must be a Priority or one of {', '.join(CLASSES)}, got {value!r}")


def _class_table(value: object, field: str, convert: Callable[[Any, str], Any]) -> list[Any]:
    """A per-class table from a 4-sequence or a mapping class name -> value."""
    table: list[Any] = [None, None, None, None]
    if value is None:
        return table
    if isinstance(value, Mapping):
        for name, item in value.items():
            index = parse_priority(name, f"{field} key", ValueError)
            table[index] = None if item is None else convert(item, f"{field}[{CLASSES[index]}]")
        return table
    if isinstance(value, (list, tuple)) and len(value) == 4:
        return [None if item is None else convert(item, f"{field}[{CLASSES[i]}]")
                for i, item in enumerate(value)]
    raise ValueError(f"{field} must be a mapping of class names or a sequence of four values")


# ---------------------------------------------------------------- task options

class Dep:
    """A dependency edge: ``ref`` is a key (str) or an id (int);
    ``on`` is "success" (default), "failure" or "complete"."""

    __slots__ = ("ref", "on")

    def __init__(self, ref: str | int, on: str = "success") -> None:
        if isinstance(ref, bool) or not isinstance(ref, (str, int)):
            raise InvalidTask(f"Dep ref must be a key (str) or a task id (int), got {ref!r}")
        if isinstance(ref, str):
            check_name(ref, "Dep ref")
        elif ref <= 0:
            raise InvalidTask(f"Dep ref must be a positive task id, got {ref}")
        if on not in _EDGE_CONDITIONS:
            raise InvalidTask(f"Dep on must be one of {', '.join(_EDGE_CONDITIONS)}, got {on!r}")
        self.ref = ref
        self.on = on

    def __repr__(self) -> str:
        return f"Dep({self.ref!r}, on={self.on!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dep) and (self.ref, self.on) == (other.ref, other.on)

    def __hash__(self) -> int:
        return hash((self.ref, self.on))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Dep, (self.ref, self.on))


class RetryPolicy:
    """How failed attempts are retried.

    The delay before attempt n (n >= 2) is
    ``min(initial_backoff * multiplier ** (n - 2), max_backoff)``; with jitter,
    a uniformly random fraction of it. ``max_attempts`` counts the first attempt.
    """

    __slots__ = ("max_attempts", "initial_backoff", "multiplier", "max_backoff", "jitter",
                 "_initial_ns", "_max_ns")

    def __init__(self, max_attempts: int = RETRY_DEFAULTS["max_attempts"],
                 initial_backoff: float = RETRY_DEFAULTS["initial_backoff"],
                 multiplier: float = RETRY_DEFAULTS["multiplier"],
                 max_backoff: float = RETRY_DEFAULTS["max_backoff"],
                 jitter: bool = RETRY_DEFAULTS["jitter"]) -> None:
        self.max_attempts = _int_at_least(max_attempts, "max_attempts", 1, InvalidTask)
        self._initial_ns = to_ns(initial_backoff, "initial_backoff")
        self.initial_backoff = initial_backoff
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) \
                or not math.isfinite(multiplier) or multiplier < 1:
            raise InvalidTask(f"multiplier must be a finite number >= 1, got {multiplier!r}")
        self.multiplier = multiplier
        self._max_ns = to_ns(max_backoff, "max_backoff")
        self.max_backoff = max_backoff
        if not isinstance(jitter, bool):
            raise InvalidTask(f"jitter must be a bool, got {jitter!r}")
        self.jitter = jitter

    @classmethod
    def none(cls) -> RetryPolicy:
        """A policy with a single attempt: failures are final."""
        return cls(max_attempts=1)

    def backoff_ns(self, attempt: int) -> int:
        """The delay (before jitter) preceding attempt number ``attempt`` (>= 2)."""
        try:
            delay = self._initial_ns * self.multiplier ** (attempt - 2)
        except OverflowError:   # a float multiplier to a large power: far past the cap
            return self._max_ns
        return int(min(delay, self._max_ns))

    def __repr__(self) -> str:
        return (f"RetryPolicy(max_attempts={self.max_attempts}, initial_backoff={self.initial_backoff}, "
                f"multiplier={self.multiplier}, max_backoff={self.max_backoff}, jitter={self.jitter})")

    def _key(self) -> tuple[Any, ...]:
        return (self.max_attempts, self._initial_ns, self.multiplier, self._max_ns, self.jitter)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryPolicy) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (RetryPolicy, (self.max_attempts, self.initial_backoff, self.multiplier,
                              self.max_backoff, self.jitter))


def _refs(value: object) -> tuple[str | int, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise InvalidTask(f"after must be a key, an id, or a list of them, got {type(value).__name__}")
    return tuple(Dep(ref).ref for ref in value)


def _string_map(value: object, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidTask(f"{field} must be a dict of strings, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        out[check_name(k, f"{field} name")] = _check_text(v, f"{field}[{k!r}]", InvalidTask)
    return out


class TaskSpec:
    """One task to submit: a payload and its scheduling options.

    Exported to users as ``cronoq.Task``. Only the options given are stored on
    the instance; the rest read the class defaults, which keeps plain tasks cheap.
    """

    # Class-level defaults; instances override only what they set.
    pool: str | None = None
    kind: str = "default"
    priority: int = 2
    key: str | None = None
    deadline_in_ns: int | None = None
    deadline_at_ns: int | None = None
    duration_hint_ns: int | None = None
    timeout_ns: int | None = None
    retry: RetryPolicy | None = None
    resources: dict[str, int] | None = None
    edges: tuple[tuple[str | int, str], ...] = ()  # ((ref, condition), ...)
    start_in_ns: int | None = None
    start_at_ns: int | None = None
    tolerance_ns: int | None = None
    on_miss: str = "run_late"
    tenant: str | None = None
    labels: frozenset[tuple[str, str]] | None = None
    tags: dict[str, str] | None = None
    stages: tuple[str, ...] | None = None
    plain = True  # no option beyond pool, kind and priority

    def __init__(self, payload: Any = None, **options: Any) -> None:
        self.payload = payload
        if options:
            # Options are checked by _configure; a task without any (the
            # common case in bulk submissions) costs one attribute.
            unknown = options.keys() - _TASK_OPTIONS
            if unknown:
                raise TypeError(f"unknown task option{'s' if len(unknown) > 1 else ''}: "
                                f"{', '.join(sorted(unknown))}")
            self._configure(**options)

    def _configure(
        self,
        *,
        pool: str | None = None,
        kind: str | None = None,
        priority: Priority | str | None = None,
        key: str | None = None,
        deadline_in: float | None = None,
        deadline_at: object = None,
        duration_hint: float | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        resources: Mapping[str, int] | None = None,
        after: str | int | Sequence[str | int] | None = None,
        deps: Iterable[Dep] | None = None,
        start_in: float | None = None,
        start_at: object = None,
        tolerance: float | None = None,
        on_miss: str | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        stages: Sequence[str] | None = None,
    ) -> None:
        if pool is not None:
            self.pool = check_name(pool, "pool")
        if kind is not None:
            self.kind = check_name(kind, "kind")
        if priority is not None:
            self.priority = parse_priority(priority)
        if key is not None:
            self.key = check_name(key, "key")
        plain = True
        if deadline_in is not None or deadline_at is not None:
            if deadline_in is not None and deadline_at is not None:
                raise InvalidTask("give deadline_in or deadline_at, not both")
            if deadline_in is not None:
                self.deadline_in_ns = to_ns(deadline_in, "deadline_in")
            else:
                self.deadline_at_ns = time_to_ns(deadline_at, "deadline_at")
            plain = False
        if duration_hint is not None:
            self.duration_hint_ns = to_ns(duration_hint, "duration_hint")
            plain = False
        if timeout is not None:
            self.timeout_ns = to_ns(timeout, "timeout")
            if not self.timeout_ns:
                raise InvalidTask("timeout must be > 0 (an attempt with no time can only time out); "
                                  "leave it None for no timeout")
            plain = False
        if retry is not None:
            if not isinstance(retry, RetryPolicy):
                raise InvalidTask(f"retry must be a RetryPolicy, got {type(retry).__name__}")
            self.retry = retry
            plain = False
        if resources:
            if not isinstance(resources, Mapping):
                raise InvalidTask(f"resources must be a dict of name -> units, got {type(resources).__name__}")
            checked = {}
            for name, units in resources.items():
                check_name(name, "resource name")
                if isinstance(units, bool) or not isinstance(units, int) or units < 1:
                    raise InvalidTask(f"resources[{name!r}] must be a positive integer, got {units!r}")
                checked[name] = units
            self.resources = checked
            plain = False
        edges = [(ref, "success") for ref in _refs(after)]
        if deps is not None:
            if isinstance(deps, Dep):
                deps = (deps,)
            for dep in deps:
                if not isinstance(dep, Dep):
                    raise InvalidTask(f"deps must contain Dep objects, got {type(dep).__name__}")
                edges.append((dep.ref, dep.on))
        if edges:
            self.edges = tuple(edges)
            plain = False
        if start_in is not None or start_at is not None:
            if start_in is not None and start_at is not None:
                raise InvalidTask("give start_in or start_at, not both")
            if start_in is not None:
                self.start_in_ns = to_ns(start_in, "start_in")
            else:
                self.start_at_ns = time_to_ns(start_at, "start_at")
            plain = False
        if tolerance is not None:
            self.tolerance_ns = to_ns(tolerance, "tolerance")
            plain = False
        if on_miss is not None:
            if on_miss not in _MISS_POLICIES:
                raise InvalidTask(f"on_miss must be one of {', '.join(_MISS_POLICIES)}, got {on_miss!r}")
            self.on_miss = on_miss
            plain = False
        if tenant is not None:
            self.tenant = check_name(tenant, "tenant")
            plain = False
        if labels:
            self.labels = frozenset(_string_map(labels, "labels").items())
            plain = False
        if tags:
            self.tags = _string_map(tags, "tags")
            plain = False
        if stages is not None:
            self.stages = check_stages(stages)
            plain = False
        if not plain:
            self.plain = False
        _check_lengths(self)

    @property
    def fixed_start(self) -> bool:
        return self.start_at_ns is not None or self.start_in_ns is not None

    def __repr__(self) -> str:
        fields = [repr(self.payload)]
        for name in ("pool", "key"):
            value = getattr(self, name)
            if value is not None:
                fields.append(f"{name}={value!r}")
        if self.kind != "default":
            fields.append(f"kind={self.kind!r}")
        if self.priority != 2:
            fields.append(f"priority={CLASSES[self.priority]!r}")
        if not self.plain:
            fields.append("...")
        return f"Task({', '.join(fields)})"


def _task_signature() -> inspect.Signature:
    configure = inspect.signature(TaskSpec._configure)
    payload = inspect.Parameter("payload", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                annotation="Any")
    params = [p for name, p in configure.parameters.items() if name != "self"]
    return configure.replace(parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                         payload, *params])


# The keyword options, from their declaration rather than from _configure's
# signature: a compiled build (mypyc) keeps no signature to read. A test holds
# the two to each other (tests/test_vocabulary.py).
_TASK_OPTIONS = frozenset(option.name for option in TASK_OPTIONS)
# help() and docs show every option (a compiled class's __init__ takes no
# attributes; its help() shows the generic signature):
try:
    TaskSpec.__init__.__signature__ = _task_signature()   # type: ignore[attr-defined]
except AttributeError:
    pass


# ---------------------------------------------------------------- configuration

class PriorityConfig:
    """Base score, aging rate (points per second) and aging cap per class."""

    __slots__ = ("base", "aging_rate", "age_cap")

    def __init__(self, base: Sequence[float] = (10000, 1000, 100, 10),
                 aging_rate: Sequence[float] = (2.0, 2.0, 2.0, 2.0),
                 age_cap: Sequence[float] = (800, 800, 800, 800)) -> None:
        for field, table in (("base", base), ("aging_rate", aging_rate), ("age_cap", age_cap)):
            if len(table) != 4:
                raise ValueError(f"{field} must have four values (critical, high, normal, low)")
            for value in table:
                _positive_number(value, field, allow_zero=True)
        self.base = tuple(float(v) for v in base)
        self.aging_rate = tuple(float(v) for v in aging_rate)
        self.age_cap = tuple(float(v) for v in age_cap)


class UrgencyConfig:
    """The deadline urgency curve: peak U at the latest start time, a horizon of
    max(d, window), then overdue escalation at ``overdue_rate`` up to ``overdue_cap``."""

    __slots__ = ("peak", "window", "overdue_rate", "overdue_cap")

    def __init__(self, peak: float = 5000.0, window: float = 5.0, overdue_rate: float = 100.0,
                 overdue_cap: float = 3000.0) -> None:
        self.peak = float(_positive_number(peak, "peak", allow_zero=True))
        self.window = float(_seconds(window, "window"))
        self.overdue_rate = float(_positive_number(overdue_rate, "overdue_rate", allow_zero=True))
        self.overdue_cap = float(_positive_number(overdue_cap, "overdue_cap", allow_zero=True))


class AutoscaleConfig:
    """The queue-pressure autoscaling policy of a pool (see the docs for the formula)."""

    __slots__ = ("interval", "target_utilization", "drain_time", "slo", "reservation_horizon",
                 "max_step_up_ratio", "max_step_up_abs", "stabilization_window", "cooldown",
                 "max_step_down", "cost_per_worker_second")

    def __init__(self, *, interval: float = 1.0, target_utilization: float = 0.75,
                 drain_time: float = 30.0, slo: Mapping[str, float] | Sequence[float | None] | None = None,
                 reservation_horizon: float = 60.0, max_step_up_ratio: float = 1.0,
                 max_step_up_abs: int = 4, stabilization_window: float = 60.0,
                 cooldown: float = 30.0, max_step_down: int = 1,
                 cost_per_worker_second: float = 0.0) -> None:
        self.interval = _seconds(interval, "interval")
        target = _positive_number(target_utilization, "target_utilization")
        if target > 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {target}")
        self.target_utilization = target
        self.drain_time = _seconds(drain_time, "drain_time")
        self.slo = tuple(_class_table(slo, "slo", lambda v, f: _seconds(v, f)))
        self.reservation_horizon = _seconds(reservation_horizon, "reservation_horizon", allow_zero=True)
        self.max_step_up_ratio = _positive_number(max_step_up_ratio, "max_step_up_ratio",
                                                  allow_zero=True)
        self.max_step_up_abs = _int_at_least(max_step_up_abs, "max_step_up_abs", 0)
        self.stabilization_window = _seconds(stabilization_window, "stabilization_window", allow_zero=True)
        self.cooldown = _seconds(cooldown, "cooldown", allow_zero=True)
        self.max_step_down = _int_at_least(max_step_down, "max_step_down", 1)
        self.cost_per_worker_second = _positive_number(cost_per_worker_second,
                                                       "cost_per_worker_second", allow_zero=True)


class ResourceConfig:
    """A shared limit: a semaphore of ``permits`` or a token bucket of
    ``rate`` tokens per second holding at most ``burst``."""

    __slots__ = ("name", "kind", "permits", "rate", "burst")

    def __init__(self, name: str, kind: str, *, permits: int | None = None, rate: float | None = None,
                 burst: int | None = None) -> None:
        self.name = check_length(check_name(name, "resource name", error=ValueError), "resource name",
                                 NAME_LIMIT, error=ValueError)
        self.permits: int | None
        self.rate: float | None
        self.burst: int | None
        if kind == "semaphore":
            self.permits = _int_at_least(permits, "permits", 1)
            self.rate = None
            self.burst = None
        elif kind == "token_bucket":
            self.permits = None
            self.rate = float(_positive_number(rate, "rate"))
            if self.rate * MAX_SECONDS < 1:   # one token must come within the longest duration
                raise ValueError(f"rate must be at least one token per {MAX_SECONDS} seconds, got {rate!r}")
            self.burst = _int_at_least(burst, "burst", 1)
        else:
            raise ValueError(f"resource kind must be 'semaphore' or 'token_bucket', got {kind!r}")
        self.kind = kind

    @classmethod
    def semaphore(cls, name: str, permits: int) -> ResourceConfig:
        return cls(name, "semaphore", permits=permits)

    @classmethod
    def token_bucket(cls, name: str, rate: float, burst: int) -> ResourceConfig:
        return cls(name, "token_bucket", rate=rate, burst=burst)

    @property
    def capacity(self) -> int:
        """The most units one task may ever request."""
        units = self.permits if self.kind == "semaphore" else self.burst
        assert units is not None
        return units

    def __repr__(self) -> str:
        if self.kind == "semaphore":
            return f"Resource.semaphore({self.name!r}, {self.permits})"
        return f"Resource.token_bucket({self.name!r}, rate={self.rate}, burst={self.burst})"


class PoolConfig:
    """Scheduling configuration of one pool (the runtime's ``Pool`` adds an executor)."""

    def __init__(self, name: str, *, min: int = 1, max: int = 10, initial: int | None = None,
                 autoscale: AutoscaleConfig | bool | None = None, lease_ttl: float | None = None,
                 max_pending: int | Mapping[str, int] | None = None, overflow: str = "wait",
                 retry: RetryPolicy | None = None, unknown_dependency: str = "reject",
                 await_timeout: float | None = None, default_duration: float = 1.0,
                 reservable_fraction: float = 0.5, tenant_weights: Mapping[str, float] | None = None,
                 fair_share: bool = False, external_capacity: bool = False) -> None:
        self.name = check_length(check_name(name, "pool name", error=ValueError), "pool name", NAME_LIMIT,
                                 error=ValueError)
        self.min = _int_at_least(min, "min", 0)
        self.max = _int_at_least(max, "max", 1)
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if initial is None:
            initial = builtin_min(self.min or 1, self.max)
        self.initial = _int_at_least(initial, "initial", 0)
        if self.initial > self.max:
            raise ValueError(f"initial ({self.initial}) must not exceed max ({self.max})")
        if autoscale is None or autoscale is True:
            autoscale = AutoscaleConfig()
        elif autoscale is not False and not isinstance(autoscale, AutoscaleConfig):
            raise ValueError("autoscale must be an AutoscaleConfig, True, False or None")
        self.autoscale = autoscale or None
        self.lease_ttl_ns = None if lease_ttl is None else to_ns(lease_ttl, "lease_ttl", error=ValueError)
        if self.lease_ttl_ns == 0:
            raise ValueError("lease_ttl must be > 0")
        self.max_pending_total: int | None = None
        self.max_pending_class: list[int | None] = [None, None, None, None]
        if isinstance(max_pending, Mapping):
            self.max_pending_class = _class_table(
                max_pending, "max_pending", lambda v, f: _int_at_least(v, f, 0))
        elif max_pending is not None:
            self.max_pending_total = _int_at_least(max_pending, "max_pending", 0)
        if overflow not in _OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(_OVERFLOW_POLICIES)}, got {overflow!r}")
        self.overflow = overflow
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ValueError("retry must be a RetryPolicy")
        self.retry = retry or RetryPolicy()
        if unknown_dependency not in _UNKNOWN_DEP_POLICIES:
            raise ValueError(f"unknown_dependency must be 'reject' or 'await', got {unknown_dependency!r}")
        self.unknown_dependency = unknown_dependency
        self.await_timeout_ns = None if await_timeout is None else to_ns(
            await_timeout, "await_timeout", error=ValueError)
        self.default_duration_ns = to_ns(default_duration, "default_duration", error=ValueError)
        fraction = _positive_number(reservable_fraction, "reservable_fraction", allow_zero=True)
        if fraction > 1:
            raise ValueError(f"reservable_fraction must be in [0, 1], got {fraction}")
        self.reservable_fraction = fraction
        weights = None
        if tenant_weights is not None:
            if not isinstance(tenant_weights, Mapping):
                raise ValueError("tenant_weights must be a dict of tenant -> weight")
            weights = {check_name(t, "tenant", error=ValueError): float(_positive_number(w, f"tenant_weights[{t!r}]"))
                       for t, w in tenant_weights.items()}
        if not isinstance(fair_share, bool):
            raise ValueError("fair_share must be a bool")
        self.tenant_weights = weights or {}
        self.fair_share = fair_share or weights is not None
        if not isinstance(external_capacity, bool):
            raise ValueError("external_capacity must be a bool")
        # Capacity comes from outside (set_capacity, remote workers): the autoscaler's
        # target is only asked for (desired, SCALE actions), never applied.
        self.external_capacity = external_capacity


builtin_min = min


class CoreConfig:
    """Engine-wide settings; every field has the documented default."""

    def __init__(self, *, priority: PriorityConfig | None = None, urgency: UrgencyConfig | None = None,
                 retention: float = 3600.0, retention_max: int = 1_000_000,
                 metrics_window: float = 60.0, metrics_buckets: int = 12, max_hold: float = 300.0,
                 max_pending_total: int | None = None, emit_transitions: bool = False,
                 persist: bool = False, seed: int = 0, epoch: int = 0, shard: int = 0) -> None:
        self.priority = priority or PriorityConfig()
        self.urgency = urgency or UrgencyConfig()
        self.retention_ns = to_ns(retention, "retention", error=ValueError)
        self.retention_max = _int_at_least(retention_max, "retention_max", 0)
        self.metrics_window_ns = to_ns(metrics_window, "metrics_window", error=ValueError)
        if self.metrics_window_ns == 0:
            raise ValueError("metrics_window must be > 0")
        self.metrics_buckets = _int_at_least(metrics_buckets, "metrics_buckets", 1)
        self.max_hold_ns = to_ns(max_hold, "max_hold", error=ValueError)
        self.max_pending_total = None if max_pending_total is None else _int_at_least(
            max_pending_total, "max_pending_total", 0)
        self.emit_transitions = bool(emit_transitions)
        self.persist = bool(persist)
        self.seed = seed
        self.epoch = _int_at_least(epoch, "epoch", 0)
        self.shard = _int_at_least(shard, "shard", 0)   # its number goes in the top bits of every id
        if self.shard > 255:
            raise ValueError(f"shard must be a number from 0 to 255, got {shard}")
