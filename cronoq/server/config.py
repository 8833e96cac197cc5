"""The server's configuration: one TOML file, every key checked.

``load(path)`` reads the file (``parse(text)`` a string) and returns a
``ServerConfig``, or raises ``ConfigError`` listing every problem found,
each naming its key (``pools[1].lease_ttl_s: ...``). Unknown keys are errors.
Each section is a dataclass whose fields hold the keys' defaults and, with
``key()``, the rule each is read with (msgspec checks the type and bounds,
``Rule.problem`` says what is wrong): written once, and docs/server.md's
tables are held to them (tests/test_vocabulary.py).
What depends on the environment (``token_env`` variables, token lengths,
listening on a non-loopback address without credentials, TLS files) is
checked by ``environment.check_environment``, which startup and
``--check`` both run.

This module imports neither grpc nor the stores, so ``--check`` stays quick.
docs/server.md lists every key with its type, default and range.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.options import (
    CLASSES, KEY_LIMIT, NAME_LIMIT, OPTIONS, OVERFLOW_POLICIES, OVERLAP_POLICIES, RETRY_FIELDS,
    UNKNOWN_DEPENDENCY_POLICIES, VALUE_LIMIT, WIRE_ORDER,
)
from ..core.recurring import CronSchedule
from ..core.types import AutoscaleConfig
from ..environments import NAME_PATTERN, CatalogError, Environment, load_catalog, read_catalog
from ..loopback import is_loopback
from .tomlkeys import YEAR, Rule, Table, describe_value, key, rules

__all__ = ["ConfigError", "ServerConfig", "ServerSection", "ShardSection", "PeerTlsConfig", "GrpcWebConfig", "TlsConfig", "Credential", "StoreConfig",
           "LimitsConfig", "PoolSection", "ResourceSection", "OutputsConfig", "HistorySection", "RecurringSection", "TraceSection",
           "RetrySection", "load", "parse", "default_config", "ROLES", "YEAR", "MIN_TOKEN", "GOOD_TOKEN",
           "Rule", "key", "rules", "split_addr", "is_loopback"]

ROLES = ("client", "worker", "metrics", "admin")
MIN_TOKEN = 16                 # characters; shorter tokens are refused at startup
GOOD_TOKEN = 32                # shorter ones are accepted with a warning


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
class PeerTlsConfig:
    """[server.peer_tls]: how this server checks other shards' https:// endpoints."""

    ca: str | None = None            # None: the system's roots
    cert: str | None = None          # for shards that ask for a client certificate
    key: str | None = None


@dataclass(frozen=True)
class GrpcWebConfig:
    """[server.grpc_web]: gRPC-Web for browsers on the HTTP listener (cronoq.server.grpc_web)."""

    allowed_origins: tuple[str, ...] = ()    # pages (scheme://host[:port], lower-case) answered with CORS


@dataclass(frozen=True)
class ShardSection:
    """One [[shards]] entry."""

    name: str
    number: int
    pools: tuple[str, ...]
    endpoint: str                    # http(s)://host:port of its gRPC listener

    @property
    def secure(self) -> bool:
        return self.endpoint.startswith("https://")

    @property
    def address(self) -> str:
        """``host:port`` of the endpoint."""
        return self.endpoint.partition("://")[2]


@dataclass(frozen=True)
class ServerSection:
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 7070
    http_host: str = "127.0.0.1"
    http_port: int = 7071
    metrics_host: str | None = None     # the optional listener of /metrics without credentials
    metrics_port: int = 0
    shutdown_grace_s: float = key(10.0, "seconds")
    standby_close_s: float = key(1.0, "seconds", 0.1, 60.0)
    insecure_no_auth: bool = key(False, "flag")
    ui: bool = key(True, "flag")        # the web dashboard at /ui on the HTTP listener
    tls: TlsConfig | None = None
    shard: str | None = None            # with [[shards]]: the one this server runs
    insecure_peer_http: bool = key(False, "flag")   # forward tokens over http:// to other hosts
    peer_tls: PeerTlsConfig | None = None
    grpc_web: GrpcWebConfig | None = None   # None: the /cronoq.v1.* paths are not served
    environment: str | None = key(None, "string", limit=63)   # this deployment's name (the catalog's)
    region: str | None = key(None, "string", limit=64)

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
    kind: str = key("memory", "string", choices=("memory", "sqlite", "postgres"))
    path: str | None = None
    url: str | None = None
    url_env: str | None = None
    schema: str = key("public", "string", limit=63)
    keep_finished_s: float = key(7 * 86_400.0, "seconds")
    retention_s: float = key(3600.0, "seconds")
    commit_timeout_s: float = key(30.0, "seconds", above=True)
    lock_poll_s: float = key(0.5, "seconds", high=60.0, above=True)
    lease_ttl_s: float = key(10.0, "seconds", high=3600.0, above=True)
    lease_renew_s: float = key(2.0, "seconds", high=3600.0, above=True)
    full_sync: bool = key(True, "flag")
    keepalive_s: float = key(1.0, "seconds", high=3600.0, above=True)
    session_timeout_s: float = key(10.0, "seconds", high=3600.0, above=True)
    schema_given: bool = False       # (sharded stores default to cronoq_{shard})

    def __repr__(self) -> str:       # a URL may hold a password
        return f"StoreConfig(kind={self.kind!r})"


