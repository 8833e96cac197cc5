"""Telemetry for cronoq: Prometheus metrics and OpenTelemetry.

``PrometheusCollector`` (and the helpers ``serve_metrics``, ``make_wsgi_app``,
``make_asgi_app``, ``metrics_registry``) build Prometheus series from one
scheduler snapshot per scrape; prometheus-client is a base dependency.
OpenTelemetry lives in ``cronoq.telemetry.otel`` and needs the extra
``cronoq[otel]``; it is imported only when used.
"""

from .prometheus import (
    MetricsServer, PrometheusCollector, make_asgi_app, make_wsgi_app, metrics_registry, serve_metrics,
)

__all__ = ["PrometheusCollector", "MetricsServer", "serve_metrics", "make_wsgi_app", "make_asgi_app",
           "metrics_registry"]
