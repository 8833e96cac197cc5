"""The Prometheus collector: values scraped from a live scheduler with a known workload."""

import asyncio
import logging
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import cronoq
from cronoq.telemetry import (
    PrometheusCollector, make_asgi_app, make_wsgi_app, metrics_registry, serve_metrics,
)

CLASSES = ("critical", "high", "normal", "low")


def parse(text) -> dict:
    """{(sample name, frozenset of labels): value}"""
    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: dict) -> set:
    return {name for name, _ in samples}


# ---------------------------------------------------------------- a known workload

async def work(ctx, payload):
    clock = work.clock
    if payload == "ok":
        await clock.sleep(0.5)
        return "done"
    if payload == "bad":
        raise cronoq.Permanent("bad input")
    if payload == "flaky":
        raise cronoq.Retryable("always fails")
    if payload == "slow":
        await clock.sleep(10)
    return None


async def never(ctx, payload):   # the parked pool has no capacity: never called
    raise AssertionError("not expected to run")


def workload_pools():
    return [
        cronoq.Pool("work", work, min=2, max=2, initial=2, autoscale=False,
                    retry=cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)),
        cronoq.Pool("parked", never, min=0, max=2, initial=0, autoscale=False),
        cronoq.Pool("scaled", never, min=1, max=1, initial=1,
                    autoscale=cronoq.AutoscaleConfig(cost_per_worker_second=0.5)),
    ]


async def run_workload(sched, clock):
    """Timeline (capacity 2): at t0 ok1, ok2 start (0.5 s each); at t0+0.5
    ok3, bad (fails), flaky (fails, retried at t0+1.5 and dead-lettered),
    slow (times out at t0+1.5, dead-lettered) start."""
    handles = [await sched.submit("ok") for _ in range(3)]
    handles.append(await sched.submit("bad"))
    handles.append(await sched.submit("flaky", key="flaky"))
    handles.append(await sched.submit("slow", timeout=1.0, retry=cronoq.RetryPolicy.none()))
    for priority in ("high", "high", "low", "low", "low"):
        await sched.enqueue(None, pool="parked", priority=priority)
    low = await sched.submit(None, pool="parked", priority="low", key="to-cancel")
    await sched.submit(None, pool="parked", start_in=100)       # one reservation, scheduled
    await sched.cancel(low.id)
    await clock.advance(1.0)
    await clock.advance(1.0)
    return handles


