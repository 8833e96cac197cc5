"""The JSON fields of the HTTP/JSON gateway: each one parses what a request
sends and describes itself as JSON Schema, so the gateway validates with the
very definitions the OpenAPI document (``openapi.py``) is generated from.

``Field.parse(value, where)`` returns the Python value or raises a
``ServiceError`` (INVALID_ARGUMENT, 400) whose message starts with ``where``,
the path of the field in the request (``tasks[2].retry.max_attempts``).
``Field.schema(out)`` is the JSON Schema of the field in a request
(``out=False``: ids and nanosecond times accepted as strings or numbers) or
in a response (``out=True``: always strings). ``Obj`` refuses unknown fields,
naming them. JSON ``null`` is not a value of any field except a payload.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import math
from typing import Any, Callable, Iterable

from .errors import Code, ServiceError

__all__ = ["Field", "Text", "Seconds", "Number", "Integer", "Flag", "Choice", "BigInt", "Id", "UnixNs", "AnyJson",
           "Base64", "Map", "Array", "Obj", "Ref", "CommaList", "invalid", "describe"]

UINT64 = 2 ** 64 - 1
INT64 = 2 ** 63 - 1


def invalid(where: str, message: str) -> ServiceError:
    return ServiceError(Code.INVALID_ARGUMENT, f"{where}: {message}" if where else message, "InvalidTask")


def describe(value: Any) -> str:
    """A short description of a JSON value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        text = repr(value)
        return "a string " + (text if len(text) <= 40 else text[:37] + "...'")
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Field:
    """A JSON value of a request or a response."""

    def __init__(self, description: str = "") -> None:
        self.description = description

    def parse(self, value: Any, where: str) -> Any:
        raise NotImplementedError

    def _schema(self, out: bool) -> dict[str, Any]:
        raise NotImplementedError

    def query(self, texts: list[str], where: str) -> Any:
        """The value of a query parameter given as ``texts``."""
        if len(texts) != 1:
            raise invalid(where, "is given more than once")
        return self.parse(self.from_text(texts[0], where), where)

    def from_text(self, text: str, where: str) -> Any:
        return text

    def schema(self, out: bool = False) -> dict[str, Any]:
        schema = self._schema(out)
        if self.description and "$ref" not in schema:
            schema["description"] = self.description
        return schema


class Text(Field):
    def __init__(self, description: str = "", *, empty: bool = True, pattern: str | None = None) -> None:
        super().__init__(description)
        self.empty = empty
        self.pattern = pattern

    def parse(self, value: Any, where: str) -> str:
        if type(value) is not str:
            raise invalid(where, f"must be a string, got {describe(value)}")
        if "\x00" in value:
            raise invalid(where, "must not contain NUL characters")
        if not value and not self.empty:
            raise invalid(where, "must not be empty")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid(where, "is not valid Unicode (a lone surrogate)") from None
        return value

    def _schema(self, out: bool) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if not self.empty:
            schema["minLength"] = 1
        if self.pattern:
            schema["pattern"] = self.pattern
        return schema


class Number(Field):
    """A finite JSON number of at least ``minimum``."""

    unit = "a number"

    def __init__(self, description: str = "", *, minimum: float = 0.0) -> None:
        super().__init__(description)
        self.minimum = minimum

    def parse(self, value: Any, where: str) -> float:
        if type(value) not in (int, float):
            raise invalid(where, f"must be {self.unit}, got {describe(value)}")
        if not math.isfinite(value) or value < self.minimum:
            raise invalid(where, f"must be a finite {self.unit[2:]} >= {self.minimum:g}, got {value!r}")
        return float(value)

    def from_text(self, text: str, where: str) -> Any:
        try:
            return float(text)
        except ValueError:
            raise invalid(where, f"must be {self.unit}, got {describe(text)}") from None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "number", "minimum": self.minimum}


class Seconds(Number):
    """A duration: finite seconds, at least 0."""

    unit = "a number of seconds"