_MB = 1024 * 1024


@dataclass(frozen=True)
class LimitsConfig:
    max_message_bytes: int = key(16 * _MB, "integer", 64 * 1024, 256 * _MB)
    max_http_body_bytes: int = key(16 * _MB, "integer", 4096, 256 * _MB)
    request_timeout_s: float = key(30.0, "seconds", 0.1)
    max_wait_s: float = key(300.0, "seconds")
    max_tasks_per_batch: int = key(1000, "integer", 1, 100_000)
    max_list: int = key(1000, "integer", 1, 100_000)
    max_deps: int = key(256, "integer", 0, 10_000)
    max_tags: int = key(64, "integer", 0, 1024)
    max_labels: int = key(16, "integer", 0, 256)
    max_resources: int = key(16, "integer", 0, 256)
    max_key_bytes: int = key(KEY_LIMIT, "integer", 1, KEY_LIMIT)
    max_name_bytes: int = key(NAME_LIMIT, "integer", 1, NAME_LIMIT)
    max_value_bytes: int = key(VALUE_LIMIT, "integer", 0, VALUE_LIMIT)
    max_pending_total: int = key(1_000_000, "integer", 1, 1_000_000_000)
    max_slots_per_worker: int = key(1024, "integer", 1, 65_536)
    max_workers: int = key(10_000, "integer", 1, 1_000_000)
    max_watchers: int = key(1024, "integer", 0, 100_000)
    watch_buffer: int = key(4096, "integer", 16, 1_000_000)
    register_timeout_s: float = key(10.0, "seconds", 0.1)
    keepalive_interval_s: float = key(20.0, "seconds", 1.0)
    max_http_connections: int = key(1000, "integer", 1, 1_000_000)
    http_head_timeout_s: float = key(15.0, "seconds", 0.1)
    http_keepalive_timeout_s: float = key(65.0, "seconds", 0.1)
    http_write_timeout_s: float = key(30.0, "seconds", 0.1)


_RETRY_BOUNDS = {"count": ("integer", None, 1_000_000), "seconds": ("seconds", None, None),
                 "factor": ("number", None, 1000.0), "flag": ("flag", None, None)}


def _retry_key(name: str) -> Any:
    f = next(f for f in RETRY_FIELDS if f.wire == name)
    kind, _, high = _RETRY_BOUNDS[f.kind]
    return key(f.default, kind, f.minimum, high)


@dataclass(frozen=True)
class RetrySection:
    """A ``retry`` table: the fields and defaults of ``cronoq.RetryPolicy`` (cronoq.core.options)."""

    max_attempts: int = _retry_key("max_attempts")
    initial_backoff_s: float = _retry_key("initial_backoff_s")
    multiplier: float = _retry_key("multiplier")
    max_backoff_s: float = _retry_key("max_backoff_s")
    jitter: bool = _retry_key("jitter")


_AUTOSCALE = AutoscaleConfig()   # the library's defaults, which server pools share


@dataclass(frozen=True)
class AutoscaleSection:
    """A pool's ``autoscale`` table: the library's queue-pressure policy
    (``cronoq.AutoscaleConfig``), with its defaults; times in seconds."""

    interval_s: float = key(_AUTOSCALE.interval, "seconds", above=True)
    target_utilization: float = key(_AUTOSCALE.target_utilization, "number", 0.0, 1.0, above=True)
    drain_time_s: float = key(_AUTOSCALE.drain_time, "seconds", above=True)
    slo: dict[str, float] | None = None   # class -> the longest wait it should see, seconds
    reservation_horizon_s: float = key(_AUTOSCALE.reservation_horizon, "seconds")
    max_step_up_ratio: float = key(_AUTOSCALE.max_step_up_ratio, "number", 0.0, 1e6)
    max_step_up_abs: int = key(_AUTOSCALE.max_step_up_abs, "integer", 0, 1_000_000)
    stabilization_window_s: float = key(_AUTOSCALE.stabilization_window, "seconds")
    cooldown_s: float = key(_AUTOSCALE.cooldown, "seconds")
    max_step_down: int = key(_AUTOSCALE.max_step_down, "integer", 1, 1_000_000)
    cost_per_worker_second: float = key(_AUTOSCALE.cost_per_worker_second, "number", 0.0, 1e9)

    def policy(self) -> AutoscaleConfig:
        return AutoscaleConfig(
            interval=self.interval_s, target_utilization=self.target_utilization, drain_time=self.drain_time_s,
            slo=self.slo, reservation_horizon=self.reservation_horizon_s, max_step_up_ratio=self.max_step_up_ratio,
            max_step_up_abs=self.max_step_up_abs, stabilization_window=self.stabilization_window_s,
            cooldown=self.cooldown_s, max_step_down=self.max_step_down,
            cost_per_worker_second=self.cost_per_worker_second)


