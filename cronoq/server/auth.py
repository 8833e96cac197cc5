"""Who is calling: bearer tokens and client certificates mapped to roles.

Tokens are kept only as SHA-256 digests and compared in constant time (every
configured digest is compared, whichever matches). A bearer token, when
present, takes precedence over a client certificate's mapping. Without any
credential configured, authentication is off and every caller is an admin
(the server then listens on loopback only, unless told otherwise).

A ``Principal`` answers the authorization questions of the service layer:
``require(role)`` (admin passes every check), ``sees(pool)`` (a credential
scoped to ``pools`` sees only those) and ``owns(tenant)`` (a credential
pinned to a tenant sees only that tenant's tasks).

Failures are counted, logged at WARNING with the caller's address (never
the token), at most one line per address every ``_LOG_EVERY_S`` (the lines
in between are counted in the next one), and limited per address: an
address that failed more than ``_BURST`` times refills one failure a second,
and beyond that its failing requests are answered RESOURCE_EXHAUSTED (429)
instead of UNAUTHENTICATED. A valid credential is never refused by the
limit, so one client with a stale token cannot lock out the others behind
the same proxy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable

from .config import Credential, ServerConfig
from .counters import ServerCounters
from .errors import Code, ServiceError

__all__ = ["Principal", "Authenticator", "ANONYMOUS_ADMIN", "FailureLimiter"]

log = logging.getLogger("cronoq.server")

_BURST = 20.0            # failures an address may have at once
_REFILL_PER_S = 1.0      # and then this many a second
_LOG_EVERY_S = 10.0      # at most one log line per address this often
_PEERS_KEPT = 10_000     # addresses remembered (the least recently failing forgotten first)


@dataclass(frozen=True)
class Principal:
    role: str
    pools: frozenset[str] | None = None      # None: every pool
    tenant: str | None = None
    labels: frozenset[tuple[str, str]] | None = None
    name: str = "anonymous"
    # Kept only by sharded servers, to forward a call as its caller (cronoq.server.shards).
    token: str | None = dataclasses.field(default=None, repr=False, compare=False)
    by_cert: bool = False        # authenticated by a client certificate: nothing to forward
    forwarded: bool = False      # another shard's server forwarded this call

    def require(self, role: str) -> None:
        """PERMISSION_DENIED unless this caller has ``role`` (or is an admin)."""
        if self.role != role and self.role != "admin":
            raise ServiceError(Code.PERMISSION_DENIED,
                               f"this call needs the {role} role; the credential has the {self.role} role")

    def sees(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools

    def owns(self, tenant: str | None) -> bool:
        """Whether a task of ``tenant`` is this caller's to see (always, unless pinned)."""
        return self.tenant is None or tenant == self.tenant

    def visible(self, pools: Iterable[str]) -> list[str]:
        return [p for p in pools if self.sees(p)]


ANONYMOUS_ADMIN = Principal("admin", name="anonymous (authentication is off)")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class FailureLimiter:
    """Failed authentications per address: a budget and a quiet log (see the
    module docstring). ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(self, counters: ServerCounters | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.counters = counters if counters is not None else ServerCounters()
        self.clock = clock
        # address -> [failures budget left, when it was counted, when last logged, failures not yet logged]
        self.peers: OrderedDict[str, list[float]] = OrderedDict()

    def failed(self, peer: str, transport: str, reason: str, message: str) -> ServiceError:
        """Count a failure; the error to answer it with."""
        now = self.clock()
        state = self.peers.get(peer)
        if state is None:
            state = [_BURST, now, now - _LOG_EVERY_S, 0.0]
            self.peers[peer] = state
            if len(self.peers) > _PEERS_KEPT:
                self.peers.popitem(last=False)
        else:
            self.peers.move_to_end(peer)
            state[0] = min(_BURST, state[0] + (now - state[1]) * _REFILL_PER_S)
            state[1] = now
        limited = state[0] < 1.0
        if not limited:
            state[0] -= 1.0
        self.counters.auth_failed(transport, "rate_limited" if limited else reason)
        if now - state[2] >= _LOG_EVERY_S:
            more = int(state[3])
            log.warning("authentication failed from %s (%s): %s%s", peer or "an unknown address", transport,
                        message, f" (and {more} more since the last such line)" if more else "",
                        extra={"action": "auth_failed", "peer": peer, "reason": reason})
            state[2] = now
            state[3] = 0.0
        else:
            state[3] += 1.0
        if limited:
            wait = (1.0 - state[0]) / _REFILL_PER_S
            return ServiceError(Code.RESOURCE_EXHAUSTED,
                                f"too many failed authentications from {peer or 'this address'}; retry in "
                                f"{max(1, round(wait))} s with valid credentials", retry_after_s=wait)
        return ServiceError(Code.UNAUTHENTICATED, message)


class Authenticator:
    """Maps a bearer token or a certificate's DNS names to a ``Principal``."""

    def __init__(self, config: ServerConfig, tokens: dict[str, str], *,
                 counters: ServerCounters | None = None, limiter: FailureLimiter | None = None) -> None:
        """``tokens``: the token of each [[auth.tokens]] entry, by its ``where``
        (as ``check_environment`` returns them); only their digests are kept."""
        self.enabled = config.auth_enabled
        self.keep_tokens = bool(config.shards)   # a sharded server forwards calls with them
        self.limiter = limiter if limiter is not None else FailureLimiter(counters)
        self._tokens: list[tuple[bytes, Principal]] = []
        for credential in config.tokens:
            token = tokens.get(credential.where)
            if token is not None:
                self._tokens.append((_digest(token), self._principal(credential)))
        self._certs = {c.dns_name: self._principal(c) for c in config.certs if c.dns_name}

    @staticmethod
    def _principal(credential: Credential) -> Principal:
        return Principal(credential.role, credential.pools, credential.tenant, credential.labels,
                         credential.name or credential.where)

    def authenticate(self, authorization: str | None, dns_names: Iterable[str] = (), *, peer: str = "",
                     transport: str = "http") -> Principal:
        """The caller of a request with this ``authorization`` header value
        and, with mTLS, the DNS names of its verified certificate, from the
        address ``peer``; UNAUTHENTICATED (or RESOURCE_EXHAUSTED, see the
        module docstring) otherwise."""
        if not self.enabled:
            return ANONYMOUS_ADMIN
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise self.limiter.failed(peer, transport, "malformed",
                                          "the authorization header must be 'Bearer <token>'")
            digest = _digest(token)
            found: Principal | None = None
            for known, principal in self._tokens:   # all of them: no early exit
                if hmac.compare_digest(known, digest):
                    found = principal
            if found is None:
                raise self.limiter.failed(peer, transport, "invalid_token", "the token is not valid")
            return dataclasses.replace(found, token=token) if self.keep_tokens else found
        names = list(dns_names)
        for name in names:
            mapped = self._certs.get(name)
            if mapped is not None:
                return dataclasses.replace(mapped, by_cert=True) if self.keep_tokens else mapped
        if self._certs:
            raise self.limiter.failed(
                peer, transport, "unmapped_certificate" if names else "no_credentials",
                "no credentials: send 'authorization: Bearer <token>' or a client certificate whose DNS name is "
                "mapped in [[auth.certs]]")
        raise self.limiter.failed(peer, transport, "no_credentials",
                                  "no credentials: send 'authorization: Bearer <token>'")