class Integer(Field):
    def __init__(self, description: str = "", *, minimum: int = 0, maximum: int = UINT64) -> None:
        super().__init__(description)
        self.minimum = minimum
        self.maximum = maximum

    def parse(self, value: Any, where: str) -> int:
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int:
            raise invalid(where, f"must be an integer, got {describe(value)}")
        if not self.minimum <= value <= self.maximum:
            raise invalid(where, f"must be from {self.minimum} to {self.maximum}, got {value}")
        return value

    def from_text(self, text: str, where: str) -> Any:
        if not (text.isdigit() and text.isascii()) or len(text) > 20:
            raise invalid(where, f"must be an integer, got {describe(text)}")
        return int(text)

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


class Flag(Field):
    def parse(self, value: Any, where: str) -> bool:
        if type(value) is not bool:
            raise invalid(where, f"must be true or false, got {describe(value)}")
        return value

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "boolean"}


class Choice(Field):
    def __init__(self, values: Iterable[str], description: str = "") -> None:
        super().__init__(description)
        self.values = tuple(values)
        self._set = frozenset(self.values)

    def parse(self, value: Any, where: str) -> str:
        if type(value) is not str or value not in self._set:
            raise invalid(where, f"must be one of {', '.join(self.values)}; got {describe(value)}")
        return value

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


class BigInt(Field):
    """A 64-bit integer: a JSON number or a decimal string in requests, a
    string in responses (JavaScript numbers lose precision above 2^53)."""

    def __init__(self, description: str = "", *, minimum: int = 0, maximum: int = UINT64,
                 what: str = "an integer") -> None:
        super().__init__(description)
        self.minimum = minimum
        self.maximum = maximum
        self.what = what

    def parse(self, value: Any, where: str) -> int:
        if type(value) is str:
            text = value
            if not (text.isdigit() and text.isascii()) or len(text) > 20:
                raise invalid(where, f"must be {self.what} (a number or a decimal string), got {describe(value)}")
            value = int(text)
        elif type(value) is not int:
            raise invalid(where, f"must be {self.what} (a number or a decimal string), got {describe(value)}")
        if not self.minimum <= value <= self.maximum:
            raise invalid(where, f"must be from {self.minimum} to {self.maximum}, got {value}")
        return value

    def _schema(self, out: bool) -> dict[str, Any]:
        string = {"type": "string", "pattern": "^[0-9]{1,20}$"}
        if out:
            return string
        return {"oneOf": [string, {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}]}


class Id(BigInt):
    """A task id (from 1)."""

    def __init__(self, description: str = "") -> None:
        super().__init__(description, minimum=1, what="a task id")


class UnixNs(BigInt):
    """A time in Unix nanoseconds (int64, not negative)."""

    def __init__(self, description: str = "") -> None:
        super().__init__(description, maximum=INT64, what="Unix nanoseconds")


class AnyJson(Field):
    def parse(self, value: Any, where: str) -> Any:
        return value

    def _schema(self, out: bool) -> dict[str, Any]:
        return {}


class Base64(Field):
    def parse(self, value: Any, where: str) -> bytes:
        if type(value) is not str:
            raise invalid(where, f"must be a base64 string, got {describe(value)}")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(where, "is not valid base64 (RFC 4648, with padding)") from None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "string", "contentEncoding": "base64"}


class Map(Field):
    """An object of names to ``values``."""

    def __init__(self, values: Field, description: str = "") -> None:
        super().__init__(description)
        self.values = values

    def parse(self, value: Any, where: str) -> dict[str, Any]:
        if type(value) is not dict:
            raise invalid(where, f"must be an object, got {describe(value)}")
        parse = self.values.parse
        out = {}
        for name, item in value.items():
            if "\x00" in name:
                raise invalid(where, "names must not contain NUL characters")
            if not name.isascii():
                _KEY.parse(name, f"{where} (a name)")
            out[name] = parse(item, f"{where}.{name}")
        return out

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.values.schema(out)}