SCALER_KINDS = ("external", "webhook")


@dataclass(frozen=True)
class ScalerSection:
    """A pool's ``scaler``: how its desired capacity reaches whatever starts
    workers. ``external`` exports it (snapshots, /metrics, KEDA's external
    scaler API); ``webhook`` also POSTs ``{"pool", "desired"}`` to ``url``
    each time it changes."""

    kind: str = key("external", "string", choices=SCALER_KINDS)
    url: str | None = None
    token_env: str | None = None       # the variable holding a bearer token for the webhook
    timeout_s: float = key(10.0, "seconds", 0.1, 300.0)


@dataclass(frozen=True)
class PoolSection:
    name: str
    min: int = key(0, "integer", 0, 1_000_000)
    max: int = key(10_000, "integer", 1, 1_000_000)
    lease_ttl_s: float = key(30.0, "seconds", 0.1)
    max_pending: int | dict[str, int] | None = None
    overflow: str = key(OVERFLOW_POLICIES[0], "string", choices=OVERFLOW_POLICIES)
    retry: RetrySection | None = None
    unknown_dependency: str = key(UNKNOWN_DEPENDENCY_POLICIES[0], "string", choices=UNKNOWN_DEPENDENCY_POLICIES)
    await_timeout_s: float | None = key(None, "seconds")
    default_duration_s: float = key(1.0, "seconds")
    reservable_fraction: float = key(0.5, "number", 0.0, 1.0)
    tenant_weights: dict[str, float] | None = None
    fair_share: bool = key(False, "flag")
    autoscale: AutoscaleSection | None = field(default_factory=AutoscaleSection)   # None: autoscale = false
    scaler: ScalerSection = field(default_factory=ScalerSection)


@dataclass(frozen=True)
class ResourceSection:
    name: str
    kind: str
    permits: int | None = key(None, "integer", 1, 1_000_000_000)
    rate: float | None = key(None, "number", 1.0 / (100 * YEAR), 1e9, what="a number of tokens per second")
    burst: int | None = key(None, "integer", 1, 1_000_000_000)
    shard: str | None = None         # with [[shards]]: the one shard that counts it


@dataclass(frozen=True)
class OutputsConfig:
    cache_entries: int = key(10_000, "integer", 0, 10_000_000)
    info_entries: int = key(100_000, "integer", 0, 10_000_000)
    payload_preview_bytes: int = key(1024, "integer", 0, 65_536)


@dataclass(frozen=True)
class HistorySection:
    """[history]: what the serving leader keeps of the recent past (docs/server.md)."""

    interval_s: float = key(1.0, "seconds", low=0.1, high=3600.0)
    kept_s: float = key(3600.0, "seconds", low=1.0, high=7 * 86_400.0)
    events: int = key(1000, "integer", 0, 1_000_000)

    @property
    def samples(self) -> int:
        """Samples kept per pool: ``kept_s`` over ``interval_s``."""
        return max(1, math.ceil(self.kept_s / self.interval_s - 1e-9))


@dataclass(frozen=True)
class TraceSection:
    """[trace]: record the workload for cronoq.whatif (docs/whatif.md)."""

    path: str
    flush_interval_s: float = key(0.5, "seconds", high=3600.0, above=True)
    sample_interval_s: float = key(1.0, "seconds", high=3600.0)
    max_buffer: int = key(1_000_000, "integer", 1, 100_000_000)


