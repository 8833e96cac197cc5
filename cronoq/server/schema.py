"""The JSON fields of the HTTP/JSON gateway, and its request bodies.

Each ``Field`` says three things about one JSON value: ``spec()``, the type
msgspec validates it with (the fast path: ``bodies.py`` decodes and checks
a request in C), ``problem(value, where)``, what is wrong with a value that
msgspec or the conversion refused (the error users see, which starts with
``where``, the path of the field in the request: ``tasks[2].retry.
max_attempts``), and ``schema(out)``, its JSON Schema in a request
(``out=False``: ids and nanosecond times accepted as strings or numbers) or
in a response (``out=True``: always strings), from which ``openapi.py``
builds the document. ``Obj`` refuses unknown fields, naming them. JSON
``null`` is not a value of any field except a payload.

The task object's fields are derived from the task vocabulary
(``cronoq.core.options``), in the order of the cronoq.v1 TaskSpec's fields.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import math
from typing import Annotated, Any, Callable, Iterable, Literal, Union

import msgspec

from ..core.options import CLASSES, CONDITIONS, OPTIONS, RETRY_FIELDS, TASK_OPTIONS, WIRE_ORDER, TaskOption
from .errors import Code, ServiceError

__all__ = ["Field", "Text", "Seconds", "Number", "Integer", "Flag", "Choice", "BigInt", "Id", "UnixNs", "AnyJson",
           "Base64", "Map", "Array", "Obj", "Ref", "CommaList", "invalid", "describe", "PRIORITIES",
           "CONDITION_NAMES", "PAYLOADS", "RETRY", "DEP", "TASK_FIELDS", "TASK", "SUBMIT", "BATCH",
           "BULK_MAX", "BULK_CANCEL", "BULK_RESUBMIT"]

UINT64 = 2 ** 64 - 1
INT64 = 2 ** 63 - 1
_UNSET = msgspec.UNSET


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

    def spec(self) -> Any:
        """The type msgspec checks the value with: it accepts every value
        ``problem`` accepts, and at most the few more that ``convert``
        refuses (see bodies.py)."""
        raise NotImplementedError

    def problem(self, value: Any, where: str) -> ServiceError | None:
        """What is wrong with ``value`` (the first thing, in document order), or None."""
        raise NotImplementedError

    def convert(self, value: Any) -> Any:
        """The value the gateway uses for a JSON value msgspec accepted
        (``Refused`` if it is one of those ``problem`` refuses)."""
        return value

    @property
    def converts(self) -> bool:
        """Whether ``convert`` does anything (else it is skipped)."""
        return type(self).convert is not Field.convert

    def parse(self, value: Any, where: str) -> Any:
        """``value`` checked and converted (query parameters, path segments)."""
        error = self.problem(value, where)
        if error is not None:
            raise error
        return self.convert(value)

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


class Refused(Exception):
    """A value msgspec accepted that a field's own rule refuses: the caller
    asks ``problem`` for the message."""


class Text(Field):
    def __init__(self, description: str = "", *, empty: bool = True) -> None:
        super().__init__(description)
        self.empty = empty

    def spec(self) -> Any:
        return str if self.empty else Annotated[str, msgspec.Meta(min_length=1)]

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not str:
            return invalid(where, f"must be a string, got {describe(value)}")
        if "\x00" in value:
            return invalid(where, "must not contain NUL characters")
        if not value and not self.empty:
            return invalid(where, "must not be empty")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return invalid(where, "is not valid Unicode (a lone surrogate)")
        return None

    def _schema(self, out: bool) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if not self.empty:
            schema["minLength"] = 1
        return schema


class Number(Field):
    """A finite JSON number of at least ``minimum``."""

    unit = "a number"

    def __init__(self, description: str = "", *, minimum: float = 0.0) -> None:
        super().__init__(description)
        self.minimum = minimum

    def spec(self) -> Any:
        return Annotated[float, msgspec.Meta(ge=self.minimum)]   # (1e999 decodes to no float: refused)

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) not in (int, float):
            return invalid(where, f"must be {self.unit}, got {describe(value)}")
        if not math.isfinite(value) or value < self.minimum:
            return invalid(where, f"must be a finite {self.unit[2:]} >= {self.minimum:g}, got {value!r}")
        return None

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
    """An integer from ``minimum`` to ``maximum`` (an integral JSON number such as 2.0 is one too)."""

    def __init__(self, description: str = "", *, minimum: int = 0, maximum: int = UINT64) -> None:
        super().__init__(description)
        self.minimum = minimum
        self.maximum = maximum

    def spec(self) -> Any:
        # A float, so that 2.0 passes as JSON Schema's integers do; convert refuses 2.5.
        return Annotated[float, msgspec.Meta(ge=self.minimum, le=self.maximum)]

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int:
            return invalid(where, f"must be an integer, got {describe(value)}")
        if not self.minimum <= value <= self.maximum:
            return invalid(where, f"must be from {self.minimum} to {self.maximum}, got {value}")
        return None

    def convert(self, value: Any) -> int:
        if type(value) is float:
            if not value.is_integer():
                raise Refused
            value = int(value)
        if not self.minimum <= value <= self.maximum:   # (a float bound rounds: 2**64 passes it)
            raise Refused
        return int(value)

    def from_text(self, text: str, where: str) -> Any:
        if not (text.isdigit() and text.isascii()) or len(text) > 20:
            raise invalid(where, f"must be an integer, got {describe(text)}")
        return int(text)

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


class Flag(Field):
    def spec(self) -> Any:
        return bool

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not bool:
            return invalid(where, f"must be true or false, got {describe(value)}")
        return None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "boolean"}


class Choice(Field):
    def __init__(self, values: Iterable[str], description: str = "") -> None:
        super().__init__(description)
        self.values = tuple(values)
        self._set = frozenset(self.values)

    def spec(self) -> Any:
        return Literal[self.values]   # (a tuple subscript: Literal["a", "b", ...])

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not str or value not in self._set:
            return invalid(where, f"must be one of {', '.join(self.values)}; got {describe(value)}")
        return None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


_DIGITS = "^[0-9]{1,20}$"


class BigInt(Field):
    """A 64-bit integer: a JSON number or a decimal string in requests, a
    string in responses (JavaScript numbers lose precision above 2^53)."""

    def __init__(self, description: str = "", *, minimum: int = 0, maximum: int = UINT64,
                 what: str = "an integer") -> None:
        super().__init__(description)
        self.minimum = minimum
        self.maximum = maximum
        self.what = what

    def spec(self) -> Any:
        # msgspec bounds integers within int64 only: convert checks the rest.
        number = msgspec.Meta(ge=self.minimum, le=self.maximum) if self.maximum <= INT64 else \
            msgspec.Meta(ge=self.minimum)
        return Union[Annotated[int, number], Annotated[str, msgspec.Meta(pattern=_DIGITS)]]

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is str:
            text = value
            if not (text.isdigit() and text.isascii()) or len(text) > 20:
                return invalid(where, f"must be {self.what} (a number or a decimal string), got {describe(value)}")
            value = int(text)
        elif type(value) is not int:
            return invalid(where, f"must be {self.what} (a number or a decimal string), got {describe(value)}")
        if not self.minimum <= value <= self.maximum:
            return invalid(where, f"must be from {self.minimum} to {self.maximum}, got {value}")
        return None

    def convert(self, value: Any) -> int:
        number = int(value)
        if not self.minimum <= number <= self.maximum:
            raise Refused
        return number

    def _schema(self, out: bool) -> dict[str, Any]:
        string = {"type": "string", "pattern": _DIGITS}
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
    def spec(self) -> Any:
        return Any

    def problem(self, value: Any, where: str) -> ServiceError | None:
        return None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {}


class Base64(Field):
    def spec(self) -> Any:
        return str   # (decoded by convert, as b64decode(validate=True) decides)

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not str:
            return invalid(where, f"must be a base64 string, got {describe(value)}")
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return invalid(where, "is not valid base64 (RFC 4648, with padding)")
        return None

    def convert(self, value: Any) -> bytes:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Refused from None

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "string", "contentEncoding": "base64"}


class Map(Field):
    """An object of names to ``values``."""

    def __init__(self, values: Field, description: str = "") -> None:
        super().__init__(description)
        self.values = values

    def spec(self) -> Any:
        return dict[str, self.values.spec()]   # type: ignore[misc]

    @property
    def converts(self) -> bool:
        return self.values.converts

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not dict:
            return invalid(where, f"must be an object, got {describe(value)}")
        problem = self.values.problem
        for name, item in value.items():
            if "\x00" in name:
                return invalid(where, "names must not contain NUL characters")
            if not name.isascii():
                error = _KEY.problem(name, f"{where} (a name)")
                if error is not None:
                    return error
            error = problem(item, f"{where}.{name}")
            if error is not None:
                return error
        return None

    def convert(self, value: Any) -> dict[str, Any]:
        if not self.values.converts:
            return value   # type: ignore[no-any-return]
        convert = self.values.convert
        return {name: convert(item) for name, item in value.items()}

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.values.schema(out)}


class Array(Field):
    def __init__(self, items: Field, description: str = "") -> None:
        super().__init__(description)
        self.items = items

    def spec(self) -> Any:
        return list[self.items.spec()]   # type: ignore[misc]

    @property
    def converts(self) -> bool:
        return self.items.converts

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not list:
            return invalid(where, f"must be an array, got {describe(value)}")
        problem = self.items.problem
        for i, item in enumerate(value):
            error = problem(item, f"{where}[{i}]")
            if error is not None:
                return error
        return None

    def convert(self, value: Any) -> list[Any]:
        if not self.items.converts:
            return value   # type: ignore[no-any-return]
        convert = self.items.convert
        return [convert(item) for item in value]

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "array", "items": self.items.schema(out)}


Check = Callable[[dict[str, Any], str], "ServiceError | None"]


class Obj(Field):
    """A JSON object with known fields (unknown ones are refused), named in
    the OpenAPI components. ``check(parsed, where)`` adds rules across fields."""

    def __init__(self, name: str, fields: dict[str, Field], description: str = "", *,
                 required: tuple[str, ...] = (), check: Check | None = None) -> None:
        super().__init__(description)
        self.name = name
        self.fields = fields
        self.required = required
        self.check = check
        self._spec: Any = None
        self._converted = tuple(name for name, field in fields.items() if field.converts)

    def spec(self) -> Any:
        if self._spec is None:
            fields = [(name, field.spec()) if name in self.required else (name, field.spec(), _UNSET)
                      for name, field in self.fields.items()]
            fields.sort(key=lambda item: len(item) == 3)   # (required fields first, as msgspec wants)
            self._spec = msgspec.defstruct(self.name, fields, forbid_unknown_fields=True, gc=False)
        return self._spec

    def problem(self, value: Any, where: str) -> ServiceError | None:
        if type(value) is not dict:
            return invalid(where, f"must be a JSON object, got {describe(value)}")
        fields = self.fields
        prefix = f"{where}." if where else ""
        for name, item in value.items():
            field = fields.get(name)
            if field is None:
                close = difflib.get_close_matches(name, fields, 1)
                return invalid(prefix + name, "unknown field" + (f": did you mean {close[0]!r}?" if close else
                                                                  f" (the fields of {self.name}: /v1/openapi.json)"))
            error = field.problem(item, prefix + name)
            if error is not None:
                return error
        for name in self.required:
            if name not in value:
                return invalid(prefix + name, "is required")
        return None if self.check is None else self.check(value, where)

    @property
    def converts(self) -> bool:
        return True

    def convert(self, value: Any) -> dict[str, Any]:
        """``value`` (an object msgspec accepted), its fields converted in place."""
        if self.check is not None and self.check(value, "") is not None:
            raise Refused
        fields = self.fields
        for name in self._converted:
            if name in value:
                value[name] = fields[name].convert(value[name])
        return value   # type: ignore[no-any-return]

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
    an object ``{"id": ...}`` / ``{"key": ...}``. Converts to ``("id", int)``
    or ``("key", str)``."""

    def __init__(self, description: str = "") -> None:
        super().__init__(description)
        self.by = Obj("TaskRef", {"id": Id("The task's id."), "key": Text("The task's key.", empty=False)},
                      "A task by id or by key (exactly one).", check=_one_ref)

    def spec(self) -> Any:
        return Union[Annotated[str, msgspec.Meta(min_length=1)], Annotated[int, msgspec.Meta(ge=1)],
                     self.by.spec()]

    def problem(self, value: Any, where: str) -> ServiceError | None:
        kind = type(value)
        if kind is str:
            return _KEY.problem(value, where)
        if kind is int:
            return _ID.problem(value, where)
        if kind is dict:
            return self.by.problem(value, where)
        return invalid(where, f"must be a key (a string), an id (a number) or an object with id or key, "
                              f"got {describe(value)}")

    def convert(self, value: Any) -> tuple[str, Any]:
        kind = type(value)
        if kind is str:
            return "key", value
        if kind is int:
            return "id", _ID.convert(value)
        parsed = self.by.convert(value)
        return ("id", parsed["id"]) if "id" in parsed else ("key", parsed["key"])

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"oneOf": [{"type": "string", "minLength": 1, "description": "a key"},
                          {"type": "integer", "minimum": 1, "maximum": UINT64, "description": "an id"},
                          self.by.schema(out)]}


