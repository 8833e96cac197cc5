"""The catalog of environments: the named deployments of cronoq-server
(``prod``, ``staging``...), each with its region, its HTTP URL (the
dashboard's origin) and its gRPC target (the command line's). One TOML
table per environment::

    [environments.prod]
    region = "eu-west-1"
    http = "https://cronoq.prod.example:7071"
    grpc = "https://cronoq.prod.example:7070"
    description = "production"

A catalog holds no credentials: a key naming a token, secret or password is
refused, like any unknown key. The server reads it (``[environments]`` of
its configuration, or the file its ``path`` names) and the command line
reads it (``cronoq --env NAME``); this module imports nothing of either, so
the command line needs no server extra to use it.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

__all__ = ["Environment", "CatalogError", "NAME_PATTERN", "parse_catalog", "read_catalog", "load_catalog",
           "find"]

NAME_PATTERN = "[a-z0-9][a-z0-9_-]{0,62}"
_NAME = re.compile(NAME_PATTERN + r"\Z")
_KEYS = ("region", "http", "grpc", "description")
_SECRET_WORDS = ("token", "secret", "password")
_REGION_LIMIT = 64
_DESCRIPTION_LIMIT = 200


class CatalogError(ValueError):
    """The catalog is invalid; ``errors`` lists each problem with its key."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid environments catalog:\n" + "\n".join(f"  {e}" for e in self.errors))


@dataclass(frozen=True)
class Environment:
    """One deployment of the catalog. ``http`` is its HTTP listener's URL
    (``scheme://host[:port]``, no path), ``grpc`` its gRPC target as
    ``cronoq --server`` takes it (``host:port``, ``http://host:port`` or
    ``https://host:port``); at least one of them is given."""

    name: str
    region: str = ""
    http: str | None = None
    grpc: str | None = None
    description: str = ""

    def as_json(self, current: str | None = None) -> dict[str, Any]:
        return {"name": self.name, "region": self.region, "http": self.http or "", "grpc": self.grpc or "",
                "description": self.description, "current": self.name == current}


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: Any, limit: int) -> str | None:
    """What is wrong with a text value, or None."""
    if not isinstance(value, str):
        return f"must be a string, got {_describe(value)}"
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"is longer than {limit} characters"
    if not value.isprintable():
        return "must be printable text (no control characters)"
    return None


def _http_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"must be an http:// or https:// URL, got {url!r}"
    try:
        port = parts.port
    except ValueError:
        return f"has an invalid port (1 to 65535), got {url!r}"
    if not parts.hostname or port == 0:
        return f"must be {parts.scheme}://HOST[:PORT], got {url!r}"
    if parts.username is not None or parts.password is not None:
        return "must not hold a user or a password (a catalog holds no credentials)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"must be {parts.scheme}://HOST[:PORT] without a path, query or fragment (the dashboard is " \
               f"at /ui/ of it), got {url!r}"
    return None


def _grpc_problem(target: str) -> str | None:
    scheme, sep, rest = target.partition("://")
    if not sep:
        scheme, rest = "", target
    if scheme not in ("", "http", "https"):
        return f"must be HOST:PORT, http://HOST:PORT or https://HOST:PORT, got {target!r}"
    parts = urlsplit("//" + rest)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or not port or parts.path or parts.query or parts.fragment or \
            parts.username is not None:
        return f"must be HOST:PORT, http://HOST:PORT or https://HOST:PORT with a port from 1 to 65535, " \
               f"got {target!r}"
    return None


def read_catalog(table: Any, where: str, errors: list[str]) -> list[Environment]:
    """The environments of ``table`` (NAME -> its table), each problem added
    to ``errors`` as ``where.NAME.key: what is wrong``."""
    if not isinstance(table, Mapping):
        errors.append(f"{where}: must be a table of [{where}.NAME] tables, got {_describe(table)}")
        return []
    out: list[Environment] = []
    for name, entry in table.items():
        path = f"{where}.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            errors.append(f"{where}: the name {name!r} must match {NAME_PATTERN} (lower-case letters, digits, "
                          f"- and _)")
            continue
        if not isinstance(entry, Mapping):
            errors.append(f"{path}: must be a table ([{path}]), got {_describe(entry)}")
            continue
        problems = len(errors)
        values: dict[str, str] = {}
        for key, value in entry.items():
            if any(word in key.lower() for word in _SECRET_WORDS):
                errors.append(f"{path}.{key}: a catalog holds no credentials (the command line reads the token "
                              f"from $CRONOQ_TOKEN; the dashboard asks for it)")
                continue
            if key not in _KEYS:
                errors.append(f"{path}.{key}: unknown key (the keys: {', '.join(_KEYS)})")
                continue
            limit = {"region": _REGION_LIMIT, "description": _DESCRIPTION_LIMIT}.get(key, 2048)
            problem = _text(value, limit)
            if problem is None and key == "http":
                problem = _http_problem(value)
            elif problem is None and key == "grpc":
                problem = _grpc_problem(value)
            elif problem is None and key == "region" and value != value.strip():
                problem = "must not begin or end with spaces"
            if problem is not None:
                errors.append(f"{path}.{key}: {problem}")
                continue
            values[key] = value.rstrip("/") if key == "http" else value
        if "http" not in entry and "grpc" not in entry:
            errors.append(f"{path}: needs http (its HTTP URL), grpc (its gRPC target) or both")
        if len(errors) == problems:
            out.append(Environment(name, values.get("region", ""), values.get("http"), values.get("grpc"),
                                   values.get("description", "")))
    return out


def parse_catalog(text: str, source: str = "the catalog") -> tuple[Environment, ...]:
    """The environments of a catalog file's text: its ``[environments.NAME]``
    tables and nothing else. ``CatalogError`` lists every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError([f"{source}: not valid TOML: {exc}"]) from None
    errors = [f"{source}: {key}: unknown key (a catalog holds [environments.NAME] tables only)"
              for key in data if key != "environments"]
    if "environments" not in data:
        errors.append(f"{source}: defines no environments (give [environments.NAME] tables)")
        raise CatalogError(errors)
    found = read_catalog(data["environments"], "environments", errors)
    if not found and not errors:
        errors.append(f"{source}: defines no environments (give [environments.NAME] tables)")
    if errors:
        raise CatalogError([e if e.startswith(source) else f"{source}: {e}" for e in errors])
    return tuple(found)


def load_catalog(path: str | os.PathLike[str]) -> tuple[Environment, ...]:
    """Read and check the catalog file at ``path``."""
    source = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CatalogError([f"cannot read {source}: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CatalogError([f"{source} is not UTF-8 text"]) from None
    return parse_catalog(text, source)


def find(catalog: tuple[Environment, ...] | list[Environment], name: str) -> Environment | None:
    return next((e for e in catalog if e.name == name), None)