@dataclass(frozen=True)
class RecurringSection:
    """A [[recurring]] schedule; ``task`` holds the template's task fields,
    named as in the gRPC TaskSpec (payload given as JSON, text or base64)."""

    name: str
    cron: str
    tz: str = key("UTC", "string", limit=255)
    overlap: str = key(OVERLAP_POLICIES[0], "string", choices=OVERLAP_POLICIES)
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
    shards: tuple[ShardSection, ...] = ()
    all_pools: tuple[PoolSection, ...] = ()   # with shards: every shard's pools (``pools``: this shard's)
    history: HistorySection = field(default_factory=HistorySection)
    environments: tuple[Environment, ...] = ()   # the catalog of deployments ([environments])

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens or self.certs)

    @property
    def shard(self) -> ShardSection | None:
        """This server's shard, if the pools are sharded."""
        return next((s for s in self.shards if s.name == self.server.shard), None)

    def for_shard(self) -> ServerConfig:
        """What this server runs: its shard's pools, resources, schedules
        and store (the namespace filled in). Unsharded: itself."""
        mine = self.shard
        if mine is None or self.all_pools:
            return self
        pools = tuple(p for p in self.pools if p.name in mine.pools)
        resources = tuple(r for r in self.resources if r.shard == mine.name)
        recurring = tuple(r for r in self.recurring if r.task.get("pool", self.default_pool) in mine.pools)
        store = self.store
        if store.kind == "sqlite" and store.path:
            store = replace(store, path=store.path.replace("{shard}", mine.name))
        elif store.kind == "postgres":
            schema = store.schema if store.schema_given else "cronoq_{shard}"
            store = replace(store, schema=schema.replace("{shard}", mine.name))
        return replace(self, pools=pools, resources=resources, recurring=recurring, store=store,
                       all_pools=self.pools)

    @property
    def default_pool(self) -> str:
        """Where a task without a pool goes: ``default`` if there is one, else the first pool."""
        pools = self.all_pools or self.pools
        return "default" if any(p.name == "default" for p in pools) else pools[0].name


def default_config() -> ServerConfig:
    """No file: one pool ``default``, in-memory state, loopback, no auth."""
    return ServerConfig()


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


# ---------------------------------------------------------------- sections


_ORIGIN = re.compile(r"(https?)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")


def _grpc_web(t: Table) -> GrpcWebConfig:
    origins: list[str] = []
    for i, text in enumerate(t.strings("allowed_origins", limit=512) or ()):
        origin = text.strip().lower()
        match = _ORIGIN.fullmatch(origin)
        if match is None:
            t.error(f"allowed_origins[{i}]", f"must be an origin, scheme://host[:port] (http or https, no path "
                                             f"and no trailing /), got {text[:80]!r}")
            continue
        scheme, _, port = match.groups()
        if port is not None and (not 0 < int(port[1:]) < 65536):
            t.error(f"allowed_origins[{i}]", f"the port must be between 1 and 65535, got {port[1:]}")
            continue
        if port == (":443" if scheme == "https" else ":80"):
            origin = origin[:-len(port)]   # (browsers never send the default port)
        if origin not in origins:
            origins.append(origin)
    t.done()
    return GrpcWebConfig(tuple(origins))


def _server(t: Table | None) -> ServerSection:
    if t is None:
        return ServerSection()
    values: dict[str, Any] = {}
    defaults = ServerSection()
    for key, default in (("grpc_addr", defaults.grpc_addr), ("http_addr", defaults.http_addr)):
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
    values.update(t.section(ServerSection))
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
    values["shard"] = t.string("shard")
    peer = t.table("peer_tls")
    if peer is not None:
        ca, cert, key_path = (peer.string(name, limit=4096) for name in ("ca", "cert", "key"))
        if (cert is None) != (key_path is None):
            peer.errors.append(f"{peer.where}: give both cert and key (a client certificate), or neither")
        peer.done()
        values["peer_tls"] = PeerTlsConfig(ca, cert, key_path)
    web = t.table("grpc_web")
    if web is not None:
        values["grpc_web"] = _grpc_web(web)
    if values.get("grpc_port") and values["grpc_port"] == values.get("http_port") \
            and values["grpc_host"] == values["http_host"]:
        t.error("http_addr", "must differ from grpc_addr")
    if values.get("metrics_port"):
        for other in ("grpc", "http"):
            if (values["metrics_host"], values["metrics_port"]) == (values[f"{other}_host"], values[f"{other}_port"]):
                t.error("metrics_addr", f"must differ from {other}_addr")
    environment = values.get("environment")
    if environment is not None and not re.match(NAME_PATTERN + r"\Z", environment):
        t.error("environment", f"must match {NAME_PATTERN} (lower-case letters, digits, - and _), "
                               f"got {environment!r}")
        values["environment"] = None
    t.done()
    return ServerSection(**values)


