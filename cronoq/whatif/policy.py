"""Scheduling policies as plain data, and the policy file of a what-if run.

A *policy* is what a replay varies: the pools (capacity, autoscaling,
overflow, retries, tenant weights...), the shared resources and the
engine-wide priority settings. It is written as nested tables (TOML in a
policy file, JSON in a trace's header) and turned into the engine's
configuration objects here, with errors that name the offending key.

The policy file (see docs/whatif.md)::

    [replay]                 # defaults for every variant
    durations = "trace"      # or "sampled"
    seed = 1
    start_delay = 0.0        # seconds from a dispatch to its attempt's start

    [durations]              # seconds per kind, for attempts with no recorded run time
    report = 0.6

    [base]                   # changes to the recorded policy, for every variant
    pools.app.max = 16

    [[variant]]
    name = "as recorded"

    [[variant]]
    name = "bigger app pool"
    pools.app.max = 32
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..core.types import (
    CLASSES, MAX_SECONDS, NS, AutoscaleConfig, CoreConfig, PoolConfig, PriorityConfig, ResourceConfig,
    RetryPolicy, UrgencyConfig,
)

__all__ = ["PolicyError", "Variant", "PolicyFile", "load_policy_file", "parse_policy_file", "policy_of",
           "with_live_capacity",
           "pool_to_dict", "resource_to_dict", "core_to_dict", "build", "merge", "DURATION_MODES"]

DURATION_MODES = ("trace", "sampled")


class PolicyError(ValueError):
    """A policy (a policy file, a trace's header) that cannot be used; the
    message names the place and the key."""


# ---------------------------------------------------------------- objects -> data

def _seconds_or_none(ns: int | None) -> float | None:
    return None if ns is None else ns / NS


def _class_map(table: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    return {CLASSES[c]: value for c, value in enumerate(table) if value is not None}


def retry_to_dict(retry: RetryPolicy) -> dict[str, Any]:
    return {"max_attempts": retry.max_attempts, "initial_backoff": retry.initial_backoff,
            "multiplier": retry.multiplier, "max_backoff": retry.max_backoff, "jitter": retry.jitter}


def autoscale_to_dict(cfg: AutoscaleConfig) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(cfg, name) for name in _AUTOSCALE_FIELDS if name != "slo"}
    slo = _class_map(cfg.slo)
    if slo:
        out["slo"] = slo
    return out


def pool_to_dict(cfg: PoolConfig) -> dict[str, Any]:
    """A pool's configuration as policy data (None values left out)."""
    out: dict[str, Any] = {"min": cfg.min, "max": cfg.max, "initial": cfg.initial,
                           "autoscale": autoscale_to_dict(cfg.autoscale) if cfg.autoscale else False}
    if cfg.external_capacity:
        out["external_capacity"] = True
    if cfg.lease_ttl_ns is not None:
        out["lease_ttl"] = cfg.lease_ttl_ns / NS
    if cfg.max_pending_total is not None:
        out["max_pending"] = cfg.max_pending_total
    elif any(v is not None for v in cfg.max_pending_class):
        out["max_pending"] = _class_map(cfg.max_pending_class)
    out["overflow"] = cfg.overflow
    out["retry"] = retry_to_dict(cfg.retry)
    out["unknown_dependency"] = cfg.unknown_dependency
    if cfg.await_timeout_ns is not None:
        out["await_timeout"] = cfg.await_timeout_ns / NS
    out["default_duration"] = cfg.default_duration_ns / NS
    out["reservable_fraction"] = cfg.reservable_fraction
    if cfg.tenant_weights:
        out["tenant_weights"] = dict(cfg.tenant_weights)
    out["fair_share"] = cfg.fair_share
    return out


def resource_to_dict(cfg: ResourceConfig) -> dict[str, Any]:
    if cfg.kind == "semaphore":
        return {"kind": "semaphore", "permits": cfg.permits}
    return {"kind": "token_bucket", "rate": cfg.rate, "burst": cfg.burst}


def core_to_dict(cfg: CoreConfig) -> dict[str, Any]:
    """The engine-wide settings a replay uses (metrics and persistence are the replay's own)."""
    out: dict[str, Any] = {
        "priority": {"base": list(cfg.priority.base), "aging_rate": list(cfg.priority.aging_rate),
                     "age_cap": list(cfg.priority.age_cap)},
        "urgency": {name: getattr(cfg.urgency, name) for name in ("peak", "window", "overdue_rate",
                                                                   "overdue_cap")},
        "retention": cfg.retention_ns / NS,
        "retention_max": cfg.retention_max,
        "max_hold": cfg.max_hold_ns / NS,
    }
    if cfg.max_pending_total is not None:
        out["max_pending_total"] = cfg.max_pending_total
    if isinstance(cfg.seed, int) and not isinstance(cfg.seed, bool):
        out["seed"] = cfg.seed
    return out


def policy_of(pools: list[PoolConfig], resources: list[ResourceConfig], config: CoreConfig) -> dict[str, Any]:
    """The policy data of a scheduler's configuration."""
    out = core_to_dict(config)
    out["pools"] = {p.name: pool_to_dict(p) for p in pools}
    out["resources"] = {r.name: resource_to_dict(r) for r in resources}
    return out


def with_live_capacity(policy: Mapping[str, Any] | None, samples: Sequence[tuple[int, Mapping[str, Any]]]
                       ) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """``policy`` with each pool whose capacity the engine does not set
    (``autoscale`` false, or ``external_capacity``: its autoscaler only
    asks) started at the capacity it had live (the median of the recorder's
    samples while it had tasks running or pending), when that differs from
    its ``initial``: such a pool's capacity came from outside the engine
    (remote workers registering with cronoq-server, calls to
    ``set_capacity``), which a replay does not repeat. Also returns the
    capacities so set, by pool."""
    if policy is None or not samples:
        return (None if policy is None else dict(policy)), {}
    out = copy.deepcopy(dict(policy))
    changed: dict[str, int] = {}
    pools = out.get("pools")
    if not isinstance(pools, dict):
        return out, changed
    for name, pool in pools.items():
        if not isinstance(pool, dict) or (pool.get("autoscale", False) is not False
                                          and pool.get("external_capacity") is not True):
            continue
        rows = [row[name] for _, row in samples if name in row]
        busy = [r for r in rows if r[2] or r[3]]   # while it had work: before and after, it may be empty
        seen = sorted(r[0] for r in (busy or rows))
        if not seen:
            continue
        live = int(seen[(len(seen) - 1) // 2])
        low, high = pool.get("min", 0), pool.get("max", live)
        if isinstance(low, int) and isinstance(high, int):
            live = max(low, min(high, live))
        if live != pool.get("initial"):
            pool["initial"] = live
            changed[name] = live
    return out, changed


# ---------------------------------------------------------------- data -> objects

_AUTOSCALE_FIELDS = ("interval", "target_utilization", "drain_time", "slo", "reservation_horizon",
                     "max_step_up_ratio", "max_step_up_abs", "stabilization_window", "cooldown",
                     "max_step_down", "cost_per_worker_second")
_RETRY_FIELDS = ("max_attempts", "initial_backoff", "multiplier", "max_backoff", "jitter")
_POOL_FIELDS = ("min", "max", "initial", "autoscale", "lease_ttl", "max_pending", "overflow", "retry",
                "unknown_dependency", "await_timeout", "default_duration", "reservable_fraction",
                "tenant_weights", "fair_share", "external_capacity")
_OPTIONAL_POOL_FIELDS = ("lease_ttl", "max_pending", "await_timeout", "tenant_weights")   # false: none
_RESOURCE_FIELDS = ("kind", "permits", "rate", "burst")
_PRIORITY_FIELDS = ("base", "aging_rate", "age_cap")
_URGENCY_FIELDS = ("peak", "window", "overdue_rate", "overdue_cap")
_TOP_FIELDS = ("pools", "resources", "priority", "urgency", "retention", "retention_max", "max_hold",
               "max_pending_total", "seed")


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where} must be a table, got {type(value).__name__}")
    return dict(value)


def _known(table: Mapping[str, Any], fields: tuple[str, ...], where: str) -> None:
    unknown = [k for k in table if k not in fields]
    if unknown:
        raise PolicyError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(k) for k in unknown)} (known: {', '.join(fields)})")


