"""Prometheus metrics for a scheduler, built from one snapshot per scrape.

``PrometheusCollector`` is a prometheus-client custom collector: the
scheduler itself counts nothing for it. Each scrape takes one ``Snapshot``
(see ``cronoq.telemetry._snapshot``) and turns it into metric families, so a
scrape costs the same with ten pending tasks or a million, and nothing at all
happens between scrapes. Every series is listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer
from wsgiref.types import WSGIApplication

from prometheus_client import CollectorRegistry
from prometheus_client import make_asgi_app as _make_asgi_app
from prometheus_client import make_wsgi_app as _make_wsgi_app
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .._version import __version__
from ..core.options import CLASSES
from ..core.snapshot import Snapshot
from ._snapshot import resolve, take_snapshot

if TYPE_CHECKING:
    from ..blocking import BlockingScheduler
    from ..runtime.scheduler import Scheduler

# An ASGI application: app(scope, receive, send).
ASGIApplication = Callable[..., Awaitable[None]]

__all__ = ["PrometheusCollector", "MetricsServer", "serve_metrics", "make_wsgi_app", "make_asgi_app",
           "metrics_registry", "TASK_STATUSES", "WAIT_QUANTILES", "WORKER_FAMILIES", "worker_families"]

TASK_STATUSES = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")
WAIT_QUANTILES = (("0.5", "wait_p50"), ("0.9", "wait_p90"), ("0.99", "wait_p99"))
_CLASSES = CLASSES

# Scheduler-wide counters: (metric name without _total, totals key, help).
_COUNTERS = (
    ("cronoq_tasks_submitted", "submitted", "Tasks admitted since the scheduler started."),
    ("cronoq_dispatches", "dispatched",
     "Attempts started since the scheduler started (a retry is a new dispatch)."),
    ("cronoq_retries", "retries", "Retries scheduled after a failed, timed-out or lost attempt."),
    ("cronoq_timeouts", "timeouts", "Attempts aborted because they exceeded their timeout."),
    ("cronoq_lease_expiries", "lease_expiries",
     "Attempts aborted because no heartbeat arrived within the lease TTL."),
    ("cronoq_stale_completions", "stale_completions",
     "Outcome reports ignored because their attempt had already ended (timed out, aborted, reported)."),
    ("cronoq_recurring_conflicts", "recurring_conflicts",
     "Recurring occurrences not created because their reservation did not fit."),
    ("cronoq_recurring_invalid", "recurring_invalid",
     "Recurring schedules or occurrences the configuration could not support."),
)

# (name, help) of every family, for describe(): registering a collector then
# needs no snapshot.
_FAMILIES = (
    ("cronoq_build_info", "gauge", "The cronoq version (value 1)."),
    ("cronoq_scheduler_up", "gauge", "1 if the scheduler answered this scrape's snapshot, else 0."),
    ("cronoq_snapshot_duration_seconds", "gauge", "Time this scrape spent taking the snapshot."),
    ("cronoq_tasks", "counter", "Tasks that ended, by terminal status, since the scheduler started."),
    *((name, "counter", doc) for name, _, doc in _COUNTERS),
    ("cronoq_live_tasks", "gauge", "Tasks not yet ended (waiting, scheduled, blocked, running, retrying)."),
    ("cronoq_running_tasks", "gauge", "Attempts running now."),
    ("cronoq_pending_tasks", "gauge",
     "Tasks waiting to run (including blocked, scheduled and retrying ones)."),
    ("cronoq_checkpoints_saved", "counter", "Stage checkpoints saved since the scheduler started."),
    ("cronoq_checkpointed_tasks", "gauge", "Tasks holding stage checkpoints now (live, or ended within retention)."),
    ("cronoq_pool_workers", "gauge", "Capacity of the pool: concurrency slots (workers)."),
    ("cronoq_pool_busy_workers", "gauge", "Slots running an attempt."),
    ("cronoq_pool_held_workers", "gauge", "Free slots held for fixed-start tasks about to begin."),
    ("cronoq_pool_stray_threads", "gauge",
     "Threads still running a plain function whose attempt was given up (not reused until it returns)."),
    ("cronoq_pool_desired_workers", "gauge",
     "The autoscaler's target capacity (the capacity for fixed pools)."),
    ("cronoq_pool_group_workers", "gauge", "Capacity of each worker group (label set) of the pool."),
    ("cronoq_pool_group_busy_workers", "gauge", "Busy slots of each worker group of the pool."),
    ("cronoq_pool_pending_tasks", "gauge", "Pending tasks of the pool by priority class."),
    ("cronoq_pool_reservations", "gauge", "Fixed-start reservations booked in the pool."),
    ("cronoq_pool_utilization_ratio", "gauge",
     "Busy slot-time / capacity slot-time over the metrics window."),
    ("cronoq_pool_priority_adherence_ratio", "gauge",
     "1 - priority inversions / dispatches over the metrics window."),
    ("cronoq_pool_fixed_start_hit_ratio", "gauge",
     "Fixed starts begun within their tolerance / fixed starts judged, over the metrics window."),
    ("cronoq_pool_schedule_efficiency_ratio", "gauge",
     "Run time of attempts that succeeded / all run time, over the metrics window."),
    ("cronoq_pool_wait_seconds", "gauge",
     "Wait from ready to dispatch over the metrics window, by quantile (0.5, 0.9, 0.99)."),
    ("cronoq_pool_window_dispatches", "gauge", "Attempts started in the pool over the metrics window."),
    ("cronoq_pool_window_attempts", "gauge",
     "Attempts that ended in the pool over the metrics window, by result."),
    ("cronoq_pool_worker_seconds", "counter", "Capacity integrated over time (slot-seconds) since start."),
    ("cronoq_pool_cost", "counter", "worker_seconds x cost_per_worker_second since start."),
)


def _group_label(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def families(snap: Snapshot) -> list[Metric]:
    """The metric families of one snapshot (without the scrape's own gauges)."""
    totals = snap.totals
    out: list[Metric] = []
    tasks = CounterMetricFamily("cronoq_tasks", _help("cronoq_tasks"), labels=("status",))
    for status in TASK_STATUSES:
        tasks.add_metric((status,), totals.get(status, 0))
    out.append(tasks)
    for name, key, doc in _COUNTERS:
        out.append(CounterMetricFamily(name, doc, value=totals.get(key, 0)))
    out.append(GaugeMetricFamily("cronoq_live_tasks", _help("cronoq_live_tasks"), value=snap.live_tasks))
    out.append(GaugeMetricFamily("cronoq_running_tasks", _help("cronoq_running_tasks"), value=snap.running))
    out.append(GaugeMetricFamily("cronoq_pending_tasks", _help("cronoq_pending_tasks"), value=snap.pending))
    checkpoints = snap.checkpoints
    out.append(CounterMetricFamily("cronoq_checkpoints_saved", _help("cronoq_checkpoints_saved"),
                                   value=checkpoints.get("saved", 0)))
    out.append(GaugeMetricFamily("cronoq_checkpointed_tasks", _help("cronoq_checkpointed_tasks"),
                                 value=checkpoints.get("tasks", 0)))

    pool = ("pool",)

    def gauge(name: str, labels: tuple[str, ...] = pool) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, _help(name), labels=labels)
        out.append(family)
        return family

    def counter(name: str) -> CounterMetricFamily:
        family = CounterMetricFamily(name, _help(name), labels=pool)
        out.append(family)
        return family

    capacity = gauge("cronoq_pool_workers")
    busy = gauge("cronoq_pool_busy_workers")
    held = gauge("cronoq_pool_held_workers")
    stray = gauge("cronoq_pool_stray_threads")
    desired = gauge("cronoq_pool_desired_workers")
    group_capacity = gauge("cronoq_pool_group_workers", ("pool", "group"))
    group_busy = gauge("cronoq_pool_group_busy_workers", ("pool", "group"))
    pending = gauge("cronoq_pool_pending_tasks", ("pool", "class"))
    reservations = gauge("cronoq_pool_reservations")
    utilization = gauge("cronoq_pool_utilization_ratio")
    adherence = gauge("cronoq_pool_priority_adherence_ratio")
    fixed_hits = gauge("cronoq_pool_fixed_start_hit_ratio")
    efficiency = gauge("cronoq_pool_schedule_efficiency_ratio")
    wait = gauge("cronoq_pool_wait_seconds", ("pool", "quantile"))
    dispatches = gauge("cronoq_pool_window_dispatches")
    attempts = gauge("cronoq_pool_window_attempts", ("pool", "result"))
    worker_seconds = counter("cronoq_pool_worker_seconds")
    cost = counter("cronoq_pool_cost")
    for p in snap.pools:
        of_pool = (p.name,)
        capacity.add_metric(of_pool, p.capacity)
        busy.add_metric(of_pool, p.busy)
        held.add_metric(of_pool, p.held)
        stray.add_metric(of_pool, p.stray_threads)
        desired.add_metric(of_pool, p.desired)
        for g in p.groups:
            label = (p.name, _group_label(g.labels))
            group_capacity.add_metric(label, g.capacity)
            group_busy.add_metric(label, g.busy)
        by_class = p.pending_by_class
        for c in _CLASSES:
            pending.add_metric((p.name, c), by_class.get(c, 0))
        reservations.add_metric(of_pool, p.reservations)
        utilization.add_metric(of_pool, p.utilization)
        adherence.add_metric(of_pool, p.priority_adherence)
        fixed_hits.add_metric(of_pool, p.fixed_start_hit_rate)
        efficiency.add_metric(of_pool, p.schedule_efficiency)
        for q, field in WAIT_QUANTILES:
            wait.add_metric((p.name, q), getattr(p, field))
        dispatches.add_metric(of_pool, p.dispatched)
        attempts.add_metric((p.name, "succeeded"), p.succeeded)
        attempts.add_metric((p.name, "failed"), p.failed)
        worker_seconds.add_metric(of_pool, p.worker_seconds)
        cost.add_metric(of_pool, p.cost)
    return out