def _one_ref(parsed: dict[str, Any], where: str) -> ServiceError | None:
    return invalid(where, "give exactly one of id and key") if len(parsed) != 1 else None


_KEY = Text(empty=False)
_ID = Id()


class CommaList(Field):
    """A query parameter holding a list: repeated (``?pool=a&pool=b``) or
    comma-separated (``?pool=a,b``)."""

    def __init__(self, items: Field, description: str = "") -> None:
        super().__init__(description)
        self.items = items

    def query(self, texts: list[str], where: str) -> list[Any]:
        return [self.items.parse(item, where) for text in texts for item in text.split(",") if item]

    def _schema(self, out: bool) -> dict[str, Any]:
        return {"type": "array", "items": self.items.schema(out)}


# ---------------------------------------------------------------- the request bodies


PRIORITIES = CLASSES
CONDITION_NAMES = tuple(f"on_{c}" for c in CONDITIONS)   # Dep(on="failure") is {"cond": "on_failure"}
PAYLOADS = ("payload", "payload_b64", "payload_text")


def _one_payload(parsed: dict[str, Any], where: str) -> ServiceError | None:
    if ("payload" in parsed) + ("payload_b64" in parsed) + ("payload_text" in parsed) < 2:   # (per task: cheap)
        return None
    given = [name for name in PAYLOADS if name in parsed]
    return invalid(where, f"give at most one of {', '.join(PAYLOADS)}, not {' and '.join(given)}")