def _retry(value: object, where: str) -> RetryPolicy:
    table = _table(value, where)
    _known(table, _RETRY_FIELDS, where)
    try:
        return RetryPolicy(**table)
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _autoscale(value: object, where: str) -> AutoscaleConfig | bool:
    if value is False:
        return False
    if value is True:
        return AutoscaleConfig()
    table = _table(value, where)
    _known(table, _AUTOSCALE_FIELDS, where)
    try:
        return AutoscaleConfig(**table)
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _pool(name: str, value: object, where: str) -> PoolConfig:
    table = _table(value, where)
    _known(table, _POOL_FIELDS, where)
    options: dict[str, Any] = {}
    for key, item in table.items():
        if key in _OPTIONAL_POOL_FIELDS and item is False:
            continue   # "false" undoes a setting of the recorded policy
        if key == "autoscale":
            options[key] = _autoscale(item, f"{where}.autoscale")
        elif key == "retry":
            options[key] = _retry(item, f"{where}.retry")
        else:
            options[key] = item
    try:
        return PoolConfig(name, **options)
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _resource(name: str, value: object, where: str) -> ResourceConfig:
    table = _table(value, where)
    _known(table, _RESOURCE_FIELDS, where)
    kind = table.get("kind")
    if kind is None:
        kind = "semaphore" if "permits" in table else "token_bucket"
    extra: list[str]
    if kind == "semaphore":
        extra = [k for k in ("rate", "burst") if k in table]
    elif kind == "token_bucket":
        extra = [k for k in ("permits",) if k in table]
    else:
        raise PolicyError(f"{where}.kind must be 'semaphore' or 'token_bucket', got {kind!r}")
    if extra:
        raise PolicyError(f"{where}: a {kind} has no {', '.join(extra)}")
    try:
        return ResourceConfig(name, kind, permits=table.get("permits"), rate=table.get("rate"),
                              burst=table.get("burst"))
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _per_class(value: object, base: tuple[float, ...], where: str) -> list[float]:
    """A four-value list (critical, high, normal, low), or a table of class names."""
    out = list(base)
    if isinstance(value, Mapping):
        for name, item in value.items():
            if name not in CLASSES:
                raise PolicyError(f"{where}: unknown class {name!r} (known: {', '.join(CLASSES)})")
            out[CLASSES.index(name)] = item
    elif isinstance(value, list) and len(value) == 4:
        out = list(value)
    else:
        raise PolicyError(f"{where} must be four numbers (critical, high, normal, low) or a table of classes")
    for c, item in enumerate(out):
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 0:
            raise PolicyError(f"{where}[{CLASSES[c]}] must be a number >= 0, got {item!r}")
    return [float(v) for v in out]