# cronoq-server's remote workers: its /metrics serves these beside the families above.
WORKER_FAMILIES = (
    ("cronoq_worker_lease_expiries", "counter",
     "Leases held by the pool's remote workers that expired (no heartbeat within the lease TTL)."),
    ("cronoq_worker_suspicions", "counter",
     "Times a remote worker of the pool was marked suspect: a lease expired while it sent no message at all."),
    ("cronoq_pool_suspect_workers", "gauge",
     "Remote workers of the pool that are suspect now: they get no new lease until they send a message."),
)


def worker_families(pools: Iterable[tuple[str, int, int, int]]) -> list[Metric]:
    """The ``WORKER_FAMILIES`` of ``(pool, lease_expiries, suspicions, suspect_now)`` per pool."""
    (expiries_name, _, expiries_doc), (suspicions_name, _, suspicions_doc), (suspect_name, _, suspect_doc) = \
        WORKER_FAMILIES
    expiries = CounterMetricFamily(expiries_name, expiries_doc, labels=("pool",))
    suspicions = CounterMetricFamily(suspicions_name, suspicions_doc, labels=("pool",))
    suspect = GaugeMetricFamily(suspect_name, suspect_doc, labels=("pool",))
    for pool, expired, found_silent, suspect_now in pools:
        expiries.add_metric((pool,), expired)
        suspicions.add_metric((pool,), found_silent)
        suspect.add_metric((pool,), suspect_now)
    return [expiries, suspicions, suspect]