class Array(Field):
    def __init__(self, items: Field, description: str = "") -> None:
        super().__init__(description)
        self.items = items

    def parse(self, value: Any, where: str) -> list[Any]:
        if type(value) is not list:
            raise invalid(where, f"must be an array, got {describe(value)}")
        parse = self.items.parse
        return [parse(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "array", "items": self.items.schema(out)}


class Obj(Field):
    """A JSON object with known fields (unknown ones are refused), named in
    the OpenAPI components. ``check(parsed, where)`` adds rules across fields."""

    def __init__(self, name: str, fields: dict[str, Field], description: str = "", *,
                 required: tuple[str, ...] = (), check: Callable[[dict[str, Any], str], None] | None = None
                 ) -> None:
        super().__init__(description)
        self.name = name
        self.fields = fields
        self.required = required
        self.check = check

    def parse(self, value: Any, where: str) -> dict[str, Any]:
        if type(value) is not dict:
            raise invalid(where, f"must be a JSON object, got {describe(value)}")
        fields = self.fields
        out = {}
        prefix = f"{where}." if where else ""
        for name, item in value.items():
            field = fields.get(name)
            if field is None:
                close = difflib.get_close_matches(name, fields, 1)
                raise invalid(prefix + name, "unknown field" + (f": did you mean {close[0]!r}?" if close else
                                                                 f" (the fields of {self.name}: /v1/openapi.json)"))
            out[name] = field.parse(item, prefix + name)
        for name in self.required:
            if name not in out:
                raise invalid(prefix + name, "is required")
        if self.check is not None:
            self.check(out, where)
        return out

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{self.component(out)}"}

    def component(self, out: bool) -> str:
        return self.name

    def definition(self, out: bool) -> dict[str, Any]:
        """The schema of the object itself (for the components)."""
        schema: dict[str, Any] = {"type": "object"}
        if self.description:
            schema["description"] = self.description
        schema["properties"] = {name: field.schema(out) for name, field in self.fields.items()}
        if self.required:
            schema["required"] = list(self.required)
        schema["additionalProperties"] = False
        return schema

    def objects(self) -> Iterable[Obj]:
        """This object and every object its fields hold."""
        yield self
        for field in self.fields.values():
            yield from _objects_of(field)


def _objects_of(field: Field) -> Iterable[Obj]:
    if isinstance(field, Obj):
        yield from field.objects()
    elif isinstance(field, (Array,)):
        yield from _objects_of(field.items)
    elif isinstance(field, Map):
        yield from _objects_of(field.values)
    elif isinstance(field, Ref):
        yield from field.by.objects()


class Ref(Field):
    """A task named in a dependency: a key (a string), an id (a number), or
    an object ``{"id": ...}`` / ``{"key": ...}``. Parses to ``("id", int)``
    or ``("key", str)``."""

    def __init__(self, description: str = "") -> None:
        super().__init__(description)
        self.by = Obj("TaskRef", {"id": Id("The task's id."), "key": Text("The task's key.", empty=False)},
                      "A task by id or by key (exactly one).", check=_one_ref)

    def parse(self, value: Any, where: str) -> tuple[str, Any]:
        kind = type(value)
        if kind is str:
            return "key", _KEY.parse(value, where)
        if kind is int:
            return "id", _ID.parse(value, where)
        if kind is dict:
            parsed = self.by.parse(value, where)
            return ("id", parsed["id"]) if "id" in parsed else ("key", parsed["key"])
        raise invalid(where, f"must be a key (a string), an id (a number) or an object with id or key, "
                             f"got {describe(value)}")

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"oneOf": [{"type": "string", "minLength": 1, "description": "a key"},
                          {"type": "integer", "minimum": 1, "maximum": UINT64, "description": "an id"},
                          self.by.schema(out)]}


def _one_ref(parsed: dict[str, Any], where: str) -> None:
    if len(parsed) != 1:
        raise invalid(where, "give exactly one of id and key")


_KEY = Text(empty=False)
_ID = Id()