def _dep_ref(parsed: dict[str, Any], where: str) -> ServiceError | None:
    return invalid(where, "give exactly one of id and key") if ("id" in parsed) == ("key" in parsed) else None


def _retry_field(kind: str, description: str, minimum: float | None, maximum: float | None) -> Field:
    if kind == "count":
        return Integer(description, minimum=int(minimum or 0), maximum=int(maximum or UINT64))
    if kind == "seconds":
        return Seconds(description)
    if kind == "factor":
        return Number(description, minimum=minimum or 0.0)
    return Flag(description)


RETRY = Obj("RetryPolicy", {
    f.wire: _retry_field(f.kind, f"{f.doc[0].upper()}{f.doc[1:]} (default {str(f.default).lower()}).",
                         f.minimum, f.maximum)
    for f in RETRY_FIELDS}, "The retry policy of the task; without it, the pool's.")

DEP = Obj("Dep", {
    "id": Id("The task depended on, by id."),
    "key": Text("The task depended on, by key.", empty=False),
    "cond": Choice(CONDITION_NAMES, "When the dependent may run: after the task succeeded (default), failed, or "
                                    "either; otherwise it ends as skipped."),
}, "A dependency with a condition: exactly one of id and key, and cond.", check=_dep_ref)

_NAMED = " At most limits.max_name_bytes bytes of UTF-8, no NUL."