def check_workload(samples: dict) -> None:
    v = lambda name, **labels: value(samples, name, **labels)   # noqa: E731
    assert v("cronoq_scheduler_up") == 1
    ended = {s: v("cronoq_tasks_total", status=s) for s in
             ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")}
    assert ended == {"succeeded": 3, "failed": 1, "dead_lettered": 2, "cancelled": 1, "skipped": 0,
                     "missed": 0, "shed": 0}
    assert v("cronoq_tasks_submitted_total") == 13
    assert v("cronoq_dispatches_total") == 7
    assert v("cronoq_retries_total") == 1
    assert v("cronoq_timeouts_total") == 1
    assert v("cronoq_lease_expiries_total") == 0
    assert v("cronoq_stale_completions_total") == 0
    assert v("cronoq_recurring_conflicts_total") == 0
    assert v("cronoq_recurring_invalid_total") == 0
    assert (v("cronoq_live_tasks"), v("cronoq_running_tasks"), v("cronoq_pending_tasks")) == (6, 0, 6)

    assert {c: v("cronoq_pool_pending_tasks", pool="parked", **{"class": c}) for c in CLASSES} == \
        {"critical": 0, "high": 2, "normal": 1, "low": 3}
    assert {c: v("cronoq_pool_pending_tasks", pool="work", **{"class": c}) for c in CLASSES} == \
        dict.fromkeys(CLASSES, 0)
    assert v("cronoq_pool_reservations", pool="parked") == 1
    assert v("cronoq_pool_reservations", pool="work") == 0

    for pool, capacity in (("work", 2), ("parked", 0), ("scaled", 1)):
        assert v("cronoq_pool_workers", pool=pool) == capacity
        assert v("cronoq_pool_desired_workers", pool=pool) == capacity
        assert v("cronoq_pool_busy_workers", pool=pool) == 0
        assert v("cronoq_pool_held_workers", pool=pool) == 0
        assert v("cronoq_pool_group_workers", pool=pool, group="") == capacity
        assert v("cronoq_pool_group_busy_workers", pool=pool, group="") == 0

    # 2 s of capacity: worker-seconds are capacity x time; cost needs a rate.
    assert v("cronoq_pool_worker_seconds_total", pool="work") == pytest.approx(4.0)
    assert v("cronoq_pool_cost_total", pool="work") == 0
    assert v("cronoq_pool_worker_seconds_total", pool="scaled") == pytest.approx(2.0)
    assert v("cronoq_pool_cost_total", pool="scaled") == pytest.approx(1.0)

    # The window: 7 dispatches; busy 0.5 x 3 (ok) + 1.0 (slow) = 2.5 slot-s of 4.
    assert v("cronoq_pool_window_dispatches", pool="work") == 7
    assert v("cronoq_pool_window_attempts", pool="work", result="succeeded") == 3
    assert v("cronoq_pool_window_attempts", pool="work", result="failed") == 4
    assert v("cronoq_pool_utilization_ratio", pool="work") == pytest.approx(2.5 / 4)
    assert v("cronoq_pool_schedule_efficiency_ratio", pool="work") == pytest.approx(1.5 / 2.5)
    assert v("cronoq_pool_priority_adherence_ratio", pool="work") == 1.0
    assert v("cronoq_pool_fixed_start_hit_ratio", pool="work") == 1.0
    # Waits: three dispatches at once (0 s), four after 0.5 s; histogram
    # midpoints are within about 6 % of the truth.
    for q in ("0.5", "0.9", "0.99"):
        assert v("cronoq_pool_wait_seconds", pool="work", quantile=q) == pytest.approx(0.5, rel=0.07)
    assert v("cronoq_pool_wait_seconds", pool="scaled", quantile="0.99") == 0
    assert v("cronoq_build_info", version=cronoq.__version__) == 1


@pytest.mark.asyncio
async def test_scrape_of_a_live_scheduler_reports_the_known_workload():
    clock = work.clock = cronoq.VirtualClock()
    async with cronoq.Scheduler(workload_pools(), clock=clock) as sched:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(sched))
        handles = await run_workload(sched, clock)
        statuses = [h.status for h in handles]
        assert statuses == ["succeeded"] * 3 + ["failed", "dead_lettered", "dead_lettered"]
        # On the scheduler's own loop the snapshot is read synchronously.
        samples = parse(generate_latest(registry))
        check_workload(samples)
        snap = await sched.snapshot()
        assert value(samples, "cronoq_pool_wait_seconds", pool="work", quantile="0.99") == \
            snap.pool("work").wait_p99


@pytest.mark.asyncio
async def test_scrape_from_another_thread_goes_through_the_loop():
    clock = work.clock = cronoq.VirtualClock()
    async with cronoq.Scheduler(workload_pools(), clock=clock) as sched:
        registry = metrics_registry(sched)
        await run_workload(sched, clock)
        # prometheus-client's HTTP server scrapes from its own thread: the
        # snapshot is taken on the loop, which keeps running meanwhile.
        text = await asyncio.to_thread(generate_latest, registry)
        check_workload(parse(text))


def test_blocking_scheduler_scrape_and_http_endpoint():
    def run(ctx, payload):
        if payload == "bad":
            raise cronoq.Permanent("no")
        if payload == "flaky":
            raise cronoq.Retryable("no")
        return payload

    pools = [cronoq.Pool("default", run, min=2, max=2, initial=2, autoscale=False,
                         retry=cronoq.RetryPolicy.none()),
             cronoq.Pool("idle", run, min=0, max=3, initial=0, autoscale=False)]
    with cronoq.BlockingScheduler(pools) as sched:
        handles = [sched.submit(i) for i in range(4)]
        handles += [sched.submit("bad"), sched.submit("flaky")]
        for h in handles:
            try:
                h.result(timeout=10)
            except cronoq.TaskFailed:
                pass
        for priority in ("critical", "normal", "normal"):
            sched.enqueue(None, pool="idle", priority=priority)
        registry = metrics_registry(sched)
        with serve_metrics(sched, port=0) as server:
            assert server.port > 0 and server.url.endswith("/metrics")
            with urllib.request.urlopen(server.url, timeout=10) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                over_http = parse(response.read())
        direct = parse(generate_latest(registry))
        for samples in (direct, over_http):
            v = lambda name, **labels: value(samples, name, **labels)   # noqa: E731
            assert v("cronoq_scheduler_up") == 1
            assert v("cronoq_tasks_total", status="succeeded") == 4
            assert v("cronoq_tasks_total", status="failed") == 1
            assert v("cronoq_tasks_total", status="dead_lettered") == 1
            assert v("cronoq_tasks_submitted_total") == 9
            assert v("cronoq_pool_workers", pool="default") == 2
            assert v("cronoq_pool_desired_workers", pool="idle") == 0
            assert {c: v("cronoq_pool_pending_tasks", pool="idle", **{"class": c}) for c in CLASSES} == \
                {"critical": 1, "high": 0, "normal": 2, "low": 0}
            assert v("cronoq_pending_tasks") == 3
        # The server's registry is its own: prometheus-client's default one is untouched.
        from prometheus_client import REGISTRY
        assert "cronoq_tasks" not in {m.name for m in REGISTRY.collect()}
    # Stopped: only the build info and up == 0.
    samples = parse(generate_latest(registry))
    assert value(samples, "cronoq_scheduler_up") == 0
    assert names(samples) == {"cronoq_build_info", "cronoq_scheduler_up"}


