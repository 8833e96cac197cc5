"""Who is calling: bearer tokens and client certificates mapped to roles.

Tokens are kept only as SHA-256 digests and compared in constant time (every
configured digest is compared, whichever matches). A bearer token, when
present, takes precedence over a client certificate's mapping. Without any
credential configured, authentication is off and every caller is an admin
(the server then listens on loopback only, unless told otherwise).

A ``Principal`` answers the authorization questions of the service layer:
``require(role)`` (admin passes every check) and ``sees(pool)`` (a
credential scoped to ``pools`` sees only those).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable

from .config import Credential, ServerConfig
from .errors import Code, ServiceError

__all__ = ["Principal", "Authenticator", "ANONYMOUS_ADMIN"]


@dataclass(frozen=True)
class Principal:
    role: str
    pools: frozenset[str] | None = None      # None: every pool
    tenant: str | None = None
    labels: frozenset[tuple[str, str]] | None = None
    name: str = "anonymous"

    def require(self, role: str) -> None:
        """PERMISSION_DENIED unless this caller has ``role`` (or is an admin)."""
        if self.role != role and self.role != "admin":
            raise ServiceError(Code.PERMISSION_DENIED,
                               f"this call needs the {role} role; the credential has the {self.role} role")

    def sees(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools

    def visible(self, pools: Iterable[str]) -> list[str]:
        return [p for p in pools if self.sees(p)]


ANONYMOUS_ADMIN = Principal("admin", name="anonymous (authentication is off)")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class Authenticator:
    """Maps a bearer token or a certificate's DNS names to a ``Principal``."""

    def __init__(self, config: ServerConfig, tokens: dict[str, str]) -> None:
        """``tokens``: the token of each [[auth.tokens]] entry, by its ``where``
        (as ``check_environment`` returns them); only their digests are kept."""
        self.enabled = config.auth_enabled
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

    def authenticate(self, authorization: str | None, dns_names: Iterable[str] = ()) -> Principal:
        """The caller of a request with this ``authorization`` header value
        and, with mTLS, the DNS names of its verified certificate."""
        if not self.enabled:
            return ANONYMOUS_ADMIN
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise ServiceError(Code.UNAUTHENTICATED, "the authorization header must be 'Bearer <token>'")
            digest = _digest(token)
            found: Principal | None = None
            for known, principal in self._tokens:   # all of them: no early exit
                if hmac.compare_digest(known, digest):
                    found = principal
            if found is None:
                raise ServiceError(Code.UNAUTHENTICATED, "the token is not valid")
            return found
        for name in dns_names:
            mapped = self._certs.get(name)
            if mapped is not None:
                return mapped
        if self._certs:
            raise ServiceError(Code.UNAUTHENTICATED,
                               "no credentials: send 'authorization: Bearer <token>' or a client certificate "
                               "whose DNS name is mapped in [[auth.certs]]")
        raise ServiceError(Code.UNAUTHENTICATED, "no credentials: send 'authorization: Bearer <token>'")
