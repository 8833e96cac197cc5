"""The HTTP gateway's request bodies: validated with msgspec, then turned
into cronoq.v1 messages.

On its fast path a body is decoded twice, both times in C: against the
msgspec type of its object (``Obj.spec()`` in schema.py: each field's type
and bounds, unknown fields refused), which says whether it is valid, and
untyped, which gives the fields given, as the messages want them. The few
rules msgspec cannot state (no NUL in strings, 64-bit bounds, integral
numbers, one of two fields) are checked as the values are converted.

A body refused anywhere takes the slow path, which says why in the words
users know: the json module decodes it (its error for text that is not
JSON) and the object's ``problem`` walks it in document order, naming the
first problem and where it is (``tasks[3].priority: must be one of ...``).
A body that msgspec refuses and ``problem`` accepts (msgspec is stricter
about a few values no field needs, such as 1e999 in a payload) goes on
from what the json module decoded, as if msgspec had accepted it.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import msgspec

from .._proto import cronoq_pb2 as pb
from .._proto.json_view import JSON_DECODER
from .codec import JSON, TEXT
from .errors import Code, ServiceError
from ..core.options import CLASSES, MISS_POLICIES
from .schema import CONDITION_NAMES, Obj, Refused, invalid

__all__ = ["Body", "task_message", "Payloads", "EXACT"]

_NUL = b"\\u0000"   # (a NUL can only reach a string escaped: raw control characters are not JSON)


def _refused(message: str) -> ServiceError:
    return ServiceError(Code.INVALID_ARGUMENT, message)


Payloads = Callable[[Any], bytes]   # how a body's JSON payloads are encoded again for the worker


class Body:
    """How the body of one route is read: ``decode`` gives its fields
    (checked and converted, see ``Obj.convert``) and how to encode its JSON
    payloads, or raises the ``ServiceError`` that names what is wrong."""

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.typed = msgspec.json.Decoder(obj.spec())
        self.floats = 0
        self.untyped = msgspec.json.Decoder(float_hook=self._float)

    def _float(self, text: str) -> float:
        self.floats += 1
        return float(text)

    def decode(self, data: bytes) -> tuple[dict[str, Any], Payloads]:
        try:
            self.typed.decode(data)
            if _NUL not in data:   # (else a string holds one: the slow path finds where, a payload may)
                self.floats = 0
                value = self.obj.convert(self.untyped.decode(data))
                # msgspec writes JSON as the json module does, but for the exponents of floats (1e16, not
                # 1e+16): the worker gets the bytes it always got.
                return value, FAST if not self.floats else EXACT
        except (msgspec.ValidationError, msgspec.DecodeError, Refused):
            pass
        return self.slow(data), EXACT

    def slow(self, data: bytes) -> dict[str, Any]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _refused("the body is not UTF-8") from None
        try:
            value = JSON_DECODER.decode(text)
        except (ValueError, RecursionError) as exc:
            raise _refused(f"the body is not valid JSON: {exc}") from None
        if type(value) is not dict:
            raise _refused(f"the body must be a JSON object ({self.obj.name}), got "
                           f"{'an array' if isinstance(value, list) else type(value).__name__}")
        error = self.obj.problem(value, "")
        if error is not None:
            raise error
        try:
            return self.obj.convert(value)
        except Refused:   # (a defect: problem and convert disagree)
            raise _refused(f"the body was refused ({self.obj.name})") from None


# ---------------------------------------------------------------- a task object -> TaskSpec


_PRIORITY_IN = {name: pb.Priority.Value(f"PRIORITY_{name.upper()}") for name in CLASSES}
_MISS_IN = {name: pb.MissPolicy.Value(f"MISS_POLICY_{name.upper()}") for name in MISS_POLICIES}
_COND_IN: dict[str, Any] = {name: pb.EdgeCond.Value(f"EDGE_COND_{name.upper()}") for name in CONDITION_NAMES}
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def EXACT(value: Any) -> bytes:
    """The JSON of a payload, as the worker gets it: compact, UTF-8."""
    return _ENCODER.encode(value).encode("utf-8")


FAST: Payloads = msgspec.json.encode   # the same bytes for values without floats


def _payload(fields: dict[str, Any], value: Any, encode: Payloads) -> None:
    try:
        fields["payload"] = encode(value)
    except (UnicodeEncodeError, ValueError, RecursionError) as exc:
        raise invalid("payload", f"cannot be sent as JSON ({exc})") from None
    fields.setdefault("content_type", JSON)


def _payload_b64(fields: dict[str, Any], value: bytes) -> None:
    fields["payload"] = value


def _payload_text(fields: dict[str, Any], value: str) -> None:
    fields["payload"] = value.encode("utf-8")
    fields.setdefault("content_type", TEXT)


def _ref(kind: str, value: Any) -> pb.TaskRef:
    return pb.TaskRef(id=value) if kind == "id" else pb.TaskRef(key=value)


def _after(fields: dict[str, Any], value: list[tuple[str, Any]]) -> None:
    fields["after"] = [_ref(kind, ref) for kind, ref in value]


def _deps(fields: dict[str, Any], value: list[dict[str, Any]]) -> None:
    fields["deps"] = [pb.Dep(ref=pb.TaskRef(id=d["id"]) if "id" in d else pb.TaskRef(key=d["key"]),
                             cond=_COND_IN[d.get("cond", "on_success")]) for d in value]


def _ignore(fields: dict[str, Any], value: Any) -> None:
    pass


_CONVERT: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "payload_b64": _payload_b64, "payload_text": _payload_text,
    "priority": lambda fields, value: fields.__setitem__("priority", _PRIORITY_IN[value]),
    "on_miss": lambda fields, value: fields.__setitem__("on_miss", _MISS_IN[value]),
    "retry": lambda fields, value: fields.__setitem__("retry", pb.RetryPolicy(**value)),
    "after": _after, "deps": _deps, "wait": _ignore, "wait_timeout_s": _ignore,
}


def task_message(task: dict[str, Any], payloads: Payloads = EXACT) -> pb.TaskSpec:
    """The wire task of a decoded task object (its other fields keep their names)."""
    fields: dict[str, Any] = {}
    convert = _CONVERT
    for name, value in task.items():
        how = convert.get(name)
        if how is not None:
            how(fields, value)
        elif name == "payload":
            _payload(fields, value, payloads)
        else:
            fields[name] = value
    return pb.TaskSpec(**fields)