def _environments(root: Table, source: str | None, server: ServerSection
                  ) -> tuple[ServerSection, tuple[Environment, ...]]:
    """[environments]: the catalog, inline ([environments.NAME] tables) or in
    the file of ``path`` (relative to the configuration file's directory);
    and this server's identity checked against it: server.environment, if
    the catalog is given, is one of its names, and server.region, if both
    give one, is the catalog's (without it, the catalog's is taken)."""
    t = root.table("environments")
    if t is None:
        return server, ()
    catalog: list[Environment] = []
    if t.has("path"):
        path = t.string("path", limit=4096)
        others = [name for name in t.data if name != "path"]
        if others:
            t.errors.append(f"{t.where}: give path (a catalog file) or [environments.NAME] tables, not both "
                            f"(found {', '.join(others)})")
            t.used.update(others)
        elif path is not None:
            if not os.path.isabs(path) and source is not None:
                path = os.path.join(os.path.dirname(os.path.abspath(source)), path)
            try:
                catalog = list(load_catalog(path))
            except CatalogError as exc:
                t.errors.extend(f"{t.path('path')}: {problem}" for problem in exc.errors)
                return server, ()
    else:
        t.used.update(t.data)
        catalog = read_catalog(t.data, t.where, t.errors)
        if not t.data:
            t.errors.append(f"{t.where}: give path (a catalog file) or [environments.NAME] tables")
    t.done()
    if server.environment is not None and catalog:
        mine = next((e for e in catalog if e.name == server.environment), None)
        if mine is None:
            root.errors.append(f"server.environment: {server.environment!r} is not in the catalog "
                               f"(its environments: {', '.join(e.name for e in catalog)})")
        elif mine.region and server.region is not None and server.region != mine.region:
            root.errors.append(f"server.region: {server.region!r} differs from the catalog's region of "
                               f"{mine.name!r} ({mine.region!r})")
        elif mine.region and server.region is None:
            server = replace(server, region=mine.region)
    return server, tuple(catalog)


def _credential(t: Table, pool_names: set[str], kind: str) -> Credential | None:
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
        token = t.typed("token", (str,), "a string")
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


_SQLITE = ("path", "lease_ttl_s", "lease_renew_s", "full_sync")
_POSTGRES = ("url", "url_env", "schema", "keepalive_s", "session_timeout_s")


def _store(t: Table | None) -> StoreConfig:
    if t is None:
        return StoreConfig()
    v = t.section(StoreConfig, only=("kind", "keep_finished_s", "retention_s", "commit_timeout_s", "lock_poll_s"))
    kind = v["kind"]
    if kind == "sqlite":
        path = t.string("path", limit=4096)
        if path is None and not t.has("path"):
            t.error("path", "is required with kind = \"sqlite\"")
        v["path"] = path
        v.update(t.section(StoreConfig, only=_SQLITE))
        if v["lease_renew_s"] >= v["lease_ttl_s"]:
            t.error("lease_renew_s", f"must be shorter than lease_ttl_s ({v['lease_ttl_s']:g})")
    elif kind == "postgres":
        url = t.string("url", limit=4096)
        url_env = t.string("url_env")
        if url is not None and url_env is not None:
            t.errors.append(f"{t.where}: give store.url or store.url_env, not both")
        v["url"] = url
        v["url_env"] = url_env if url_env is not None or url is not None else "DATABASE_URL"
        v.update(t.section(StoreConfig, only=_POSTGRES[2:]))
        v["schema_given"] = t.has("schema")
    t.done({**{key: "applies to kind = \"sqlite\" only" for key in _SQLITE},
            **{key: "applies to kind = \"postgres\" only" for key in _POSTGRES}})
    return StoreConfig(**v)


def _limits(t: Table | None) -> LimitsConfig:
    if t is None:
        return LimitsConfig()
    v = t.section(LimitsConfig)
    t.done()
    return LimitsConfig(**v)


def _retry(t: Table | None) -> RetrySection | None:
    if t is None:
        return None
    v = t.section(RetrySection)
    t.done()
    return RetrySection(**v)


def _name(t: Table, key: str, what: str, limit: int = NAME_LIMIT) -> str | None:
    name = t.string(key, limit=limit)
    if name is None and not t.has(key):
        t.error(key, f"is required ({what})")
    return name


_PENDING = Rule("integer", 0, 1_000_000_000)


