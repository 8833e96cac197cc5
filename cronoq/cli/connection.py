"""How ``cronoq`` reaches the server: ``--server`` (or ``$CRONOQ_SERVER``),
or ``--env NAME`` of the catalog of environments (``--environments FILE``,
``$CRONOQ_ENVIRONMENTS``, or environments.toml of the user's configuration
directory), the token from ``$CRONOQ_TOKEN`` (never a flag: a command line
is visible to the machine's other users; with ``--env prod``,
``$CRONOQ_TOKEN_PROD`` first), and TLS files. ``settings_from`` checks them
without importing grpc; ``Connection`` is the channel and stubs (the grpc
part, imported when a command needs the server)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..environments import CatalogError, Environment, load_catalog
from ..loopback import is_loopback
from .exits import CliError, ExitCode

__all__ = ["Settings", "add_connection_arguments", "settings_from", "SERVER_ENV", "TOKEN_ENV", "CA_ENV",
           "CERT_ENV", "KEY_ENV", "DEFAULT_SERVER", "ENVIRONMENTS_ENV", "is_loopback", "catalog_path",
           "read_catalog", "environment_named", "token_variable"]

SERVER_ENV = "CRONOQ_SERVER"
TOKEN_ENV = "CRONOQ_TOKEN"
CA_ENV = "CRONOQ_TLS_CA"
CERT_ENV = "CRONOQ_TLS_CERT"
KEY_ENV = "CRONOQ_TLS_KEY"
ENVIRONMENTS_ENV = "CRONOQ_ENVIRONMENTS"
DEFAULT_SERVER = "http://127.0.0.1:7070"
DEFAULT_PORT = 7070
DEFAULT_RETRY_FOR = 10.0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection options. Their defaults are SUPPRESS, so that the same
    options on the main parser and on a subcommand do not overwrite each
    other; ``settings_from`` applies the real defaults."""
    group = parser.add_argument_group("connection (the token comes from $CRONOQ_TOKEN, never from a flag)")
    group.add_argument("--server", metavar="URL", default=argparse.SUPPRESS,
                       help=f"the server's gRPC address: https://HOST:PORT, http://HOST:PORT or HOST:PORT "
                            f"(${SERVER_ENV}; default {DEFAULT_SERVER})")
    group.add_argument("--env", metavar="NAME", default=argparse.SUPPRESS,
                       help="the server of this environment of the catalog (its grpc target); instead of "
                            "--server. The token: $CRONOQ_TOKEN_NAME (upper-case, - as _), else $CRONOQ_TOKEN")
    group.add_argument("--environments", metavar="FILE", default=argparse.SUPPRESS,
                       help=f"the catalog of environments (${ENVIRONMENTS_ENV}; default "
                            f"$XDG_CONFIG_HOME/cronoq/environments.toml, that is ~/.config/cronoq/environments.toml)")
    group.add_argument("--tls-ca", metavar="PEM", default=argparse.SUPPRESS,
                       help=f"verify the server with this CA certificate instead of the system's (${CA_ENV})")
    group.add_argument("--tls-cert", metavar="PEM", default=argparse.SUPPRESS,
                       help=f"client certificate for mTLS, with --tls-key (${CERT_ENV})")
    group.add_argument("--tls-key", metavar="PEM", default=argparse.SUPPRESS,
                       help=f"the client certificate's private key (${KEY_ENV})")
    group.add_argument("--retry-for", metavar="SECONDS", type=float, default=argparse.SUPPRESS,
                       help=f"retry calls answered 'unavailable' (a standby, a restart) with backoff for up to "
                            f"this long (default {DEFAULT_RETRY_FOR:g})")


@dataclass(frozen=True)
class Settings:
    url: str                  # as given
    target: str               # host:port for grpc
    host: str
    tls: bool
    token: str | None
    ca: bytes | None
    cert: bytes | None
    key: bytes | None
    retry_for: float

    def warnings(self) -> list[str]:
        if self.token and not self.tls and not is_loopback(self.host):
            return [f"warning: sending the token from ${TOKEN_ENV} over plain http to {self.host}, "
                    f"where anyone on the network path can read it; use https://"]
        return []




def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"cannot read the {what} {path!r}: {exc.strerror or exc}") from None