class CommaList(Field):
    """A query parameter holding a list: repeated (``?pool=a&pool=b``) or
    comma-separated (``?pool=a,b``)."""

    def __init__(self, items: Field, description: str = "") -> None:
        super().__init__(description)
        self.items = items

    def query(self, texts: list[str], where: str) -> list[Any]:
        return self.parse(texts, where)

    def parse(self, value: Any, where: str) -> list[Any]:
        out = []
        for text in value:
            for item in text.split(","):
                if item:
                    out.append(self.items.parse(item, where))
        return out

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "array", "items": self.items.schema(out)}


# ---------------------------------------------------------------- the objects of the API


def _statuses() -> tuple[str, ...]:
    from .._proto import cronoq_pb2 as pb
    return tuple(name[len("TASK_STATUS_"):].lower() for name in pb.TaskStatus.keys()
                 if name != "TASK_STATUS_UNSPECIFIED")


STATUSES = _statuses()
TERMINAL_STATUSES = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")
PRIORITIES = ("critical", "high", "normal", "low")
MISS_POLICIES = ("run_late", "skip", "fail")
CONDITIONS = ("on_success", "on_failure", "on_complete")
OVERLAPS = ("skip", "allow", "queue", "queue_on_success")
PAYLOADS = ("payload", "payload_b64", "payload_text")


def _one_payload(parsed: dict[str, Any], where: str) -> None:
    if ("payload" in parsed) + ("payload_b64" in parsed) + ("payload_text" in parsed) < 2:   # (per task: cheap)
        return
    given = [name for name in PAYLOADS if name in parsed]
    if len(given) > 1:
        raise invalid(where, f"give at most one of {', '.join(PAYLOADS)}, not {' and '.join(given)}")


def _dep_ref(parsed: dict[str, Any], where: str) -> None:
    if ("id" in parsed) == ("key" in parsed):
        raise invalid(where, "give exactly one of id and key")


_name = "A name (no NUL, at most limits.max_name_bytes bytes of UTF-8)."

RETRY = Obj("RetryPolicy", {
    "max_attempts": Integer("Attempts in all, the first included (default 3).", minimum=1, maximum=1_000_000),
    "initial_backoff_s": Seconds("Wait before the first retry (default 1)."),
    "multiplier": Number("Each further wait is this many times longer (default 2).", minimum=1.0),
    "max_backoff_s": Seconds("The longest wait (default 60)."),
    "jitter": Flag("Randomize each wait between half and all of it (default true)."),
}, "The retry policy of the task; without it, the pool's.")

DEP = Obj("Dep", {
    "id": Id("The task depended on, by id."),
    "key": Text("The task depended on, by key.", empty=False),
    "cond": Choice(CONDITIONS, "When the dependent may run: after the task succeeded (default), failed, or "
                               "either; otherwise it ends as skipped."),
}, "A dependency with a condition: exactly one of id and key, and cond.", check=_dep_ref)

TASK_FIELDS: dict[str, Field] = {
    "payload": AnyJson("Any JSON value; the worker receives it as application/json (unless content_type "
                       "says otherwise)."),
    "payload_b64": Base64("Binary payload, base64; the worker receives the bytes as application/octet-stream "
                          "(unless content_type says otherwise)."),
    "payload_text": Text("Text payload; the worker receives it as text/plain; charset=utf-8 (unless "
                         "content_type says otherwise)."),
    "content_type": Text("The payload's content type, printable ASCII, at most 255 characters."),
    "pool": Text("The pool (default: the pool named default, else the first)."),
    "kind": Text("A name for the kind of work (default: default). " + _name),
    "priority": Choice(PRIORITIES, "The priority class (default normal)."),
    "key": Text("An idempotency key: submitting it again returns the same task (duplicate: true). At most "
                "limits.max_key_bytes bytes."),
    "tenant": Text("The tenant, for fair share. " + _name),
    "deadline_in_s": Seconds("The deadline, seconds from now."),
    "deadline_unix_ns": UnixNs("The deadline, Unix nanoseconds (not with deadline_in_s)."),
    "start_in_s": Seconds("A fixed start, seconds from now; capacity is reserved for it."),
    "start_unix_ns": UnixNs("A fixed start, Unix nanoseconds (not with start_in_s)."),
    "tolerance_s": Seconds("How late a fixed start may begin (default 1)."),
    "on_miss": Choice(MISS_POLICIES, "What a missed fixed start does (default run_late)."),
    "timeout_s": Seconds("The time limit of each attempt."),
    "duration_hint_s": Seconds("An estimate of the task's duration."),
    "retry": RETRY,
    "resources": Map(Integer(minimum=0, maximum=2 ** 32 - 1),
                     "Units of configured resources held while the task runs."),
    "after": Array(Ref("A task that must succeed first: a key (string), an id (number), or "
                       "{\"id\": \"...\"} / {\"key\": \"...\"}."),
                   "Tasks that must succeed first (keys of tasks in the same batch included)."),
    "deps": Array(DEP, "Dependencies with a condition."),
    "tags": Map(Text(), "Free-form name = value pairs, shown to workers and in listings."),
    "labels": Map(Text(), "Labels the worker must carry (name = value)."),
    "stages": Array(Text("A stage name. " + _name, empty=False),
                    "Its pipeline stages, in order (distinct, at most 64): a worker that accepts checkpoints "
                    "saves one per stage, and a retry sees those of earlier attempts."),
}