def build(policy: Mapping[str, Any], *, seed: int, where: str = "policy"
          ) -> tuple[CoreConfig, list[PoolConfig], list[ResourceConfig]]:
    """The engine's configuration for ``policy`` (a replay's: its metrics
    window spans any trace, and nothing is persisted)."""
    _known(policy, _TOP_FIELDS, where)
    pools_table = _table(policy.get("pools", {}), f"{where}.pools")
    if not pools_table:
        raise PolicyError(f"{where} names no pool: record the trace with cronoq.whatif.TraceRecorder "
                          f"(its header keeps the pools), or give them in the policy file's [base] table")
    pools = [_pool(name, value, f"{where}.pools.{name}") for name, value in pools_table.items()]
    resources = [_resource(name, value, f"{where}.resources.{name}")
                 for name, value in _table(policy.get("resources", {}), f"{where}.resources").items()]
    defaults = PriorityConfig()
    priority_table = _table(policy.get("priority", {}), f"{where}.priority")
    _known(priority_table, _PRIORITY_FIELDS, f"{where}.priority")
    priority = PriorityConfig(*(_per_class(priority_table[name], getattr(defaults, name), f"{where}.priority.{name}")
                                if name in priority_table else getattr(defaults, name)
                                for name in _PRIORITY_FIELDS))
    urgency_table = _table(policy.get("urgency", {}), f"{where}.urgency")
    _known(urgency_table, _URGENCY_FIELDS, f"{where}.urgency")
    try:
        urgency = UrgencyConfig(**urgency_table)
        config = CoreConfig(
            priority=priority, urgency=urgency,
            retention=policy.get("retention", 3600.0), retention_max=policy.get("retention_max", 1_000_000),
            max_hold=policy.get("max_hold", 300.0),
            max_pending_total=None if policy.get("max_pending_total") in (None, False)
            else policy["max_pending_total"],
            # One bucket as long as the longest duration: the snapshot at the
            # end of a replay covers all of it (the window only feeds metrics).
            metrics_window=float(MAX_SECONDS), metrics_buckets=1, seed=seed)
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"{where}: {exc}") from None
    return config, pools, resources


# ---------------------------------------------------------------- the policy file

