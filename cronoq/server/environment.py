"""What the configuration file alone cannot tell, checked by startup and by
``cronoq-server --check`` alike: the environment's variables, the tokens,
listeners off loopback without credentials, the TLS files, the SQLite
file's directory."""

from __future__ import annotations

import os
from typing import Callable, Mapping

from ..loopback import is_loopback
from .config import GOOD_TOKEN, MIN_TOKEN, ConfigError, ServerConfig, TlsConfig

__all__ = ["check_environment"]


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
    config = config.for_shard()   # (a shard's own store path)
    errors: list[str] = []
    tokens: dict[str, str] = {}
    owners: dict[str, str] = {}
    for pool in config.pools:
        variable = pool.scaler.token_env
        if variable is not None and not env.get(variable, "").strip():
            errors.append(f"pool {pool.name!r}: scaler.token_env: the environment variable {variable} is not set "
                          f"(the webhook's bearer token)")
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
    peer = config.server.peer_tls
    if peer is not None:
        for key, path in (("ca", peer.ca), ("cert", peer.cert), ("key", peer.key)):
            if path is not None and not os.path.isfile(path):
                errors.append(f"server.peer_tls.{key}: no such file: {path}")
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