def test_not_started_scheduler_reports_down_and_registration_takes_no_snapshot():
    sched = cronoq.Scheduler([cronoq.Pool("default", work)])
    collector = PrometheusCollector(sched)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)          # describe(): names only, no snapshot
    with pytest.raises(ValueError):
        registry.register(PrometheusCollector(sched))   # same series twice
    samples = parse(generate_latest(registry))
    assert value(samples, "cronoq_scheduler_up") == 0
    assert names(samples) == {"cronoq_build_info", "cronoq_scheduler_up"}
    described = {m.name for m in collector.describe()}
    assert {"cronoq_pool_desired_workers", "cronoq_pool_cost", "cronoq_tasks",
            "cronoq_stale_completions", "cronoq_pool_wait_seconds"} <= described


def test_collector_rejects_other_objects_and_bad_timeouts():
    with pytest.raises(TypeError):
        PrometheusCollector(object())
    sched = cronoq.Scheduler([cronoq.Pool("default", work)])
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError):
            PrometheusCollector(sched, timeout=bad)


def test_a_scrape_does_not_wait_for_a_busy_loop():
    # The snapshot is read under the scheduler's lock on the scrape's thread:
    # an executor that blocks the loop does not block the metrics.
    release = threading.Event()

    async def hog(ctx, payload):
        release.wait(10)      # blocks the scheduler's loop on purpose

    with cronoq.BlockingScheduler([cronoq.Pool("default", hog, min=1, max=1, autoscale=False)],
                                  shutdown_grace=0) as sched:
        registry = metrics_registry(sched, timeout=0.1)
        sched.enqueue(None)
        samples = parse(generate_latest(registry))
        release.set()
        assert value(samples, "cronoq_scheduler_up") == 1
        assert value(samples, "cronoq_pool_busy_workers", pool="default") == 1


def test_a_scheduler_that_does_not_answer_in_time_reports_down(caplog):
    with cronoq.BlockingScheduler([cronoq.Pool("default", lambda ctx, p: p)]) as sched:
        registry = metrics_registry(sched, timeout=0.1)
        held, release = threading.Event(), threading.Event()

        def hold_the_engine():
            with sched.scheduler._driver.lock:     # as a long engine step would
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold_the_engine)
        holder.start()
        held.wait(10)
        try:
            with caplog.at_level(logging.WARNING, logger="cronoq.telemetry"):
                samples = parse(generate_latest(registry))
        finally:
            release.set()
            holder.join(10)
        assert value(samples, "cronoq_scheduler_up") == 0
        assert any(r.action == "snapshot_timeout" for r in caplog.records)
        assert value(parse(generate_latest(registry)), "cronoq_scheduler_up") == 1


def test_wsgi_app_serves_the_metrics():
    with cronoq.BlockingScheduler([cronoq.Pool("default", lambda ctx, p: p)]) as sched:
        sched.submit(1).result(timeout=10)
        app = make_wsgi_app(sched)
        started = {}

        def start_response(status, headers):
            started["status"] = status

        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
                   "wsgi.url_scheme": "http", "SERVER_NAME": "localhost", "SERVER_PORT": "80"}
        body = b"".join(app(environ, start_response))
    assert started["status"].startswith("200")
    assert value(parse(body), "cronoq_tasks_total", status="succeeded") == 1


@pytest.mark.asyncio
async def test_asgi_app_on_the_schedulers_own_loop():
    async def run(ctx, payload):
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        await (await sched.submit(7))
        app = make_asgi_app(sched)
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert value(parse(sent[1]["body"]), "cronoq_tasks_total", status="succeeded") == 1
