"""Whether a request came from a page of another site (the HTTP API's
cross-site rule, which gRPC-Web applies to origins it does not list)."""

from __future__ import annotations

__all__ = ["cross_site"]


def cross_site(headers: dict[str, str]) -> str | None:
    """Why a request came from a page of another site, or None: its
    Sec-Fetch-Site says so, or its Origin is not the origin it was sent to
    (the Host, or the X-Forwarded-Host a proxy set; a page cannot set that
    header on a cross-origin request without a preflight, which this server
    never grants)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in ("same-origin", "none"):
        return f"sec-fetch-site: {site[:40]}"
    origin = headers.get("origin")
    if origin is None:
        return None
    scheme, sep, authority = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not authority or "/" in authority:
        return f"origin: {origin[:80]}"
    authority = _without_default_port(scheme, authority)
    for name in ("host", "x-forwarded-host"):
        value = headers.get(name)
        if value is not None:
            for host in value.split(","):
                if _without_default_port(scheme, host.strip().lower()) == authority:
                    return None
    return f"origin: {origin[:80]}"


def _without_default_port(scheme: str, authority: str) -> str:
    default = ":443" if scheme == "https" else ":80"
    return authority[:-len(default)] if authority.endswith(default) else authority