def _task_field(opt: TaskOption) -> Field:
    """The JSON field of a task option."""
    text = opt.description().replace("`", "")
    if opt.kind == "time":
        text += " Unix nanoseconds."
    if opt.default not in ("None", "()", "{}"):
        text += f" Default: {opt.default.replace('`', '')}."
    if opt.pair is not None:
        other = next(o for o in TASK_OPTIONS if o.pair == opt.pair and o is not opt)
        text += f" Not with {other.wire}."
    kind = opt.kind
    if kind == "name":
        return Text(text + _NAMED)
    if kind == "key":
        return Text(text + " At most limits.max_key_bytes bytes.")
    if kind == "choice":
        return Choice(opt.choices, text)
    if kind == "seconds":
        return Seconds(text)
    if kind == "time":
        return UnixNs(text)
    if kind == "retry":
        return RETRY
    if kind == "units":
        return Map(Integer(minimum=0, maximum=2 ** 32 - 1), text + " Resource name -> units.")
    if kind == "refs":
        return Array(Ref('A task: a key (string), an id (number), or {"id": "..."} / {"key": "..."}.'), text)
    if kind == "deps":
        return Array(DEP, text)
    if kind == "pairs":
        return Map(Text(), text + " Name -> value.")
    assert kind == "stages", kind
    return Array(Text("A stage name." + _NAMED, empty=False), text)