TASK = Obj("Task", TASK_FIELDS, "A task to submit. Every field is optional: {} submits an empty payload to "
                                "the default pool. Give at most one of payload, payload_b64 and payload_text, "
                                "and at most one of the relative (_in_s) and absolute (_unix_ns) form of a "
                                "time.", check=_one_payload)

SUBMIT = Obj("SubmitRequest", {
    **TASK_FIELDS,
    "wait": Flag("Answer once the task finished, with its result (default false)."),
    "wait_timeout_s": Seconds("With wait: how long to wait (default and most: limits.max_wait_s); then 504, "
                              "and the task keeps running."),
}, "A task (the fields of Task) and, optionally, whether to wait for its result.", check=_one_payload)

BATCH = Obj("SubmitBatchRequest", {
    "tasks": Array(TASK, "At most limits.max_tasks_per_batch tasks, admitted all together or not at all."),
}, "Tasks submitted atomically.", required=("tasks",))

RESULT = Obj("TaskResult", {
    "id": Id("The task."),
    "status": Choice(TERMINAL_STATUSES, "How it ended."),
    "output_available": Flag("Whether the output is still kept (succeeded tasks only)."),
    "content_type": Text("The output's content type (with the output)."),
    "output": AnyJson("The output as JSON, when its content type is JSON (application/json or +json) "
                      "and it parses."),
    "output_text": Text("The output as text, when its content type is text/* and it is UTF-8."),
    "output_b64": Base64("The output's bytes, base64 (whenever output_available)."),
    "message": Text("Why it failed, was cancelled or skipped."),
}, "The result of a finished task.", required=("id", "status", "output_available"))

SUBMITTED = Obj("Submitted", {
    "id": Id("The task (the existing one when duplicate)."),
    "duplicate": Flag("The key named a task that already existed: nothing new was enqueued."),
}, "A task of a batch, admitted.", required=("id", "duplicate"))

SUBMIT_OUT = Obj("SubmitResponse", {
    **SUBMITTED.fields,
    "result": RESULT,
}, "The task admitted, and its result when the request waited.", required=("id", "duplicate"))

BATCH_OUT = Obj("SubmitBatchResponse", {
    "tasks": Array(SUBMITTED, "In request order."),
}, "The tasks of a batch, admitted.", required=("tasks",))

DEP_OUT = Obj("TaskDependency", {
    "id": Id("The task depended on, by id."),
    "key": Text("The task depended on, by key."),
    "cond": Choice(CONDITIONS, "When the dependent may run."),
}, "A dependency as submitted: an id or a key, and its condition.", required=("cond",))

ATTEMPT = Obj("Attempt", {
    "attempt": Integer("Its number, from 1.", maximum=2 ** 32 - 1),
    "status": Choice(STATUSES, "How it ended (retrying, succeeded, failed...); absent while it runs, or when "
                               "it ended without a status of its own (a lease handed to another worker)."),
    "message": Text("Why it failed, when it did."),
    "started_unix_ns": UnixNs("When it started."),
    "ended_unix_ns": UnixNs("When it ended; absent while it runs."),
}, "One attempt of a task.", required=("attempt", "started_unix_ns"))

