"""The server's configuration: one TOML file, every key checked.

``load(path)`` reads the file (``parse(text)`` a string) and returns a
``ServerConfig``, or raises ``ConfigError`` listing every problem found,
each naming its key (``pools[1].lease_ttl_s: ...``). Unknown keys are errors.
What depends on the environment (``token_env`` variables, token lengths,
listening on a non-loopback address without credentials, TLS files) is
checked by ``check_environment``, which startup and ``--check`` both run.

This module imports neither grpc nor the stores, so ``--check`` stays quick.
docs/server.md lists every key with its type, default and range.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..core.recurring import OVERLAP_POLICIES, CronSchedule
from ..core.types import CLASSES, KEY_LIMIT, NAME_LIMIT, VALUE_LIMIT

__all__ = ["ConfigError", "ServerConfig", "ServerSection", "TlsConfig", "Credential", "StoreConfig",
           "LimitsConfig", "PoolSection", "ResourceSection", "OutputsConfig", "RecurringSection", "TraceSection",
           "RetrySection", "load", "parse", "default_config", "check_environment", "ROLES", "YEAR"]

YEAR = 365 * 86_400.0          # the longest configurable duration
ROLES = ("client", "worker", "metrics", "admin")
MIN_TOKEN = 16                 # characters; shorter tokens are refused at startup
GOOD_TOKEN = 32                # shorter ones are accepted with a warning
_OVERFLOW = ("wait", "reject", "shed_lowest", "shed_oldest")
_MISS = ("run_late", "skip", "fail")


class ConfigError(ValueError):
    """The configuration is invalid; ``errors`` lists each problem with its key."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid configuration:\n" + "\n".join(f"  {e}" for e in self.errors))


# ---------------------------------------------------------------- the sections


@dataclass(frozen=True)
class TlsConfig:
    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class ServerSection:
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 7070
    http_host: str = "127.0.0.1"
    http_port: int = 7071
    metrics_host: str | None = None     # the optional listener of /metrics without credentials
    metrics_port: int = 0
    shutdown_grace_s: float = 10.0
    standby_close_s: float = 1.0
    insecure_no_auth: bool = False
    ui: bool = True                     # the web dashboard at /ui on the HTTP listener
    tls: TlsConfig | None = None

    @property
    def grpc_addr(self) -> str:
        return _join(self.grpc_host, self.grpc_port)

    @property
    def http_addr(self) -> str:
        return _join(self.http_host, self.http_port)

    @property
    def metrics_addr(self) -> str | None:
        return None if self.metrics_host is None else _join(self.metrics_host, self.metrics_port)


@dataclass(frozen=True)
class Credential:
    """One [[auth.tokens]] or [[auth.certs]] entry."""

    where: str                       # "auth.tokens[0]", for messages (never the token)
    role: str
    pools: frozenset[str] | None = None
    tenant: str | None = None
    labels: frozenset[tuple[str, str]] | None = None   # workers may register only these labels
    name: str | None = None
    token: str | None = None         # literal (kept only until startup digests it)
    token_env: str | None = None
    dns_name: str | None = None      # certificates

    def __repr__(self) -> str:       # never print a token
        secret = "token=***" if self.token else (f"token_env={self.token_env!r}" if self.token_env
                                                   else f"dns_name={self.dns_name!r}")
        return f"Credential({self.where}, role={self.role!r}, {secret})"


@dataclass(frozen=True)
class StoreConfig:
    kind: str = "memory"
    path: str | None = None
    url: str | None = None
    url_env: str | None = None
    schema: str = "public"
    keep_finished_s: float = 7 * 86_400.0
    retention_s: float = 3600.0
    commit_timeout_s: float = 30.0
    lock_poll_s: float = 0.5
    lease_ttl_s: float = 10.0
    lease_renew_s: float = 2.0
    full_sync: bool = True
    keepalive_s: float = 1.0
    session_timeout_s: float = 10.0

    def __repr__(self) -> str:       # a URL may hold a password
        return f"StoreConfig(kind={self.kind!r})"


@dataclass(frozen=True)
class LimitsConfig:
    max_message_bytes: int = 16 * 1024 * 1024
    max_http_body_bytes: int = 16 * 1024 * 1024
    request_timeout_s: float = 30.0
    max_wait_s: float = 300.0
    max_tasks_per_batch: int = 1000
    max_list: int = 1000
    max_deps: int = 256
    max_tags: int = 64
    max_labels: int = 16
    max_resources: int = 16
    max_key_bytes: int = KEY_LIMIT
    max_name_bytes: int = NAME_LIMIT
    max_value_bytes: int = VALUE_LIMIT
    max_pending_total: int = 1_000_000
    max_slots_per_worker: int = 1024
    max_workers: int = 10_000
    max_watchers: int = 1024
    watch_buffer: int = 4096
    register_timeout_s: float = 10.0
    keepalive_interval_s: float = 20.0
    max_http_connections: int = 1000
    http_head_timeout_s: float = 15.0
    http_keepalive_timeout_s: float = 65.0
    http_write_timeout_s: float = 30.0