def catalog_path(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    """Where the catalog of environments is, and what said so."""
    given = getattr(args, "environments", None)
    if given:
        return given, "--environments"
    if environ.get(ENVIRONMENTS_ENV):
        return environ[ENVIRONMENTS_ENV], "$" + ENVIRONMENTS_ENV
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cronoq", "environments.toml"), "the default catalog"


def read_catalog(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, tuple[Environment, ...]]:
    """The catalog's path and environments; a usage error if it cannot be read or is invalid."""
    path, source = catalog_path(args, environ)
    if source == "the default catalog" and not os.path.exists(path):
        raise CliError(ExitCode.USAGE, f"no catalog of environments: {path} does not exist (give --environments "
                                       f"FILE or ${ENVIRONMENTS_ENV}; docs/cli.md#environments)")
    try:
        return path, load_catalog(path)
    except CatalogError as exc:
        raise CliError(ExitCode.USAGE, f"{source}: " + "; ".join(exc.errors)) from None


def environment_named(name: str, args: argparse.Namespace, environ: Mapping[str, str]) -> Environment:
    """The environment ``name`` of the catalog; a usage error listing the known names if it has none."""
    path, catalog = read_catalog(args, environ)
    for environment in catalog:
        if environment.name == name:
            return environment
    raise CliError(ExitCode.USAGE, f"--env {name}: no such environment in {path} (known: "
                                   f"{', '.join(e.name for e in catalog)})")


def token_variable(name: str) -> str:
    """The variable holding the token of environment ``name``: CRONOQ_TOKEN_PROD for prod."""
    return f"{TOKEN_ENV}_{name.upper().replace('-', '_')}"


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """The connection settings of parsed arguments and the environment (flags win)."""
    env = os.environ if environ is None else environ
    env_name = getattr(args, "env", None)
    token_env = TOKEN_ENV
    if env_name is not None:
        if getattr(args, "server", None) is not None:
            raise CliError(ExitCode.USAGE, f"--env {env_name} and --server {args.server} both name the server: "
                                           f"give one of them")
        environment = environment_named(env_name, args, env)
        if environment.grpc is None:
            raise CliError(ExitCode.USAGE, f"--env {env_name}: the catalog gives no grpc target for it (only "
                                           f"http = {environment.http})")
        args = argparse.Namespace(**{**vars(args), "server": environment.grpc})
        if env.get(token_variable(env_name), "").strip():
            token_env = token_variable(env_name)

    def pick(attr: str, name: str) -> tuple[str | None, str]:
        value = getattr(args, attr, None)
        if value is not None:
            return value, "--" + attr.replace("_", "-")
        value = env.get(name) or None
        return value, "$" + name

    url, url_source = pick("server", SERVER_ENV)
    url = (url or DEFAULT_SERVER).strip()
    ca_path, ca_source = pick("tls_ca", CA_ENV)
    cert_path, cert_source = pick("tls_cert", CERT_ENV)
    key_path, key_source = pick("tls_key", KEY_ENV)
    tls_files = [source for path, source in ((ca_path, ca_source), (cert_path, cert_source),
                                             (key_path, key_source)) if path]

    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    scheme = scheme.lower()
    if scheme not in ("", "http", "https"):
        raise CliError(ExitCode.USAGE, f"{url_source}: the server is http://HOST:PORT or https://HOST:PORT, "
                                       f"got {url!r}")
    parts = urlsplit("//" + rest)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or parts.path.strip("/") or parts.query or parts.fragment or parts.username or parts.password:
        raise CliError(ExitCode.USAGE, f"{url_source}: the server is http://HOST:PORT or https://HOST:PORT, "
                                       f"got {url!r}")
    if scheme == "http" and tls_files:
        raise CliError(ExitCode.USAGE, f"{', '.join(tls_files)} given with the plain http:// server {url!r}: "
                                       f"use https:// (the TLS settings are refused rather than ignored)")
    if (cert_path is None) != (key_path is None):
        raise CliError(ExitCode.USAGE, "a client certificate needs both --tls-cert and --tls-key "
                                       f"(or ${CERT_ENV} and ${KEY_ENV})")
    tls = scheme == "https" or bool(tls_files)
    display_host = f"[{host}]" if ":" in host else host
    target = f"{display_host}:{port or DEFAULT_PORT}"

    token = env.get(token_env, "").strip() or None
    if token is not None and not (token.isascii() and token.isprintable()):
        raise CliError(ExitCode.USAGE, f"${token_env} must be printable ASCII")
    retry_for = getattr(args, "retry_for", None)
    retry_for = DEFAULT_RETRY_FOR if retry_for is None else retry_for
    if not 0 <= retry_for <= 86400:
        raise CliError(ExitCode.USAGE, f"--retry-for must be between 0 and 86400 seconds, got {retry_for:g}")
    return Settings(url=url, target=target, host=host, tls=tls, token=token,
                    ca=_read(ca_path, "CA certificate") if ca_path else None,
                    cert=_read(cert_path, "client certificate") if cert_path else None,
                    key=_read(key_path, "client key") if key_path else None, retry_for=retry_for)


def channel_options() -> list[tuple[str, Any]]:
    return [("grpc.primary_user_agent", "cronoq-cli")]