STAGE_CHECKPOINT = Obj("StageCheckpoint", {
    "stage": Text("The stage."),
    "content_type": Text("The data's content type."),
    "data": AnyJson("The data as JSON, when its content type is JSON and it parses."),
    "data_text": Text("The data as text, when its content type is text/* and it is UTF-8."),
    "data_b64": Base64("The data's bytes, base64."),
    "attempt": Integer("The attempt that saved it.", maximum=2 ** 32 - 1),
    "saved_unix_ns": UnixNs("When it was saved."),
}, "The checkpoint of one stage.", required=("stage", "data_b64", "attempt", "saved_unix_ns"))

INFO = Obj("TaskInfo", {
    "id": Id("The task."),
    "status": Choice(STATUSES, "Its status now (authoritative)."),
    "pool": Text("Its pool."),
    "key": Text("Its key, if any."),
    "kind": Text("Its kind."),
    "attempt": Integer("The number of the latest attempt (0 before the first).", maximum=2 ** 32 - 1),
    "max_attempts": Integer("Attempts allowed, when known.", maximum=2 ** 32 - 1),
    "priority": Choice(PRIORITIES, "Its priority class, when known."),
    "tenant": Text("Its tenant, if any."),
    "tags": Map(Text(), "Its tags, when known."),
    "output_available": Flag("It succeeded and its output is kept."),
    "message": Text("Why it failed, was cancelled or skipped."),
    "created_unix_ns": UnixNs("When it was submitted, when known."),
    "started_unix_ns": UnixNs("When its latest attempt started, when known."),
    "finished_unix_ns": UnixNs("When it finished, when known."),
    "deps": Array(DEP_OUT, "What it depends on (after and deps), when known."),
    "attempts": Array(ATTEMPT, "Its attempts the leader saw, oldest first (the latest 32)."),
    "stages": Array(Text(), "Its declared stages, in order."),
    "checkpoints": Array(STAGE_CHECKPOINT, "The checkpoints saved so far, in stage order (the task's own "
                                           "lookup only, not listings)."),
}, "A task's state. id and status are authoritative; the other fields are best effort (the leader's "
   "info cache, or the store).", required=("id", "status", "pool", "attempt", "output_available"))

TASKS_OUT = Obj("TaskList", {
    "tasks": Array(INFO, "In id order."),
    "next_after": Id("Present when more tasks follow: pass it as after for the next page."),
}, "A page of tasks.", required=("tasks",))

CANCEL_OUT = Obj("CancelResponse", {
    "cancelled": Flag("False when the task had already finished."),
}, "Whether the task was cancelled.", required=("cancelled",))

REMOVED_OUT = Obj("RemoveRecurringResponse", {
    "removed": Flag("False when no schedule of that name existed."),
}, "Whether the schedule was removed.", required=("removed",))

WORKER = Obj("Worker", {
    "id": Id("Assigned by the server, per connection."),
    "name": Text("What the worker registered as."),
    "pool": Text("The pool it serves."),
    "labels": Map(Text(), "Its labels."),
    "slots": Integer("Slots granted.", maximum=2 ** 32 - 1),
    "busy": Integer("Leases running now.", maximum=2 ** 32 - 1),
    "connected_unix_ns": UnixNs("When it connected."),
    "health": Choice(("healthy", "suspect"), "suspect: a lease expired while it sent no message at all; it gets "
                                             "no new lease until it sends one."),
    "lease_expiries": Integer("Its leases that expired, since it connected."),
    "last_seen_unix_ns": UnixNs("Its last message (its Register at first)."),
}, "A connected remote worker.", required=("id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns",
                                           "health", "lease_expiries", "last_seen_unix_ns"))

WORKERS_OUT = Obj("WorkerList", {"workers": Array(WORKER, "In connection order.")},
                  "Connected workers of the pools the caller may use.", required=("workers",))