@dataclass(frozen=True)
class RetrySection:
    max_attempts: int = 3
    initial_backoff_s: float = 1.0
    multiplier: float = 2.0
    max_backoff_s: float = 60.0
    jitter: bool = True


@dataclass(frozen=True)
class PoolSection:
    name: str
    min: int = 0
    max: int = 10_000
    lease_ttl_s: float = 30.0
    max_pending: int | dict[str, int] | None = None
    overflow: str = "wait"
    retry: RetrySection | None = None
    unknown_dependency: str = "reject"
    await_timeout_s: float | None = None
    default_duration_s: float = 1.0
    reservable_fraction: float = 0.5
    tenant_weights: dict[str, float] | None = None
    fair_share: bool = False


@dataclass(frozen=True)
class ResourceSection:
    name: str
    kind: str
    permits: int | None = None
    rate: float | None = None
    burst: int | None = None


@dataclass(frozen=True)
class OutputsConfig:
    cache_entries: int = 10_000
    info_entries: int = 100_000


@dataclass(frozen=True)
class TraceSection:
    """[trace]: record the workload for cronoq.whatif (docs/whatif.md)."""

    path: str
    flush_interval_s: float = 0.5
    sample_interval_s: float = 1.0
    max_buffer: int = 1_000_000


@dataclass(frozen=True)
class RecurringSection:
    """A [[recurring]] schedule; ``task`` holds the template's task fields,
    named as in the gRPC TaskSpec (payload given as JSON, text or base64)."""

    name: str
    cron: str
    tz: str = "UTC"
    overlap: str = "skip"
    payload: bytes = b""
    content_type: str = ""
    task: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerConfig:
    server: ServerSection = field(default_factory=ServerSection)
    tokens: tuple[Credential, ...] = ()
    certs: tuple[Credential, ...] = ()
    store: StoreConfig = field(default_factory=StoreConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    pools: tuple[PoolSection, ...] = (PoolSection("default"),)
    resources: tuple[ResourceSection, ...] = ()
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    recurring: tuple[RecurringSection, ...] = ()
    source: str | None = None        # the file read, if any
    trace: TraceSection | None = None

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens or self.certs)


def default_config() -> ServerConfig:
    """No file: one pool ``default``, in-memory state, loopback, no auth."""
    return ServerConfig()


# ---------------------------------------------------------------- reading


