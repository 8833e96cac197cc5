"""How the keys of the configuration file are read: each key of a section
has a ``Rule`` (its kind, bounds and limits; its default is its dataclass
field's, see ``key``), msgspec checks a value against it, and ``Rule.problem``
says what is wrong in the words of the error (``pools[0].lease_ttl_s: must
be finite, got inf``). A ``Table`` reads one TOML table, records every
problem (every one is reported at once), keeps the default of a key it
refuses, and reports the keys nobody read as unknown."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

import msgspec

from ..core.options import NAME_LIMIT, VALUE_LIMIT

__all__ = ["Rule", "key", "rules", "Table", "describe_value", "YEAR"]

YEAR = 365 * 86_400.0          # the longest configurable duration


@dataclass(frozen=True)
class Rule:
    """How the value of one key is checked: msgspec checks its type and
    bounds (``spec``); ``problem`` names what is wrong, in the words of the
    error (``pools[0].lease_ttl_s: must be finite, got inf``). ``kind`` is
    ``string``, ``integer``, ``seconds``, ``number`` or ``flag``; ``low``
    is excluded with ``above``; strings are at most ``limit`` bytes of
    UTF-8. A key's default is that of its dataclass field."""

    kind: str
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] | None = None
    limit: int = NAME_LIMIT
    empty: bool = False
    what: str = ""

    @property
    def noun(self) -> str:
        return self.what or {"string": "a string", "integer": "an integer", "seconds": "a number of seconds",
                             "number": "a number", "flag": "true or false"}[self.kind]

    def spec(self) -> Any:
        if self.kind == "flag":
            return bool
        if self.kind == "string":
            if self.choices is not None:
                return Literal[self.choices]
            return Annotated[str, msgspec.Meta(min_length=0 if self.empty else 1, pattern="^[^\x00]*$")]
        meta = msgspec.Meta(gt=self.low, le=self.high) if self.above else msgspec.Meta(ge=self.low, le=self.high)
        return Annotated[int if self.kind == "integer" else float, meta]   # (bounds refuse inf and nan)

    def accepts(self, value: Any) -> bool:
        if self.kind == "integer" and type(value) is bool:
            return False
        try:
            msgspec.convert(value, _SPECS.setdefault(self, self.spec()), strict=True)
        except msgspec.ValidationError:
            return False
        return self.kind != "string" or len(value) * 4 <= self.limit or \
            len(value.encode("utf-8", "surrogatepass")) <= self.limit

    def problem(self, value: Any) -> str:
        """What is wrong with a value ``accepts`` refused."""
        kinds: tuple[type, ...] = {"string": (str,), "integer": (int,), "flag": (bool,)}.get(self.kind, (int, float))
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            return f"must be {self.noun}, got {describe_value(value)}"
        return self._bound_problem(value)

    def _bound_problem(self, value: Any) -> str:
        if self.kind == "string":
            if "\x00" in value:
                return "must not contain NUL characters"
            if not value and not self.empty:
                return "must not be empty"
            if self.choices is not None and len(value.encode("utf-8", "surrogatepass")) <= self.limit:
                return f"must be one of {', '.join(self.choices)}, got {value!r}"
            return f"is longer than {self.limit} bytes"
        if self.kind == "integer":
            return f"must be between {self.low} and {self.high}, got {value}"
        if not math.isfinite(value):
            return f"must be finite, got {float(value)}"
        bound = f"above {self.low:g}" if self.above else f"at least {self.low:g}"
        return f"must be {bound} and at most {self.high:g}, got {float(value):g}"


_SPECS: dict[Rule, Any] = {}


def key(default: Any, kind: str, low: float | None = None, high: float | None = None, **rule: Any) -> Any:
    """A field of a section: its default, and the rule its key is read with."""
    if kind == "seconds":
        low = 0.0 if low is None else low
        high = YEAR if high is None else high
    return field(default=default, metadata={"rule": Rule(kind, low, high, **rule)})


def rules(section: type) -> dict[str, tuple[Rule, Any]]:
    """The keys of a section's dataclass read by a rule: name -> (rule, default)."""
    return {f.name: (f.metadata["rule"], f.default) for f in dataclasses.fields(section) if "rule" in f.metadata}


class Table:
    """One TOML table being read: every key read is recorded (``done``
    reports the rest as unknown); each problem is added to ``errors``, and
    the key keeps its default."""

    def __init__(self, data: Mapping[str, Any], where: str, errors: list[str]) -> None:
        self.data = data
        self.where = where
        self.errors = errors
        self.used: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> None:
        self.errors.append(f"{self.path(key)}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def read(self, key: str, rule: Rule, default: Any = None) -> Any:
        """The value of ``key`` if ``rule`` accepts it, else (an error, and) ``default``."""
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if not rule.accepts(value):
            self.error(key, rule.problem(value))
            return default
        return float(value) if rule.kind in ("seconds", "number") else value

    def section(self, section: type, *, only: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The keys of ``section`` read by their rules (``only``: these of them)."""
        return {name: self.read(name, rule, default) for name, (rule, default) in rules(section).items()
                if only is None or name in only}

    def string(self, key: str, default: str | None = None, *, limit: int = NAME_LIMIT,
               choices: tuple[str, ...] | None = None, empty: bool = False) -> str | None:
        return self.read(key, Rule("string", limit=limit, choices=choices, empty=empty), default)  # type: ignore

    def typed(self, key: str, kinds: tuple[type, ...], what: str) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            self.error(key, f"must be {what}, got {describe_value(value)}")
            return None
        return value

    def table(self, key: str) -> Table | None:
        value = self.typed(key, (dict,), "a table")
        return None if value is None else Table(value, self.path(key), self.errors)

    def tables(self, key: str) -> list[Table]:
        value = self.typed(key, (list,), "an array of tables ([[" + self.path(key) + "]])")
        if value is None:
            return []
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.errors.append(f"{self.path(key)}[{i}]: must be a table, got {describe_value(item)}")
                continue
            out.append(Table(item, f"{self.path(key)}[{i}]", self.errors))
        return out

    def strings(self, key: str, *, limit: int = NAME_LIMIT) -> list[str] | None:
        value = self.typed(key, (list,), "a list of strings")
        if value is None:
            return None
        rule = Rule("string", limit=limit)
        out = []
        for i, item in enumerate(value):
            if not rule.accepts(item):
                self.error(f"{key}[{i}]", f"must be a non-empty string without NUL of at most {limit} bytes, "
                                          f"got {describe_value(item)}")
                continue
            out.append(item)
        return out

    def string_map(self, key: str, *, value_limit: int = VALUE_LIMIT) -> dict[str, str] | None:
        value = self.typed(key, (dict,), "a table of strings")
        if value is None:
            return None
        names, values = Rule("string"), Rule("string", limit=value_limit, empty=True)
        out = {}
        for name, item in value.items():
            if not names.accepts(name):
                self.error(key, f"name {name!r} must be non-empty, without NUL, at most {NAME_LIMIT} bytes")
            elif not values.accepts(item):
                self.error(f"{key}.{name}", f"must be a string without NUL of at most {value_limit} bytes, "
                                            f"got {describe_value(item)}")
            else:
                out[name] = item
        return out

    def done(self, unsupported: Mapping[str, str] | None = None) -> None:
        for key in self.data:
            if key in self.used:
                continue
            if unsupported and key in unsupported:
                self.error(key, unsupported[key])
            else:
                self.error(key, "unknown key")


def describe_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return "a table" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