_HELP = {name: doc for name, _, doc in _FAMILIES}


def _help(name: str) -> str:
    return _HELP[name]


def scrape_families(snap: Snapshot | None, took: float) -> Iterator[Metric]:
    """Every family of one scrape: build info, up, and, with a snapshot (None:
    the scheduler did not answer), the time it took and the cronoq series.
    cronoq-server's /metrics serves the same."""
    info = GaugeMetricFamily("cronoq_build_info", _help("cronoq_build_info"), labels=("version",))
    info.add_metric((__version__,), 1)
    yield info
    yield GaugeMetricFamily("cronoq_scheduler_up", _help("cronoq_scheduler_up"), value=0 if snap is None else 1)
    if snap is None:
        return
    yield GaugeMetricFamily("cronoq_snapshot_duration_seconds", _help("cronoq_snapshot_duration_seconds"),
                            value=took)
    yield from families(snap)


class PrometheusCollector:
    """A prometheus-client collector for one ``cronoq.Scheduler`` or
    ``cronoq.BlockingScheduler``.

    Register it with a ``CollectorRegistry`` (or prometheus-client's default
    ``REGISTRY``). Each scrape takes one snapshot of the scheduler, on the
    scrape's thread (waiting at most ``timeout`` seconds for the scheduler's
    engine lock); a scheduler that is not running (or does not answer)
    reports ``cronoq_scheduler_up 0`` and no other cronoq series.
    """

    def __init__(self, scheduler: Scheduler | BlockingScheduler, *, timeout: float = 5.0) -> None:
        self._sched = resolve(scheduler)
        self.scheduler = scheduler
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)

    def describe(self) -> Iterator[Metric]:
        """The families' names and types, without taking a snapshot."""
        for name, kind, doc in _FAMILIES:
            yield Metric(name, doc, kind)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        snap = take_snapshot(self._sched, self.timeout)
        return scrape_families(snap, time.perf_counter() - started)


def metrics_registry(scheduler: Scheduler | BlockingScheduler, *, timeout: float = 5.0) -> CollectorRegistry:
    """A new ``CollectorRegistry`` holding only a ``PrometheusCollector`` of ``scheduler``."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PrometheusCollector(scheduler, timeout=timeout))
    return registry


class MetricsServer:
    """The HTTP server started by ``serve_metrics`` (a daemon thread)."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread, registry: CollectorRegistry) -> None:
        self._httpd = httpd
        self._thread = thread
        self.registry = registry
        self.host: str = str(httpd.server_address[0])
        self.port: int = httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving and close the listening socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    close = shutdown

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<MetricsServer {self.url}>"


def serve_metrics(scheduler: Scheduler | BlockingScheduler, host: str = "127.0.0.1", port: int = 9464, *,
                  timeout: float = 5.0) -> MetricsServer:
    """Serve the scheduler's metrics at ``http://host:port/metrics`` from a
    daemon thread, with a registry of its own (prometheus-client's default
    registry is left alone). ``port=0`` picks a free port (see ``.port``).
    Returns a ``MetricsServer``; call ``shutdown()`` to stop it."""
    registry = metrics_registry(scheduler, timeout=timeout)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread, registry)


def make_wsgi_app(scheduler: Scheduler | BlockingScheduler, *, timeout: float = 5.0) -> WSGIApplication:
    """A WSGI application serving the scheduler's metrics (mount it at /metrics)."""
    return _make_wsgi_app(metrics_registry(scheduler, timeout=timeout))


def make_asgi_app(scheduler: Scheduler | BlockingScheduler, *, timeout: float = 5.0) -> ASGIApplication:
    """An ASGI application serving the scheduler's metrics. Served on the
    scheduler's own loop, it reads the snapshot synchronously."""
    return _make_asgi_app(metrics_registry(scheduler, timeout=timeout))