def _pool(t: Table) -> PoolSection | None:
    name = _name(t, "name", "the pool's name")
    v = t.section(PoolSection, only=("min", "max", "lease_ttl_s"))
    if v["min"] > v["max"]:
        t.error("min", f"({v['min']}) must not exceed max ({v['max']})")
    if t.has("max_pending"):
        raw = t.raw("max_pending")
        if isinstance(raw, dict):
            table = Table(raw, t.path("max_pending"), t.errors)
            v["max_pending"] = {c: n for c in CLASSES if (n := table.read(c, _PENDING)) is not None}
            table.done()
        elif _PENDING.accepts(raw):
            v["max_pending"] = raw
        else:
            t.error("max_pending", f"must be an integer from 0 to 1000000000 or a table of classes "
                                   f"({', '.join(CLASSES)}), got {describe_value(raw)}")
    v.update(t.section(PoolSection, only=("overflow",)))
    v["retry"] = _retry(t.table("retry"))
    v.update(t.section(PoolSection, only=("unknown_dependency", "await_timeout_s", "default_duration_s",
                                          "reservable_fraction")))
    weights = t.table("tenant_weights")
    if weights is not None:
        weight = Rule("number", 0.0, 1e9, above=True)
        out = {}
        for tenant in weights.data:
            if not Rule("string").accepts(tenant):
                weights.error(tenant, "is not a valid tenant name")
                weights.used.add(tenant)
                continue
            value = weights.read(tenant, weight)
            if value is not None:
                out[tenant] = value
        weights.done()
        v["tenant_weights"] = out
    v.update(t.section(PoolSection, only=("fair_share",)))
    if t.has("autoscale"):
        v["autoscale"] = _autoscale(t)
    scaler = t.table("scaler")
    if scaler is not None:
        v["scaler"] = _scaler(scaler)
    t.done()
    if name is None:
        return None
    return PoolSection(name=name, **v)


def _autoscale(t: Table) -> AutoscaleSection | None:
    """``autoscale = false`` (desired is then the capacity), or a table of the policy's keys."""
    raw = t.raw("autoscale")
    if raw is False:
        return None
    if raw is True:
        return AutoscaleSection()
    table = t.table("autoscale")
    if table is None:
        return AutoscaleSection()
    v = table.section(AutoscaleSection)
    slo = table.table("slo")
    if slo is not None:
        wait = Rule("seconds", 0.0, YEAR, above=True)
        v["slo"] = {c: n for c in CLASSES if (n := slo.read(c, wait)) is not None}
        slo.done()
    table.done()
    return AutoscaleSection(**v)


def _scaler(t: Table) -> ScalerSection:
    v = t.section(ScalerSection)
    url = t.string("url", limit=2048)
    token_env = t.string("token_env")
    if v["kind"] == "webhook":
        if url is None:
            t.error("url", "is required with kind = \"webhook\" (where the desired capacity is POSTed)")
        else:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                t.error("url", f"must be an http:// or https:// URL, got {url!r}")
            elif parts.scheme == "http" and token_env is not None and not is_loopback(parts.hostname):
                t.error("url", f"would send the token of {token_env} over plain http to {parts.hostname}; "
                               f"use https:// (or a loopback address)")
    elif url is not None or token_env is not None:
        t.error("kind", "url and token_env need kind = \"webhook\"")
    t.done()
    return ScalerSection(kind=v["kind"], url=url, token_env=token_env, timeout_s=v["timeout_s"])


def _resource(t: Table) -> ResourceSection | None:
    name = _name(t, "name", "the resource's name")
    shard = t.string("shard")
    kind = t.string("kind", choices=("semaphore", "token_bucket"))
    if kind is None and not t.has("kind"):
        t.error("kind", "is required (semaphore or token_bucket)")
    v: dict[str, Any] = {}
    needed = {"semaphore": ("permits",), "token_bucket": ("rate", "burst")}.get(kind or "", ())
    if needed:
        v = t.section(ResourceSection, only=needed)
        for key in needed:
            if v[key] is None and not t.has(key):
                t.error(key, f"is required for a {kind.replace('_', ' ')}")   # type: ignore[union-attr]
    t.done({"permits": "applies to kind = \"semaphore\" only", "rate": "applies to kind = \"token_bucket\" only",
            "burst": "applies to kind = \"token_bucket\" only"})
    if name is None or kind is None:
        return None
    return ResourceSection(name, kind, **v, shard=shard)


def _outputs(t: Table | None) -> OutputsConfig:
    if t is None:
        return OutputsConfig()
    v = t.section(OutputsConfig)
    t.done({"cache_bytes": "the output cache is bounded by entries (cache_entries) in this version"})
    return OutputsConfig(**v)


# At most this many samples per pool (kept_s / interval_s): a million samples take 184 MB a pool (history.py).
MAX_HISTORY_SAMPLES = 1_000_000


