"""The server's own counters (what the scheduler's snapshot cannot know):
failed authentications, HTTP connections refused at the cap or dropped for
not reading, accept errors. Every listener and the authenticator of one
server process count into one ``ServerCounters``; /metrics renders them
(docs/metrics.md, "cronoq-server")."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["ServerCounters", "AUTH_FAILURE_REASONS"]

# Why an authentication failed (the reason label of cronoq_auth_failures_total).
AUTH_FAILURE_REASONS = ("no_credentials", "malformed", "invalid_token", "unmapped_certificate", "rate_limited")


class ServerCounters:
    def __init__(self) -> None:
        self.auth_failures: dict[tuple[str, str], int] = {}    # (transport, reason) -> count
        self.http_refused = 0            # connections answered 503 at limits.max_http_connections
        self.http_write_timeouts = 0     # connections dropped after limits.http_write_timeout_s
        self.accept_errors = 0           # accept() failures (out of file descriptors...)
        self.open_connections: Callable[[], int] = lambda: 0   # HTTP connections open now

    def auth_failed(self, transport: str, reason: str) -> None:
        key = (transport, reason)
        self.auth_failures[key] = self.auth_failures.get(key, 0) + 1

    def families(self) -> Iterator[Metric]:
        auth = CounterMetricFamily("cronoq_auth_failures", "Failed authentications, by transport and reason.",
                                   labels=("transport", "reason"))
        for transport in ("grpc", "http"):
            for reason in AUTH_FAILURE_REASONS:
                auth.add_metric((transport, reason), self.auth_failures.get((transport, reason), 0))
        yield auth
        yield GaugeMetricFamily("cronoq_http_connections", "HTTP connections open now (both listeners).",
                                value=self.open_connections())
        yield CounterMetricFamily("cronoq_http_connections_refused",
                                  "HTTP connections answered 503 at limits.max_http_connections.",
                                  value=self.http_refused)
        yield CounterMetricFamily("cronoq_http_write_timeouts",
                                  "HTTP connections dropped because the client did not read its answers within "
                                  "limits.http_write_timeout_s.", value=self.http_write_timeouts)
        yield CounterMetricFamily("cronoq_accept_errors",
                                  "Failed accepts of new connections (out of file descriptors, ...).",
                                  value=self.accept_errors)
