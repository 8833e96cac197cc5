"""Whether a host names this machine's loopback interface: the one rule the
server (its listeners and Host header), the command line and the MCP server
apply before they allow a plain or unauthenticated connection."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """localhost, any name under .localhost, 127.0.0.0/8 or ::1 (an IPv6
    literal may keep its brackets; case does not matter)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
