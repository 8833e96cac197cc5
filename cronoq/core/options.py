"""The task vocabulary, declared once.

Every option of a task is one ``TaskOption`` of ``TASK_OPTIONS``: its name
as a keyword of ``cronoq.Task``, its field in the cronoq.v1 ``TaskSpec``
message (the same name in the HTTP API's JSON and in a ``[[recurring]]``
template), its kind of value, default, bounds and meaning, and its flag on
the command line. Beside them: the lists their values come from (priority
classes, miss policies, dependency conditions), the retry policy's fields
and defaults, and the length limits of names and keys.

What checks or shows a task option derives from here: ``TaskSpec``'s checks
take their lists and limits from this module, the server's wire conversion
and its HTTP schema (and so the OpenAPI document) walk ``TASK_OPTIONS``,
the MCP tools and the command line take their bounds and help from it, and
tests hold the docs' tables to it (``tests/test_vocabulary.py``). Plain
data: this module imports nothing of cronoq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CLASSES", "DEFAULT_CLASS", "MISS_POLICIES", "CONDITIONS", "OVERFLOW_POLICIES",
           "UNKNOWN_DEPENDENCY_POLICIES", "OVERLAP_POLICIES", "KEY_LIMIT", "NAME_LIMIT", "VALUE_LIMIT",
           "MAX_STAGES", "MAX_SECONDS", "RetryField", "RETRY_FIELDS", "RETRY_DEFAULTS", "TaskOption",
           "TASK_OPTIONS", "OPTIONS", "WIRE_ORDER", "option"]

# ---------------------------------------------------------------- the lists values come from

CLASSES = ("critical", "high", "normal", "low")     # priority classes, most important first
DEFAULT_CLASS = 2                                   # normal
MISS_POLICIES = ("run_late", "skip", "fail")        # what a missed fixed start does; the first is the default
CONDITIONS = ("success", "failure", "complete")     # Dep(on=...): on the wire EDGE_COND_ON_<NAME>
OVERFLOW_POLICIES = ("wait", "reject", "shed_lowest", "shed_oldest")
UNKNOWN_DEPENDENCY_POLICIES = ("reject", "await")
OVERLAP_POLICIES = ("skip", "allow", "queue", "queue_on_success")   # recurring schedules; the first is the default

# ---------------------------------------------------------------- limits
# In UTF-8 bytes, which is what database indexes limit: PostgreSQL refuses a
# B-tree entry above about 2.7 kB, and a refused row must never reach a commit.
# The same limits hold with any store, or none, so behaviour never depends on it.

KEY_LIMIT = 1024      # a task's key, a key a dependency names, a recurring schedule's name
NAME_LIMIT = 255      # pool, kind, tenant, resource, label and tag names
VALUE_LIMIT = 1024    # label and tag values
MAX_STAGES = 64       # stages a task may declare (and checkpoints it may keep)
MAX_SECONDS = 100 * 365 * 86_400   # the longest duration accepted (100 years): keeps times in 64 bits


# ---------------------------------------------------------------- the retry policy


@dataclass(frozen=True)
class RetryField:
    """One field of a retry policy: ``name`` is ``RetryPolicy``'s parameter,
    ``wire`` the field of the cronoq.v1 message (and the JSON and TOML key)."""

    name: str
    wire: str
    kind: str              # "count", "seconds", "factor" or "flag"
    default: Any
    minimum: float | None  # inclusive; None for a flag
    maximum: float | None  # None: no bound of its own
    doc: str


RETRY_FIELDS = (
    RetryField("max_attempts", "max_attempts", "count", 3, 1, 1_000_000, "attempts in all, the first included"),
    RetryField("initial_backoff", "initial_backoff_s", "seconds", 1.0, 0.0, None, "the wait before the first retry"),
    RetryField("multiplier", "multiplier", "factor", 2.0, 1.0, None, "each further wait is this many times longer"),
    RetryField("max_backoff", "max_backoff_s", "seconds", 60.0, 0.0, None, "the longest wait"),
    RetryField("jitter", "jitter", "flag", True, None, None,
               "wait a uniformly random fraction of each delay (spreads retries out)"),
)
RETRY_DEFAULTS: dict[str, Any] = {f.name: f.default for f in RETRY_FIELDS}


# ---------------------------------------------------------------- the task options


@dataclass(frozen=True)
class TaskOption:
    """One option of a task.

    ``kind`` is the kind of value: ``name`` (a name, at most ``NAME_LIMIT``
    bytes), ``key`` (at most ``KEY_LIMIT`` bytes), ``choice`` (one of
    ``choices``), ``seconds`` (a duration), ``time`` (an absolute time),
    ``retry``, ``units`` (resource name -> units), ``refs`` (tasks by id or
    key), ``deps`` (dependencies with a condition), ``pairs`` (name ->
    string) or ``stages``. ``wire`` is the field of the cronoq.v1 TaskSpec
    (None: the option has none); ``pair`` names the two forms of one time
    (at most one may be given); ``template``: a recurring template may set
    it. ``cli`` is the flag of ``cronoq submit`` and ``cronoq schedule add``
    (None: none), ``metavar`` the value it takes."""

    name: str
    kind: str
    wire: str | None
    default: str           # as the docs say it
    doc: str               # what it means, one phrase (tables, help, schema descriptions)
    detail: str = ""       # a sentence more, for the schemas that tools and models read
    choices: tuple[str, ...] = ()
    limit: int | None = None
    positive: bool = False  # a duration that must be > 0 (else >= 0)
    pair: str | None = None
    template: bool = True
    cli: str | None = None
    metavar: str | None = None

    @property
    def python_type(self) -> str:
        """Its type as ``cronoq.Task`` takes it (the API reference's column)."""
        return _PYTHON_TYPES.get(self.name) or _PYTHON_TYPES[self.kind]

    @property
    def json_type(self) -> str:
        """Its type in the HTTP API's JSON (docs/server.md's column)."""
        return _JSON_TYPES[self.kind]

    @property
    def wire_type(self) -> str:
        """Its type in the cronoq.v1 TaskSpec message."""
        return _WIRE_TYPES.get(self.name) or _WIRE_TYPES[self.kind]

    def description(self) -> str:
        """A sentence or two: the meaning, then the detail."""
        text = self.doc[0].upper() + self.doc[1:] + "."
        return f"{text} {self.detail}" if self.detail else text


_PYTHON_TYPES = {
    "name": "str", "key": "str", "seconds": "seconds", "time": "time", "retry": "`RetryPolicy`",
    "units": "dict name → units", "refs": "key, id, or a list of them", "deps": "a `Dep` or a list of `Dep`",
    "pairs": "dict str → str", "stages": "list of str",
    "priority": '`Priority` or `"critical"`/`"high"`/`"normal"`/`"low"`',
    "on_miss": '`"run_late"`, `"skip"`, `"fail"`',
}
_JSON_TYPES = {
    "name": "string", "key": "string", "choice": "string", "seconds": "number (seconds)",
    "time": "id-like (Unix ns)", "retry": "object", "units": "object (name → integer)", "refs": "array",
    "deps": "array", "pairs": "object (name → string)", "stages": "array of strings",
}
_WIRE_TYPES = {
    "name": "string", "key": "string", "seconds": "double", "time": "int64 (Unix ns)", "retry": "RetryPolicy",
    "units": "map string → uint32", "refs": "repeated TaskRef", "deps": "repeated Dep",
    "pairs": "map string → string", "stages": "repeated string", "priority": "Priority", "on_miss": "MissPolicy",
}

TASK_OPTIONS: tuple[TaskOption, ...] = (
    TaskOption("pool", "name", "pool", 'the `"default"` pool, else the first', "the pool that runs it",
               detail="The snapshot lists the pools.", cli="--pool"),
    TaskOption("kind", "name", "kind", '`"default"`',
               "the kind of work: groups tasks for metrics and duration learning", cli="--kind"),
    TaskOption("priority", "choice", "priority", "normal", "its priority class",
               detail="Critical runs before high, high before normal, normal before low; waiting tasks age "
                      "upwards within their class.", choices=CLASSES, cli="--priority"),
    TaskOption("key", "key", "key", "None", "an idempotency key and dependency handle",
               detail="Submitting a key that a task holds creates nothing and returns that task "
                      "(duplicate: true), so a submission can be safely repeated.", limit=KEY_LIMIT,
               cli="--key"),
    TaskOption("deadline_in", "seconds", "deadline_in_s", "None", "a soft deadline, seconds from now",
               detail="The task's score rises as it nears, so it starts in time; passing it cancels nothing.",
               pair="deadline", cli="--deadline-in", metavar="SECONDS"),
    TaskOption("deadline_at", "time", "deadline_unix_ns", "None", "a soft deadline, as a time",
               pair="deadline", template=False),
    TaskOption("duration_hint", "seconds", "duration_hint_s", "None",
               "a run-time estimate for deadlines and reservations"),
    TaskOption("timeout", "seconds", "timeout_s", "None", "the time limit of each attempt (> 0)",
               detail="An attempt still running then fails as retryable.", positive=True),
    TaskOption("retry", "retry", "retry", "the pool's", "its retry policy"),
    TaskOption("resources", "units", "resources", "{}",
               "units of configured resources it holds while it runs",
               detail='For example {"gpu": 1}; a task waits until the units are free.'),
    TaskOption("after", "refs", "after", "()", "tasks that must succeed first",
               detail="In a batch, keys of other tasks of the same batch too.", template=False, cli="--after",
               metavar="TASK"),
    TaskOption("deps", "deps", "deps", "()", "dependencies with a condition (success, failure or complete)",
               detail="after is the short form for success.", template=False),
    TaskOption("start_in", "seconds", "start_in_s", "None", "a fixed start, seconds from now",
               detail="A slot is reserved for it; it runs then, not before.", pair="start", template=False),
    TaskOption("start_at", "time", "start_unix_ns", "None", "a fixed start, as a time",
               detail="A slot is reserved for it; it runs then, not before.", pair="start", template=False),
    TaskOption("tolerance", "seconds", "tolerance_s", "1.0", "how late a fixed start may still begin"),
    TaskOption("on_miss", "choice", "on_miss", '`"run_late"`', "what a missed fixed start does",
               choices=MISS_POLICIES),
    TaskOption("tenant", "name", "tenant", "None", "its tenant, for fair share", cli="--tenant"),
    TaskOption("labels", "pairs", "labels", "{}", "labels a worker must carry to run it",
               detail='For example {"gpu": "a100"}.', cli="--label", metavar="NAME=VALUE"),
    TaskOption("tags", "pairs", "tags", "{}", "free-form name = value pairs, given to its executor and shown "
                                              "in listings", cli="--tag", metavar="NAME=VALUE"),
    TaskOption("stages", "stages", "stages", "None",
               f"its pipeline stages, in order (distinct names, at most {MAX_STAGES})",
               detail="Its executor saves a checkpoint per stage, and a retry skips the stages done."),
)
OPTIONS: dict[str, TaskOption] = {o.name: o for o in TASK_OPTIONS}
# The options in the order of their fields in the cronoq.v1 TaskSpec message (the field numbers' order),
# the order the server reads and checks them in.
WIRE_ORDER = ("pool", "kind", "priority", "key", "tenant", "deadline_in", "deadline_at", "start_in", "start_at",
              "tolerance", "on_miss", "timeout", "duration_hint", "retry", "resources", "after", "deps", "tags",
              "labels", "stages")


def option(name: str) -> TaskOption:
    """The option named ``name`` (a ``cronoq.Task`` keyword)."""
    return OPTIONS[name]