def _history(t: Table | None) -> HistorySection:
    if t is None:
        return HistorySection()
    v = t.section(HistorySection)
    t.done()
    section = HistorySection(**v)
    if section.samples > MAX_HISTORY_SAMPLES:
        t.error("kept_s", f"keeps {section.samples} samples a pool at interval_s = {section.interval_s:g}; at most "
                          f"{MAX_HISTORY_SAMPLES}: shorten kept_s or lengthen interval_s")
    if section.kept_s < section.interval_s:
        t.error("kept_s", f"must be at least interval_s ({section.interval_s:g}), got {section.kept_s:g}")
    return section


def _trace(t: Table | None) -> TraceSection | None:
    if t is None:
        return None
    path = t.string("path", limit=4096)
    if path is None and not t.has("path"):
        t.error("path", "is required: the file the trace is written to")
    v = t.section(TraceSection)
    t.done()
    return None if path is None else TraceSection(path, **v)


# The task fields a recurring template may set, named as on the wire (cronoq.core.options).
_KINDS = ("name", "key", "choice", "seconds", "pairs", "units", "retry")   # the order templates are read in
_TEMPLATE = {opt.wire: opt for opt in sorted((OPTIONS[name] for name in WIRE_ORDER),
                                             key=lambda opt: _KINDS.index(opt.kind) if opt.kind in _KINDS else 99)
             if opt.template and opt.wire is not None and opt.kind in _KINDS}
_NOT_IN_TEMPLATES = {
    "deadline_unix_ns": "a recurring template describes every occurrence: use deadline_in_s",
    "start_in_s": "occurrences start at the cron times", "start_unix_ns": "occurrences start at the cron times",
    "after": "a recurring template may not have dependencies", "deps": "a recurring template may not have dependencies"}


def _template(t: Table, pool_names: set[str], resource_names: set[str]) -> dict[str, Any]:
    """The task fields of a [[recurring]] table, by the rules of their kinds."""
    task: dict[str, Any] = {}
    for wire, opt in _TEMPLATE.items():
        if opt.kind == "name":
            value = t.string(wire)
            if value is not None:
                task[wire] = value
            if wire == "pool" and value is not None and value not in pool_names:
                t.error("pool", f"names unknown pool {value!r}")
        elif opt.kind == "key":
            prefix = t.string(wire, limit=KEY_LIMIT - len("@2000-01-01T00:00:00Z"))
            if prefix is not None:
                task[wire] = prefix
        elif opt.kind == "choice":
            choice = t.string(wire, choices=opt.choices)
            if choice is not None:
                task[wire] = choice
        elif opt.kind == "seconds":
            seconds = t.read(wire, Rule("seconds", 0.0, YEAR))
            if seconds is not None:
                task[wire] = seconds
        elif opt.kind == "pairs":
            mapping = t.string_map(wire)
            if mapping:
                task[wire] = mapping
        elif opt.kind == "units":
            resources = t.table(wire)
            if resources is not None:
                units = {}
                for rname in list(resources.data):
                    if rname not in resource_names:
                        resources.error(rname, "is not a configured resource")
                        resources.used.add(rname)
                        continue
                    value = resources.read(rname, Rule("integer", 1, 1_000_000_000))
                    if value is not None:
                        units[rname] = value
                resources.done()
                task[wire] = units
        elif opt.kind == "retry":
            retry = _retry(t.table(wire))
            if retry is not None:
                task[wire] = retry
    return task


def _recurring(t: Table, pool_names: set[str], resource_names: set[str]) -> RecurringSection | None:
    name = _name(t, "name", "the schedule's name", limit=KEY_LIMIT)
    cron = t.string("cron", limit=1024)
    if cron is None and not t.has("cron"):
        t.error("cron", "is required")
    v = t.section(RecurringSection)
    if cron is not None and v["tz"] is not None:
        try:
            CronSchedule(cron, v["tz"])
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
    task = _template(t, pool_names, resource_names)
    t.done(_NOT_IN_TEMPLATES)
    if name is None or cron is None:
        return None
    return RecurringSection(name, cron, v["tz"], v["overlap"], payload, content_type, task)


def _endpoint(t: Table) -> str | None:
    text = t.string("endpoint", limit=1024)
    if text is None:
        if not t.has("endpoint"):
            t.error("endpoint", "is required: the shard's gRPC address, http(s)://host:port")
        return None
    scheme, sep, rest = text.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in ("http", "https"):
        t.error("endpoint", f"must start with http:// or https://, got {text!r}")
    elif not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535 or "/" in rest:
        t.error("endpoint", f"must be {scheme}://host:port with a port from 1 to 65535, got {text!r}")
    else:
        return text
    return None