TASK_FIELDS: dict[str, Field] = {
    "payload": AnyJson("Any JSON value; the worker receives it as application/json (unless content_type "
                       "says otherwise)."),
    "payload_b64": Base64("Binary payload, base64; the worker receives the bytes as application/octet-stream "
                          "(unless content_type says otherwise)."),
    "payload_text": Text("Text payload; the worker receives it as text/plain; charset=utf-8 (unless "
                         "content_type says otherwise)."),
    "content_type": Text("The payload's content type, printable ASCII, at most 255 characters."),
    **{opt.wire: _task_field(opt) for opt in (OPTIONS[name] for name in WIRE_ORDER) if opt.wire is not None},
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


# ---------------------------------------------------------------- bulk actions

BULK_MAX = 500   # ids (and keys) one bulk request names, at most


def _bulk_size(parsed: dict[str, Any], where: str) -> ServiceError | None:
    prefix = f"{where}." if where else ""
    for name in ("ids", "keys"):
        given = parsed.get(name)
        if given is not None and len(given) > BULK_MAX:
            return invalid(prefix + name, f"names at most {BULK_MAX} tasks, got {len(given)}")
    if not parsed.get("ids") and not parsed.get("keys"):
        return invalid(prefix + "ids", "give the tasks: ids, keys or both, not empty")
    return None


BULK_CANCEL = Obj("BulkCancelRequest", {
    "ids": Array(Id(), f"Tasks to cancel, by id (at most {BULK_MAX})."),
    "keys": Array(Text(empty=False), f"Tasks to cancel, by key (at most {BULK_MAX})."),
}, "Tasks to cancel: ids, keys or both.", check=_bulk_size)

BULK_RESUBMIT = Obj("BulkResubmitRequest", {
    "ids": Array(Id(), f"Dead-lettered tasks to submit again (at most {BULK_MAX})."),
}, "Dead-lettered tasks to submit again.", required=("ids",), check=_bulk_size)