def merge(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` laid over it, table by table (a table in
    ``change`` merges into the same table of ``base``; anything else replaces)."""
    out = copy.deepcopy(dict(base))
    for key, value in change.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        elif isinstance(value, Mapping) and key == "autoscale" and out.get(key) is False:
            out[key] = dict(value)   # autoscaling turned on: the defaults, changed by the table
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Variant:
    """One policy to replay a trace with: ``policy`` is the complete policy
    data (the recorded one with the file's changes laid over it)."""

    name: str
    policy: dict[str, Any]
    durations: str = "trace"
    seed: int = 0
    changes: dict[str, Any] = field(default_factory=dict)   # what the file changed, as written
    start_delay: float = 0.0   # seconds between a dispatch and its attempt's start (see replay)

    def build(self) -> tuple[CoreConfig, list[PoolConfig], list[ResourceConfig]]:
        return build(self.policy, seed=self.seed, where=f"variant {self.name!r}")


@dataclass
class PolicyFile:
    """A parsed policy file, before it meets a trace's recorded policy."""

    base: dict[str, Any] = field(default_factory=dict)
    variants: list[dict[str, Any]] = field(default_factory=list)   # name, durations, seed, changes
    durations: str = "trace"
    seed: int | None = None      # None: the recorded scheduler's seed
    start_delay: float = 0.0
    kind_durations: dict[str, float] = field(default_factory=dict)
    where: str = "policy file"

    def variants_for(self, recorded: Mapping[str, Any] | None) -> list[Variant]:
        """Every variant's complete policy, given the trace's recorded one."""
        base = merge(recorded or {}, self.base)
        entries = self.variants or [{"name": "recorded", "changes": {}}]
        out = []
        for entry in entries:
            policy = merge(base, entry["changes"])
            seed = entry.get("seed", self.seed)
            if seed is None:
                recorded_seed = policy.get("seed", 0)
                seed = recorded_seed if isinstance(recorded_seed, int) else 0
            variant = Variant(entry["name"], policy, entry.get("durations", self.durations), seed,
                              entry["changes"], entry.get("start_delay", self.start_delay))
            variant.build()   # every error now, before any replay runs
            out.append(variant)
        return out


_FILE_FIELDS = ("replay", "durations", "base", "variant")
_REPLAY_FIELDS = ("durations", "seed", "start_delay")


def _mode(value: object, where: str) -> str:
    if value not in DURATION_MODES:
        raise PolicyError(f"{where} must be one of {', '.join(DURATION_MODES)}, got {value!r}")
    return str(value)


def _seed(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{where} must be an integer, got {value!r}")
    return value


def _delay(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 3600:
        raise PolicyError(f"{where} must be a number of seconds in [0, 3600), got {value!r}")
    return float(value)


def parse_policy_file(text: str, where: str = "policy file") -> PolicyFile:
    """Parse the TOML text of a policy file (``PolicyError`` on any problem)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{where}: not valid TOML: {exc}") from None
    _known(data, _FILE_FIELDS, where)
    out = PolicyFile(where=where)
    replay = _table(data.get("replay", {}), f"{where} [replay]")
    _known(replay, _REPLAY_FIELDS, f"{where} [replay]")
    if "durations" in replay:
        out.durations = _mode(replay["durations"], f"{where} [replay] durations")
    if "seed" in replay:
        out.seed = _seed(replay["seed"], f"{where} [replay] seed")
    if "start_delay" in replay:
        out.start_delay = _delay(replay["start_delay"], f"{where} [replay] start_delay")
    for kind, seconds in _table(data.get("durations", {}), f"{where} [durations]").items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or not 0 <= seconds <= MAX_SECONDS:
            raise PolicyError(f"{where} [durations] {kind} must be a number of seconds >= 0, got {seconds!r}")
        out.kind_durations[kind] = float(seconds)
    out.base = _table(data.get("base", {}), f"{where} [base]")
    _known(out.base, _TOP_FIELDS, f"{where} [base]")
    variants = data.get("variant", [])
    if not isinstance(variants, list):
        raise PolicyError(f"{where}: variants are written [[variant]], an array of tables")
    names: set[str] = set()
    for i, raw in enumerate(variants):
        spot = f"{where} [[variant]] #{i + 1}"
        table = _table(raw, spot)
        name = table.pop("name", None)
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{spot}: every variant needs a name (name = \"...\")")
        if name in names:
            raise PolicyError(f"{spot}: the name {name!r} is used twice")
        names.add(name)
        entry: dict[str, Any] = {"name": name}
        if "durations" in table:
            entry["durations"] = _mode(table.pop("durations"), f"{spot} durations")
        if "seed" in table:
            entry["seed"] = _seed(table.pop("seed"), f"{spot} seed")
        if "start_delay" in table:
            entry["start_delay"] = _delay(table.pop("start_delay"), f"{spot} start_delay")
        _known(table, _TOP_FIELDS, f"{spot} ({name!r})")
        entry["changes"] = table
        out.variants.append(entry)
    return out


def load_policy_file(path: str | os.PathLike[str]) -> PolicyFile:
    """Read and parse a policy file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise PolicyError(f"cannot read the policy file {os.fspath(path)!r}: {exc.strerror}") from None
    return parse_policy_file(text, os.fspath(path))