def _shards(root: Table, pools: list[PoolSection], resources: list[ResourceSection],
            recurring: list[RecurringSection], server: ServerSection, store: StoreConfig) -> list[ShardSection]:
    """The [[shards]] and every rule tying them to the rest of the file."""
    tables = root.tables("shards")
    pool_names = {p.name for p in pools}
    shards: list[ShardSection] = []
    owner: dict[str, str] = {}
    seen: dict[str, set[Any]] = {"name": set(), "number": set(), "endpoint": set()}
    for t in tables:
        name = _name(t, "name", "the shard's name")
        number = t.read("number", Rule("integer", 1, 255))
        if number is None and not t.has("number"):
            t.error("number", "is required: a number from 1 to 255, unique per shard (it goes in task ids)")
        members = t.strings("pools") or []
        if not members:
            t.error("pools", "must name at least one pool")
        endpoint = _endpoint(t)
        t.done()
        for key_name, value in (("name", name), ("number", number), ("endpoint", endpoint)):
            if value is not None and value in seen[key_name]:
                t.error(key_name, f"duplicate shard {key_name} {value!r}")
                name = None
            elif value is not None:
                seen[key_name].add(value)
        for pool in members:
            if pool not in pool_names:
                t.error("pools", f"names unknown pool {pool!r}")
            elif pool in owner:
                t.error("pools", f"pool {pool!r} is already in shard {owner[pool]!r}: a pool is in one shard")
            elif name is not None:
                owner[pool] = name
        if name is not None and number is not None and endpoint is not None:
            shards.append(ShardSection(name, number, tuple(members), endpoint))
    if not tables:
        if server.shard is not None:
            root.errors.append(f"server.shard: names shard {server.shard!r}, but there are no [[shards]]")
        for r in resources:
            if r.shard is not None:
                root.errors.append(f"resources: {r.name!r} names shard {r.shard!r}, but there are no [[shards]]")
        return []
    if len(shards) < len(tables):
        return shards
    homeless = [p.name for p in pools if p.name not in owner]
    if homeless:
        root.errors.append(f"shards: pools {', '.join(map(repr, homeless))} are in no shard")
    names = [s.name for s in shards]
    if server.shard is None:
        root.errors.append(f"server.shard: is required with [[shards]] (or --shard): one of {', '.join(names)}")
    elif server.shard not in names:
        root.errors.append(f"server.shard: unknown shard {server.shard!r} (the shards: {', '.join(names)})")
    for r in resources:
        if r.shard is None:
            root.errors.append(f"resources: {r.name!r} needs shard = one of {', '.join(names)} (shards do not "
                               f"share counts)")
        elif r.shard not in names:
            root.errors.append(f"resources: {r.name!r} names unknown shard {r.shard!r}")
    home = {r.name: r.shard for r in resources}
    default = "default" if "default" in pool_names else pools[0].name
    for schedule in recurring:
        where = owner.get(schedule.task.get("pool", default))
        for resource in schedule.task.get("resources", ()):
            name = resource if isinstance(resource, str) else resource.get("name") if isinstance(resource, dict) \
                else None
            if name in home and home[name] != where:
                root.errors.append(f"recurring: {schedule.name!r} uses resource {name!r} of shard "
                                   f"{home[name]!r}, but its pool is in shard {where!r}")
    if store.kind == "sqlite" and store.path and "{shard}" not in store.path:
        root.errors.append("store.path: must contain {shard} with [[shards]] (each shard keeps its own file)")
    if store.kind == "postgres" and store.schema_given and "{shard}" not in store.schema:
        root.errors.append("store.schema: must contain {shard} with [[shards]] (default cronoq_{shard})")
    return shards


def parse(text: str, *, source: str | None = None, shard: str | None = None) -> ServerConfig:
    """The configuration in ``text`` (TOML); ``ConfigError`` lists every problem.
    ``shard`` (``--shard``) stands for ``server.shard``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"]) from None
    errors: list[str] = []
    root = Table(data, "", errors)
    server = _server(root.table("server"))
    if shard is not None:
        server = replace(server, shard=shard)
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
    history = _history(root.table("history"))
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
    shards = _shards(root, pools, resources, recurring, server, store)
    server, environments = _environments(root, source, server)
    root.done()
    if errors:
        raise ConfigError(errors)
    return ServerConfig(server, tuple(tokens), tuple(certs), store, limits, tuple(pools), tuple(resources),
                        outputs, tuple(recurring), source, trace, tuple(shards), environments=environments,
                        history=history)


def load(path: str | os.PathLike[str], *, shard: str | None = None) -> ServerConfig:
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
    return parse(text, source=os.fspath(path), shard=shard)
