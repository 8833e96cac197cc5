"""The operator's configuration file (TOML): the servers a scaler may name,
each with its URL and where its metrics token is. Tokens come from files
(a mounted Secret) or the environment, never from the Kubernetes API, so
the operator needs no access to Secrets.

    read_timeout_s = 10          # optional: one snapshot read, at most

    [[servers]]
    name = "main"
    url = "http://cronoq.cronoq:7070"      # the server's gRPC address; https:// for TLS
    token_file = "/etc/cronoq-operator/tokens/main/token"   # or token_env = "VAR"
    ca_file = "/etc/cronoq-operator/ca/main/ca.crt"         # optional, with https://
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["OperatorConfig", "ServerEntry", "load_config", "parse_config", "ConfigError"]

_SERVER_KEYS = {"name", "url", "token_file", "token_env", "ca_file"}
_TOP_KEYS = {"servers", "read_timeout_s"}


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class ServerEntry:
    name: str
    url: str
    token_file: str | None = None
    token_env: str | None = None
    ca_file: str | None = None

    def token(self) -> str | None:
        """The token as it is now: read each time, so a rotated Secret is picked up."""
        if self.token_file is not None:
            return Path(self.token_file).read_text().strip() or None
        if self.token_env is not None:
            return os.environ.get(self.token_env) or None
        return None


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    servers: Mapping[str, ServerEntry]
    read_timeout_s: float = 10.0


def parse_config(data: Mapping[str, Any]) -> OperatorConfig:
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(sorted(unknown))}")
    timeout = data.get("read_timeout_s", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise ConfigError(f"read_timeout_s: must be a number of seconds in (0, 300], got {timeout!r}")
    entries = data.get("servers", [])
    if not isinstance(entries, list):
        raise ConfigError("servers: must be an array of tables ([[servers]])")
    servers: dict[str, ServerEntry] = {}
    for index, entry in enumerate(entries):
        where = f"servers[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table")
        unknown = set(entry) - _SERVER_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}")
        for key in _SERVER_KEYS:
            if key in entry and (not isinstance(entry[key], str) or not entry[key]):
                raise ConfigError(f"{where}.{key}: must be a non-empty string")
        for key in ("name", "url"):
            if key not in entry:
                raise ConfigError(f"{where}.{key}: required")
        if "token_file" in entry and "token_env" in entry:
            raise ConfigError(f"{where}: at most one of token_file and token_env")
        if entry["name"] in servers:
            raise ConfigError(f"{where}.name: {entry['name']!r} is named twice")
        if "ca_file" in entry and not entry["url"].startswith("https://"):
            raise ConfigError(f"{where}.ca_file: needs an https:// url")
        servers[entry["name"]] = ServerEntry(**entry)
    return OperatorConfig(servers=servers, read_timeout_s=float(timeout))


def load_config(path: str | os.PathLike[str]) -> OperatorConfig:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_config(data)