class _Table:
    """Reads one TOML table: every key read is recorded; ``done`` reports the rest."""

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

    def _get(self, key: str, default: Any, kinds: tuple[type, ...], what: str) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            self.error(key, f"must be {what}, got {_describe(value)}")
            return default
        return value

    def string(self, key: str, default: str | None = None, *, choices: tuple[str, ...] | None = None,
               limit: int = NAME_LIMIT, empty: bool = False) -> str | None:
        value = self._get(key, default, (str,), "a string")
        if value is None or value is default:
            return value
        if "\x00" in value:
            self.error(key, "must not contain NUL characters")
            return default
        if not value and not empty:
            self.error(key, "must not be empty")
            return default
        if len(value.encode("utf-8", "surrogatepass")) > limit:
            self.error(key, f"is longer than {limit} bytes")
            return default
        if choices is not None and value not in choices:
            self.error(key, f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def boolean(self, key: str, default: bool) -> bool:
        return bool(self._get(key, default, (bool,), "true or false"))

    def integer(self, key: str, default: Any, low: int, high: int) -> Any:
        value = self._get(key, default, (int,), "an integer")
        if value is default:
            return value
        if not low <= value <= high:
            self.error(key, f"must be between {low} and {high}, got {value}")
            return default
        return value

    def number(self, key: str, default: Any, low: float, high: float, *, above: bool = False,
               what: str = "a number") -> Any:
        value = self._get(key, default, (int, float), what)
        if value is default:
            return value
        value = float(value)
        if not math.isfinite(value):
            self.error(key, f"must be finite, got {value}")
            return default
        if value < low or (above and value == low) or value > high:
            bound = f"above {low:g}" if above else f"at least {low:g}"
            self.error(key, f"must be {bound} and at most {high:g}, got {value:g}")
            return default
        return value

    def seconds(self, key: str, default: Any, *, low: float = 0.0, above: bool = False,
                high: float = YEAR) -> Any:
        return self.number(key, default, low, high, above=above, what="a number of seconds")

    def table(self, key: str) -> _Table | None:
        value = self._get(key, None, (dict,), "a table")
        return None if value is None else _Table(value, self.path(key), self.errors)

    def tables(self, key: str) -> list[_Table]:
        value = self._get(key, None, (list,), "an array of tables ([[" + self.path(key) + "]])")
        if value is None:
            return []
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.errors.append(f"{self.path(key)}[{i}]: must be a table, got {_describe(item)}")
                continue
            out.append(_Table(item, f"{self.path(key)}[{i}]", self.errors))
        return out

    def strings(self, key: str, *, limit: int = NAME_LIMIT) -> list[str] | None:
        value = self._get(key, None, (list,), "a list of strings")
        if value is None:
            return None
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item or "\x00" in item or len(item.encode()) > limit:
                self.error(f"{key}[{i}]", f"must be a non-empty string without NUL of at most {limit} bytes, "
                                          f"got {_describe(item)}")
                continue
            out.append(item)
        return out

    def string_map(self, key: str, *, value_limit: int = VALUE_LIMIT) -> dict[str, str] | None:
        value = self._get(key, None, (dict,), "a table of strings")
        if value is None:
            return None
        out = {}
        for name, item in value.items():
            if not name or "\x00" in name or len(name.encode()) > NAME_LIMIT:
                self.error(key, f"name {name!r} must be non-empty, without NUL, at most {NAME_LIMIT} bytes")
            elif not isinstance(item, str) or "\x00" in item or len(item.encode()) > value_limit:
                self.error(f"{key}.{name}", f"must be a string without NUL of at most {value_limit} bytes, "
                                            f"got {_describe(item)}")
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


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return "a table" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_addr(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) with an IP literal or ``localhost`` as host."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"must be [IPv6]:port, got {text!r}")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"must be host:port (an IPv6 host in brackets), got {text!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port!r}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host must be an IP address or localhost, got {host!r}") from None
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    return ipaddress.ip_address(host).is_loopback


# ---------------------------------------------------------------- sections


_NOT_HERE = {
    "shards": "sharding is not supported by this version of cronoq-server (see docs/server.md)",
}
_NOT_HERE_SERVER = {
    "grpc_web": "gRPC-Web is not supported by this version of cronoq-server (see docs/server.md)",
    "peer_tls": "sharding is not supported by this version of cronoq-server (see docs/server.md)",
    "shard": "sharding is not supported by this version of cronoq-server (see docs/server.md)",
    "insecure_peer_http": "sharding is not supported by this version of cronoq-server (see docs/server.md)",
}


def _server(t: _Table | None) -> ServerSection:
    if t is None:
        return ServerSection()
    values: dict[str, Any] = {}
    for key, default in (("grpc_addr", "127.0.0.1:7070"), ("http_addr", "127.0.0.1:7071")):
        text = t.string(key, default)
        assert text is not None
        try:
            host, port = split_addr(text)
        except ValueError as exc:
            t.error(key, str(exc))
            host, port = split_addr(default)
        prefix = key.split("_")[0]
        values[f"{prefix}_host"] = host
        values[f"{prefix}_port"] = port
    metrics = t.string("metrics_addr")
    if metrics is not None:
        try:
            values["metrics_host"], values["metrics_port"] = split_addr(metrics)
        except ValueError as exc:
            t.error("metrics_addr", str(exc))
    values["shutdown_grace_s"] = t.seconds("shutdown_grace_s", 10.0)
    values["standby_close_s"] = t.seconds("standby_close_s", 1.0, low=0.1, high=60.0)
    values["insecure_no_auth"] = t.boolean("insecure_no_auth", False)
    values["ui"] = t.boolean("ui", True)
    tls = t.table("tls")
    if tls is not None:
        cert_path = tls.string("cert", limit=4096)
        key_path = tls.string("key", limit=4096)
        ca_path = tls.string("client_ca", limit=4096)
        for field_name, path in (("cert", cert_path), ("key", key_path)):
            if path is None and not tls.has(field_name):
                tls.error(field_name, "is required with [server.tls]")
        tls.done()
        if cert_path and key_path:
            values["tls"] = TlsConfig(cert_path, key_path, ca_path)
    if values.get("grpc_port") and values["grpc_port"] == values.get("http_port") \
            and values["grpc_host"] == values["http_host"]:
        t.error("http_addr", "must differ from grpc_addr")
    if values.get("metrics_port"):
        for other in ("grpc", "http"):
            if (values["metrics_host"], values["metrics_port"]) == (values[f"{other}_host"], values[f"{other}_port"]):
                t.error("metrics_addr", f"must differ from {other}_addr")
    t.done(_NOT_HERE_SERVER)
    return ServerSection(**values)


def _credential(t: _Table, pool_names: set[str], kind: str) -> Credential | None:
    role = t.string("role", choices=ROLES)
    if role is None and not t.has("role"):
        t.error("role", f"is required (one of {', '.join(ROLES)})")
    pools = t.strings("pools")
    if pools is not None:
        for name in pools:
            if name not in pool_names:
                t.error("pools", f"names unknown pool {name!r}")
        if not pools and t.has("pools"):
            t.error("pools", "must name at least one pool (leave it out for every pool)")
    tenant = t.string("tenant")
    labels = None
    raw_labels = t.strings("labels", limit=NAME_LIMIT + VALUE_LIMIT + 1)
    if raw_labels is not None:
        pairs = []
        for item in raw_labels:
            name, sep, value = item.partition("=")
            if not sep or not name:
                t.error("labels", f"entries are name=value pairs, got {item!r}")
            else:
                pairs.append((name, value))
        labels = frozenset(pairs)
    display = t.string("name")
    token = token_env = dns_name = None
    if kind == "token":
        token = t._get("token", None, (str,), "a string")
        token_env = t.string("token_env")
        if (token is None) == (token_env is None):
            t.errors.append(f"{t.where}: needs exactly one of token and token_env")
        elif token is not None and ("\x00" in token or not token.isprintable() or token != token.strip()):
            t.error("token", "must be printable text without spaces around it")
            token = None
    else:
        dns_name = t.string("dns_name")
        if dns_name is None and not t.has("dns_name"):
            t.error("dns_name", "is required")
    t.done()
    if role is None:
        return None
    return Credential(t.where, role, frozenset(pools) if pools else None, tenant, labels, display, token,
                      token_env, dns_name)


def _store(t: _Table | None) -> StoreConfig:
    if t is None:
        return StoreConfig()
    kind = t.string("kind", "memory", choices=("memory", "sqlite", "postgres"))
    assert kind is not None
    v: dict[str, Any] = {"kind": kind}
    v["keep_finished_s"] = t.seconds("keep_finished_s", 7 * 86_400.0)
    v["retention_s"] = t.seconds("retention_s", 3600.0)
    v["commit_timeout_s"] = t.seconds("commit_timeout_s", 30.0, above=True)
    v["lock_poll_s"] = t.seconds("lock_poll_s", 0.5, above=True, high=60.0)
    if kind == "sqlite":
        path = t.string("path", limit=4096)
        if path is None and not t.has("path"):
            t.error("path", "is required with kind = \"sqlite\"")
        v["path"] = path
        v["lease_ttl_s"] = t.seconds("lease_ttl_s", 10.0, above=True, high=3600.0)
        v["lease_renew_s"] = t.seconds("lease_renew_s", 2.0, above=True, high=3600.0)
        v["full_sync"] = t.boolean("full_sync", True)
        if v["lease_renew_s"] >= v["lease_ttl_s"]:
            t.error("lease_renew_s", f"must be shorter than lease_ttl_s ({v['lease_ttl_s']:g})")
    elif kind == "postgres":
        url = t.string("url", limit=4096)
        url_env = t.string("url_env")
        if url is not None and url_env is not None:
            t.errors.append(f"{t.where}: give store.url or store.url_env, not both")
        v["url"] = url
        v["url_env"] = url_env if url_env is not None or url is not None else "DATABASE_URL"
        schema = t.string("schema", "public", limit=63)
        v["schema"] = schema
        v["keepalive_s"] = t.seconds("keepalive_s", 1.0, above=True, high=3600.0)
        v["session_timeout_s"] = t.seconds("session_timeout_s", 10.0, above=True, high=3600.0)
    t.done({"path": "applies to kind = \"sqlite\" only",
            "url": "applies to kind = \"postgres\" only", "url_env": "applies to kind = \"postgres\" only",
            "schema": "applies to kind = \"postgres\" only",
            "lease_ttl_s": "applies to kind = \"sqlite\" only",
            "lease_renew_s": "applies to kind = \"sqlite\" only",
            "full_sync": "applies to kind = \"sqlite\" only",
            "keepalive_s": "applies to kind = \"postgres\" only",
            "session_timeout_s": "applies to kind = \"postgres\" only"})
    return StoreConfig(**v)


_LIMIT_INTS = {
    # key: (default, low, high)
    "max_message_bytes": (16 * 1024 * 1024, 64 * 1024, 256 * 1024 * 1024),
    "max_http_body_bytes": (16 * 1024 * 1024, 4096, 256 * 1024 * 1024),
    "max_tasks_per_batch": (1000, 1, 100_000),
    "max_list": (1000, 1, 100_000),
    "max_deps": (256, 0, 10_000),
    "max_tags": (64, 0, 1024),
    "max_labels": (16, 0, 256),
    "max_resources": (16, 0, 256),
    "max_key_bytes": (KEY_LIMIT, 1, KEY_LIMIT),
    "max_name_bytes": (NAME_LIMIT, 1, NAME_LIMIT),
    "max_value_bytes": (VALUE_LIMIT, 0, VALUE_LIMIT),
    "max_pending_total": (1_000_000, 1, 1_000_000_000),
    "max_slots_per_worker": (1024, 1, 65_536),
    "max_workers": (10_000, 1, 1_000_000),
    "max_watchers": (1024, 0, 100_000),
    "watch_buffer": (4096, 16, 1_000_000),
    "max_http_connections": (1000, 1, 1_000_000),
}
_LIMIT_SECONDS = {
    "request_timeout_s": (30.0, 0.1),
    "max_wait_s": (300.0, 0.0),
    "register_timeout_s": (10.0, 0.1),
    "keepalive_interval_s": (20.0, 1.0),
    "http_head_timeout_s": (15.0, 0.1),
    "http_keepalive_timeout_s": (65.0, 0.1),
    "http_write_timeout_s": (30.0, 0.1),
}


def _limits(t: _Table | None) -> LimitsConfig:
    if t is None:
        return LimitsConfig()
    v: dict[str, Any] = {}
    for key, (default, low, high) in _LIMIT_INTS.items():
        v[key] = t.integer(key, default, low, high)
    for key, (default_s, low_s) in _LIMIT_SECONDS.items():
        v[key] = t.seconds(key, default_s, low=low_s)
    t.done()
    return LimitsConfig(**v)


def _retry(t: _Table | None) -> RetrySection | None:
    if t is None:
        return None
    v: dict[str, Any] = {}
    v["max_attempts"] = t.integer("max_attempts", 3, 1, 1_000_000)
    v["initial_backoff_s"] = t.seconds("initial_backoff_s", 1.0)
    v["multiplier"] = t.number("multiplier", 2.0, 1.0, 1000.0)
    v["max_backoff_s"] = t.seconds("max_backoff_s", 60.0)
    v["jitter"] = t.boolean("jitter", True)
    t.done()
    return RetrySection(**v)


def _name(t: _Table, key: str, what: str, limit: int = NAME_LIMIT) -> str | None:
    name = t.string(key, limit=limit)
    if name is None and not t.has(key):
        t.error(key, f"is required ({what})")
    return name


def _pool(t: _Table) -> PoolSection | None:
    name = _name(t, "name", "the pool's name")
    v: dict[str, Any] = {}
    v["min"] = t.integer("min", 0, 0, 1_000_000)
    v["max"] = t.integer("max", 10_000, 1, 1_000_000)
    if v["min"] > v["max"]:
        t.error("min", f"({v['min']}) must not exceed max ({v['max']})")
    v["lease_ttl_s"] = t.seconds("lease_ttl_s", 30.0, low=0.1)
    if t.has("max_pending"):
        raw = t.raw("max_pending")
        if isinstance(raw, dict):
            table = _Table(raw, t.path("max_pending"), t.errors)
            v["max_pending"] = {c: n for c in CLASSES
                                if (n := table.integer(c, None, 0, 1_000_000_000)) is not None}
            table.done()
        elif isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= 1_000_000_000:
            v["max_pending"] = raw
        else:
            t.error("max_pending", f"must be an integer from 0 to 1000000000 or a table of classes "
                                   f"({', '.join(CLASSES)}), got {_describe(raw)}")
    v["overflow"] = t.string("overflow", "wait", choices=_OVERFLOW)
    v["retry"] = _retry(t.table("retry"))
    v["unknown_dependency"] = t.string("unknown_dependency", "reject", choices=("reject", "await"))
    v["await_timeout_s"] = t.seconds("await_timeout_s", None)
    v["default_duration_s"] = t.seconds("default_duration_s", 1.0)
    v["reservable_fraction"] = t.number("reservable_fraction", 0.5, 0.0, 1.0)
    weights = t.table("tenant_weights")
    if weights is not None:
        out = {}
        for tenant in weights.data:
            if not tenant or "\x00" in tenant or len(tenant.encode()) > NAME_LIMIT:
                weights.error(tenant, "is not a valid tenant name")
                weights.used.add(tenant)
                continue
            value = weights.number(tenant, None, 0.0, 1e9, above=True)
            if value is not None:
                out[tenant] = value
        weights.done()
        v["tenant_weights"] = out
    v["fair_share"] = t.boolean("fair_share", False)
    t.done({"scaler": "webhook scalers are not supported by this version (see docs/server.md)",
            "autoscale": "server pools take their capacity from connected workers; there is no autoscaler"})
    if name is None:
        return None
    return PoolSection(name=name, **v)


def _resource(t: _Table) -> ResourceSection | None:
    name = _name(t, "name", "the resource's name")
    kind = t.string("kind", choices=("semaphore", "token_bucket"))
    if kind is None and not t.has("kind"):
        t.error("kind", "is required (semaphore or token_bucket)")
    permits = rate = burst = None
    if kind == "semaphore":
        permits = t.integer("permits", None, 1, 1_000_000_000)
        if permits is None and not t.has("permits"):
            t.error("permits", "is required for a semaphore")
    elif kind == "token_bucket":
        rate = t.number("rate", None, 1.0 / (100 * YEAR), 1e9, what="a number of tokens per second")
        burst = t.integer("burst", None, 1, 1_000_000_000)
        for key, value in (("rate", rate), ("burst", burst)):
            if value is None and not t.has(key):
                t.error(key, "is required for a token bucket")
    t.done({"permits": "applies to kind = \"semaphore\" only", "rate": "applies to kind = \"token_bucket\" only",
            "burst": "applies to kind = \"token_bucket\" only",
            "shard": "sharding is not supported by this version of cronoq-server (see docs/server.md)"})
    if name is None or kind is None:
        return None
    return ResourceSection(name, kind, permits, rate, burst)


def _outputs(t: _Table | None) -> OutputsConfig:
    if t is None:
        return OutputsConfig()
    cache = t.integer("cache_entries", 10_000, 0, 10_000_000)
    info = t.integer("info_entries", 100_000, 0, 10_000_000)
    t.done({"cache_bytes": "the output cache is bounded by entries (cache_entries) in this version"})
    return OutputsConfig(cache, info)


def _trace(t: _Table | None) -> TraceSection | None:
    if t is None:
        return None
    path = t.string("path", limit=4096)
    if path is None and not t.has("path"):
        t.error("path", "is required: the file the trace is written to")
    flush = t.seconds("flush_interval_s", 0.5, above=True, high=3600.0)
    sample = t.seconds("sample_interval_s", 1.0, high=3600.0)
    buffer = t.integer("max_buffer", 1_000_000, 1, 100_000_000)
    t.done()
    return None if path is None else TraceSection(path, flush, sample, buffer)


# The task fields a recurring template may set, with how each is read.
_TEMPLATE_STRINGS = ("pool", "kind", "tenant")
_TEMPLATE_SECONDS = ("deadline_in_s", "tolerance_s", "timeout_s", "duration_hint_s")


def _recurring(t: _Table, pool_names: set[str], resource_names: set[str]) -> RecurringSection | None:
    name = _name(t, "name", "the schedule's name", limit=KEY_LIMIT)
    cron = t.string("cron", limit=1024)
    if cron is None and not t.has("cron"):
        t.error("cron", "is required")
    tz = t.string("tz", "UTC", limit=255)
    overlap = t.string("overlap", "skip", choices=OVERLAP_POLICIES)
    if cron is not None and tz is not None:
        try:
            CronSchedule(cron, tz)
        except ValueError as exc:
            t.error("cron" if "tz" not in str(exc) else "tz", str(exc))
    payloads = [key for key in ("payload", "payload_text", "payload_b64") if t.has(key)]
    payload = b""
    content_type = t.string("content_type", "", limit=255, empty=True) or ""
    if len(payloads) > 1:
        t.errors.append(f"{t.where}: give at most one of payload, payload_text and payload_b64")
    elif payloads == ["payload"]:
        payload = json.dumps(t.raw("payload"), separators=(",", ":"), ensure_ascii=False,
                             default=str).encode()
        content_type = content_type or "application/json"
    elif payloads == ["payload_text"]:
        text = t.string("payload_text", limit=16 * 1024 * 1024, empty=True)
        payload = (text or "").encode()
        content_type = content_type or "text/plain; charset=utf-8"
    elif payloads == ["payload_b64"]:
        text = t.string("payload_b64", limit=32 * 1024 * 1024, empty=True) or ""
        try:
            payload = base64.b64decode(text, validate=True)
        except ValueError:
            t.error("payload_b64", "is not valid base64")
    task: dict[str, Any] = {}
    for key in _TEMPLATE_STRINGS:
        value = t.string(key)
        if value is not None:
            task[key] = value
    if "pool" in task and task["pool"] not in pool_names:
        t.error("pool", f"names unknown pool {task['pool']!r}")
    prefix = t.string("key", limit=KEY_LIMIT - len("@2000-01-01T00:00:00Z"))
    if prefix is not None:
        task["key"] = prefix
    priority = t.string("priority", choices=CLASSES)
    if priority is not None:
        task["priority"] = priority
    on_miss = t.string("on_miss", choices=_MISS)
    if on_miss is not None:
        task["on_miss"] = on_miss
    for field_name in _TEMPLATE_SECONDS:
        seconds = t.seconds(field_name, None)
        if seconds is not None:
            task[field_name] = seconds
    for field_name in ("tags", "labels"):
        mapping = t.string_map(field_name)
        if mapping:
            task[field_name] = mapping
    resources = t.table("resources")
    if resources is not None:
        units = {}
        for rname in list(resources.data):
            if rname not in resource_names:
                resources.error(rname, "is not a configured resource")
                resources.used.add(rname)
                continue
            value = resources.integer(rname, None, 1, 1_000_000_000)
            if value is not None:
                units[rname] = value
        resources.done()
        task["resources"] = units
    retry = _retry(t.table("retry"))
    if retry is not None:
        task["retry"] = retry
    t.done({"deadline_unix_ns": "a recurring template describes every occurrence: use deadline_in_s",
            "start_in_s": "occurrences start at the cron times", "start_unix_ns": "occurrences start at the cron times",
            "after": "a recurring template may not have dependencies", "deps": "a recurring template may not have dependencies"})
    if name is None or cron is None:
        return None
    return RecurringSection(name, cron, tz or "UTC", overlap or "skip", payload, content_type, task)


def parse(text: str, *, source: str | None = None) -> ServerConfig:
    """The configuration in ``text`` (TOML); ``ConfigError`` lists every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"]) from None
    errors: list[str] = []
    root = _Table(data, "", errors)
    server = _server(root.table("server"))
    pools: list[PoolSection] = []
    seen: set[str] = set()
    pool_tables = root.tables("pools")
    for t in pool_tables:
        pool = _pool(t)
        if pool is None:
            continue
        if pool.name in seen:
            t.error("name", f"duplicate pool name {pool.name!r}")
            continue
        seen.add(pool.name)
        pools.append(pool)
    if not pool_tables and not root.has("pools"):
        pools = [PoolSection("default")]
    elif not pools and not errors:
        errors.append("pools: define at least one [[pools]] table")
    pool_names = {p.name for p in pools}
    resources: list[ResourceSection] = []
    seen = set()
    for t in root.tables("resources"):
        resource = _resource(t)
        if resource is None:
            continue
        if resource.name in seen:
            t.error("name", f"duplicate resource name {resource.name!r}")
            continue
        seen.add(resource.name)
        resources.append(resource)
    tokens: list[Credential] = []
    certs: list[Credential] = []
    auth = root.table("auth")
    if auth is not None:
        literal: dict[str, str] = {}
        for t in auth.tables("tokens"):
            credential = _credential(t, pool_names, "token")
            if credential is None:
                continue
            if credential.token is not None:
                if credential.token in literal:
                    t.error("token", f"duplicates the token of {literal[credential.token]}")
                    continue
                literal[credential.token] = credential.where
            tokens.append(credential)
        for t in auth.tables("certs"):
            credential = _credential(t, pool_names, "cert")
            if credential is not None:
                certs.append(credential)
        if certs and (server.tls is None or server.tls.client_ca is None):
            auth.error("certs", "need server.tls.client_ca (client certificates are verified against it)")
        auth.done()
    store = _store(root.table("store"))
    limits = _limits(root.table("limits"))
    outputs = _outputs(root.table("outputs"))
    trace = _trace(root.table("trace"))
    recurring: list[RecurringSection] = []
    seen = set()
    for t in root.tables("recurring"):
        schedule = _recurring(t, pool_names, {r.name for r in resources})
        if schedule is None:
            continue
        if schedule.name in seen:
            t.error("name", f"duplicate schedule name {schedule.name!r}")
            continue
        seen.add(schedule.name)
        recurring.append(schedule)
    root.done(_NOT_HERE)
    if errors:
        raise ConfigError(errors)
    return ServerConfig(server, tuple(tokens), tuple(certs), store, limits, tuple(pools), tuple(resources),
                        outputs, tuple(recurring), source, trace)


def load(path: str | os.PathLike[str]) -> ServerConfig:
    """Read and check the file at ``path``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError([f"cannot read {os.fspath(path)}: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{os.fspath(path)} is not UTF-8 text"]) from None
    return parse(text, source=os.fspath(path))


# ---------------------------------------------------------------- startup checks


def _tls_errors(tls: TlsConfig) -> list[str]:
    """The TLS files must exist and load: the key must match the certificate."""
    import ssl

    errors = []
    for key, path in (("cert", tls.cert), ("key", tls.key), ("client_ca", tls.client_ca)):
        if path is not None and not os.path.isfile(path):
            errors.append(f"server.tls.{key}: no such file: {path}")
    if errors:
        return errors
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except OSError as exc:   # (ssl.SSLError included: not PEM, or a key of another certificate)
        errors.append(f"server.tls: cannot load the certificate {tls.cert} with the key {tls.key}: "
                      f"{getattr(exc, 'reason', None) or exc.strerror or exc}")
    if tls.client_ca is not None:
        try:
            context.load_verify_locations(tls.client_ca)
        except OSError as exc:
            errors.append(f"server.tls.client_ca: cannot load {tls.client_ca}: "
                          f"{getattr(exc, 'reason', None) or exc.strerror or exc}")
    return errors


def check_environment(config: ServerConfig, *, insecure_no_auth: bool = False,
                      environ: Mapping[str, str] | None = None,
                      warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """What the file alone cannot tell, checked by startup and by ``--check``
    alike (everything startup checks before it opens a socket): every
    token_env set, tokens long enough and unique, no listener off loopback
    without credentials (unless allowed), the PostgreSQL URL's variable set,
    the TLS files readable and matching, the SQLite file's directory there.
    ``warn`` hears what is allowed but unwise (short tokens, a file holding
    tokens that others may read). Returns the tokens read, by credential
    (``where``); raises ``ConfigError`` listing every problem."""
    env = os.environ if environ is None else environ
    errors: list[str] = []
    tokens: dict[str, str] = {}
    owners: dict[str, str] = {}
    for credential in config.tokens:
        if credential.token_env is not None:
            value = env.get(credential.token_env)
            if value is None:
                errors.append(f"{credential.where}.token_env: the environment variable "
                              f"{credential.token_env} is not set")
                continue
            value = value.strip()
            what = f"{credential.where} (from {credential.token_env})"
        else:
            assert credential.token is not None
            value = credential.token
            what = credential.where
        if len(value) < MIN_TOKEN:
            errors.append(f"{what}: the token has {len(value)} characters; at least {MIN_TOKEN} are needed "
                          f"(use 32 random characters, e.g. openssl rand -hex 16)")
            continue
        if value in owners:
            errors.append(f"{what}: the token is the same as that of {owners[value]}; every token must be unique")
            continue
        if len(value) < GOOD_TOKEN and warn is not None:
            warn(f"{what}: the token has only {len(value)} characters; use at least {GOOD_TOKEN} random ones")
        owners[value] = what
        tokens[credential.where] = value
    allowed = insecure_no_auth or config.server.insecure_no_auth
    if not config.auth_enabled and not allowed:
        for key, host in (("server.grpc_addr", config.server.grpc_host),
                          ("server.http_addr", config.server.http_host),
                          ("server.metrics_addr", config.server.metrics_host)):
            if host is not None and not is_loopback(host):
                errors.append(f"{key}: {host} is not a loopback address and no credentials are configured "
                              f"([[auth.tokens]] or [[auth.certs]]); configure them, or pass "
                              f"--insecure-no-auth on a trusted network")
    if config.store.kind == "postgres" and config.store.url is None:
        assert config.store.url_env is not None
        if not env.get(config.store.url_env):
            errors.append(f"store.url_env: the environment variable {config.store.url_env} is not set")
    if config.server.tls is not None:
        errors += _tls_errors(config.server.tls)
    if config.store.kind == "sqlite" and config.store.path is not None:
        directory = os.path.dirname(os.path.abspath(config.store.path))
        if not os.path.isdir(directory):
            errors.append(f"store.path: the directory {directory} does not exist")
    if warn is not None and config.source is not None and any(c.token is not None for c in config.tokens):
        try:
            mode = os.stat(config.source).st_mode
        except OSError:
            mode = 0
        if mode & 0o077:
            warn(f"{config.source} holds tokens and may be read by other users (mode {mode & 0o777:o}): "
                 f"chmod 600 it, or give the tokens with token_env")
    if errors:
        raise ConfigError(errors)
    return tokens