SCHEDULE = Obj("Schedule", {
    "name": Text("Its name."),
    "cron": Text("The cron expression."),
    "tz": Text("The IANA zone; absent for UTC."),
    "pool": Text("The pool of its tasks."),
    "kind": Text("The kind of its tasks."),
    "overlap": Choice(OVERLAPS, "What happens when an occurrence is due while the previous one runs."),
    "next_unix_ns": UnixNs("The next occurrence; absent when none is due."),
    "last_task_id": Id("The task of the latest occurrence; absent before the first."),
}, "A recurring schedule.", required=("name", "cron", "pool", "kind", "overlap"))

SCHEDULES_OUT = Obj("ScheduleList", {"schedules": Array(SCHEDULE, "By name.")},
                    "Recurring schedules of the pools the caller may use.", required=("schedules",))

GROUP = Obj("WorkerGroup", {
    "labels": Map(Text(), "The labels its workers carry."),
    "capacity": Integer("Slots of its connected workers.", maximum=2 ** 32 - 1),
    "busy": Integer("Busy slots.", maximum=2 ** 32 - 1),
}, "The workers of a pool that carry the same labels.", required=("labels", "capacity", "busy"))

_POOL_NUMBERS = {
    "capacity": Integer("Slots of its connected workers."),
    "busy": Integer("Slots running an attempt."),
    "held": Integer("Free slots held for fixed starts about to begin."),
    "desired": Integer("The capacity it wants (its capacity, at least its min)."),
    "pending": Integer("Tasks waiting to run."),
    "pending_by_class": Array(Integer(), "Pending tasks by class: critical, high, normal, low."),
    "reservations": Integer("Fixed-start reservations booked."),
    "dispatched": Integer("Attempts started over the metrics window."),
    "succeeded": Integer("Attempts that succeeded over the metrics window."),
    "failed": Integer("Attempts that failed over the metrics window."),
    "priority_adherence": Number("1 - priority inversions / dispatches over the window."),
    "fixed_start_hit_rate": Number("Fixed starts begun within their tolerance / fixed starts judged."),
    "utilization": Number("Busy slot-time / capacity slot-time over the window."),
    "schedule_efficiency": Number("Run time of successful attempts / all run time over the window."),
    "wait_p50_s": Seconds("Median wait from ready to dispatch over the window."),
    "wait_p90_s": Seconds("90th percentile wait."),
    "wait_p99_s": Seconds("99th percentile wait."),
    "cost": Number("Slot-seconds times the cost per slot-second, since start."),
    "workers_connected": Integer("Connected workers."),
}

POOL = Obj("PoolSnapshot", {
    "name": Text("The pool."),
    **_POOL_NUMBERS,
    "groups": Array(GROUP, "One per set of worker labels, unlabeled first."),
}, "A pool's state and its quality over the metrics window.",
    required=("name", *_POOL_NUMBERS, "groups"))

SNAPSHOT = Obj("Snapshot", {
    "pools": Array(POOL, "The pools the caller may use."),
    "live_tasks": Integer("Tasks not yet finished."),
    "running": Integer("Attempts running."),
    "pending": Integer("Tasks waiting to run."),
    "workers_connected": Integer("Connected workers of those pools."),
    "totals": Map(Integer(), "Counts since the leader started: submitted, dispatched, succeeded, failed, "
                             "dead_lettered, cancelled, skipped, missed, shed, retries, timeouts, "
                             "lease_expiries, stale_completions, recurring_conflicts, recurring_invalid."),
    "at_unix_ns": UnixNs("When it was taken."),
    "unavailable_shards": Array(Text(), "Always empty (no shards in this version)."),
}, "The scheduler's state.", required=("pools", "live_tasks", "running", "pending", "workers_connected", "totals",
                                       "at_unix_ns", "unavailable_shards"))

ERROR = Obj("Error", {
    "error": Text("What went wrong, naming the field or the limit."),
    "code": Text("The HTTP reason phrase, lower-case with underscores (not_found, too_many_requests...)."),
}, "Every error's body.", required=("error", "code"))
