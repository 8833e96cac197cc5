"""OpenTelemetry: spans per attempt, trace propagation through submissions, metrics."""

import asyncio
import os
import pathlib
import subprocess
import sys
import threading

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import cronoq
from cronoq.telemetry.otel import SPAN_NAME, current_traceparent, instrument


@pytest.fixture
def tracing():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def meters():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def points(reader) -> dict:
    """{(instrument name, frozenset of attributes): value}"""
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    out[(metric.name, frozenset(dp.attributes.items()))] = dp.value
    return out


def run_python(code: str) -> subprocess.CompletedProcess:
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def task_spans(exporter):
    return sorted((s for s in exporter.get_finished_spans() if s.name == SPAN_NAME),
                  key=lambda s: (s.attributes["task.id"], s.attributes["task.attempt"]))


seen_traceparents: dict = {}    # key -> the traceparent an attempt saw


async def flaky(ctx, payload):
    if ctx.key is not None:
        seen_traceparents[ctx.key] = ctx.traceparent
    if payload == "fail":
        raise cronoq.Permanent("refused")
    if ctx.attempt < 3:
        raise cronoq.Retryable(f"attempt {ctx.attempt} failed")
    return payload


def retrying_pool(executor=flaky, **kwargs):
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=1.0, jitter=False)
    return cronoq.Pool("default", executor, min=1, max=1, autoscale=False, retry=retry, **kwargs)


@pytest.mark.asyncio
async def test_one_span_per_attempt_and_retries_share_the_submitters_trace(tracing):
    provider, exporter = tracing
    tracer = provider.get_tracer("test")
    clock = cronoq.VirtualClock()
    sched = cronoq.Scheduler([retrying_pool()], clock=clock)
    instrument(sched, tracer_provider=provider, metrics=False)
    async with sched:
        with tracer.start_as_current_span("request") as request:
            handle = await sched.submit("payload", key="job", kind="report")
        orphan = await sched.submit("fail")          # no span is current here
        await clock.advance(1.0)
        await clock.advance(2.0)
        assert await handle == "payload"
        with pytest.raises(cronoq.TaskFailed):
            await orphan
    spans = task_spans(exporter)
    traced = [s for s in spans if s.attributes["task.id"] == handle.id]
    assert [s.attributes["task.attempt"] for s in traced] == [1, 2, 3]
    for span in traced:
        assert dict(span.attributes) == {
            "task.id": handle.id, "task.pool": "default", "task.kind": "report",
            "task.attempt": span.attributes["task.attempt"], "task.key": "job",
            "task.outcome": span.attributes["task.outcome"]}
        assert span.context.trace_id == request.context.trace_id
        assert span.parent.span_id == request.context.span_id
    assert [s.attributes["task.outcome"] for s in traced] == ["retryable", "retryable", "success"]
    assert [s.status.status_code for s in traced] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert traced[0].status.description == "attempt 1 failed"
    assert any(e.name == "exception" for e in traced[0].events)
    # The retries began later, in virtual time, but still under the request.
    (lonely,) = [s for s in spans if s.attributes["task.id"] == orphan.id]
    assert lonely.parent is None and lonely.context.trace_id != request.context.trace_id
    assert lonely.attributes["task.outcome"] == "permanent"
    assert "task.key" not in lonely.attributes


@pytest.mark.asyncio
async def test_traceparent_is_captured_as_a_tag_only_when_a_span_is_current(tracing):
    provider, _ = tracing
    tracer = provider.get_tracer("test")
    seen = {}

    async def record(ctx, payload):
        seen[payload] = ctx.traceparent

    sched = cronoq.Scheduler([cronoq.Pool("default", record)])
    instrument(sched, tracer_provider=provider, metrics=False)
    async with sched:
        assert current_traceparent() is None
        await (await sched.submit("none"))
        with tracer.start_as_current_span("request") as request:
            tp = current_traceparent()
            await (await sched.submit("one"))
            await sched.enqueue("queued")
            mine = cronoq.Task("mine", tags={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
            batch = [cronoq.Task("batch", tags={"team": "a"}), mine]
            handles = await sched.submit_batch(batch)
            await sched.enqueue_batch([cronoq.Task("queued-batch")])
            for h in handles:
                await h
        await asyncio.sleep(0.05)
    trace_id = format(request.context.trace_id, "032x")
    assert tp.startswith(f"00-{trace_id}-")
    assert seen["none"] is None
    assert seen["one"] == seen["queued"] == seen["batch"] == seen["queued-batch"] == tp
    assert seen["mine"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01"    # an explicit tag wins
    assert batch[0].tags == {"team": "a"}                                 # the caller's Task is untouched


def test_blocking_scheduler_captures_the_callers_span_in_its_thread(tracing):
    provider, exporter = tracing
    tracer = provider.get_tracer("test")

    def run(ctx, payload):          # a plain function: runs in the loop's thread pool
        return threading.current_thread().name

    sched = cronoq.BlockingScheduler([cronoq.Pool("default", run)])
    instrument(sched, tracer_provider=provider, metrics=False)
    with sched:
        with tracer.start_as_current_span("handler") as handler:
            sched.submit("x").result(timeout=10)
            (batch,) = sched.submit_batch([cronoq.Task("y")])
            batch.result(timeout=10)
        sched.submit("z").result(timeout=10)
    spans = task_spans(exporter)
    assert len(spans) == 3
    assert [s.context.trace_id == handler.context.trace_id for s in spans] == [True, True, False]
    assert all(s.attributes["task.outcome"] == "success" for s in spans)


@pytest.mark.asyncio
async def test_metrics_are_observed_from_one_snapshot(meters):
    provider, reader = meters
    clock = cronoq.VirtualClock()

    async def hold(ctx, payload):
        await clock.sleep(100)

    pools = [retrying_pool(),
             cronoq.Pool("busy", hold, min=1, max=1, initial=1,
                         autoscale=cronoq.AutoscaleConfig(cost_per_worker_second=2.0))]
    sched = cronoq.Scheduler(pools, clock=clock, shutdown_grace=0)
    instrument(sched, meter_provider=provider, traces=False, snapshot_max_age=0)
    async with sched:
        ok = await sched.submit("ok")
        bad = await sched.submit("fail")
        await sched.enqueue(None, pool="busy")                       # runs for 100 s
        await sched.enqueue(None, pool="busy", priority="high")      # waits behind it
        await clock.advance(1.0)
        await clock.advance(2.0)
        assert await ok == "ok"
        with pytest.raises(cronoq.TaskFailed):
            await bad
        got = points(reader)
        snap = await sched.snapshot()

    def v(name, **attributes):
        return got[(name, frozenset(attributes.items()))]

    assert v("cronoq.tasks.finished", status="succeeded") == 1
    assert v("cronoq.tasks.finished", status="failed") == 1
    assert v("cronoq.tasks.finished", status="dead_lettered") == 0
    assert v("cronoq.tasks.submitted") == 4
    assert v("cronoq.dispatches") == 5 and v("cronoq.retries") == 2
    assert (v("cronoq.tasks.pending"), v("cronoq.tasks.running"), v("cronoq.tasks.live")) == (1, 1, 2)
    assert v("cronoq.pool.capacity", pool="default") == 1
    assert v("cronoq.pool.busy", pool="busy") == 1
    assert v("cronoq.pool.pending", pool="busy", **{"class": "high"}) == 1
    assert v("cronoq.pool.pending", pool="busy", **{"class": "normal"}) == 0
    assert v("cronoq.pool.desired_workers", pool="busy") == 1
    assert v("cronoq.pool.worker_time", pool="default") == pytest.approx(3.0)
    assert v("cronoq.pool.cost", pool="busy") == pytest.approx(3.0 * 2.0)
    assert v("cronoq.pool.cost", pool="default") == 0
    assert v("cronoq.pool.window.attempts", pool="default", result="failed") == 3
    assert v("cronoq.pool.wait", pool="default", quantile="0.99") == snap.pool("default").wait_p99
    assert v("cronoq.pool.priority_adherence", pool="default") == 1.0
    # Stopped: nothing more is observed for this scheduler.
    assert not [k for k in points(reader) if k[0] == "cronoq.tasks.submitted"]


def test_several_schedulers_are_told_apart_by_name(meters):
    provider, reader = meters
    a = cronoq.BlockingScheduler([cronoq.Pool("default", lambda ctx, p: p)])
    b = cronoq.BlockingScheduler([cronoq.Pool("default", lambda ctx, p: p)])
    ia = instrument(a, meter_provider=provider, traces=False, name="a")
    instrument(b, meter_provider=provider, traces=False, name="b")
    with a, b:
        a.submit(1).result(timeout=10)
        for i in range(2):
            b.submit(i).result(timeout=10)
        got = points(reader)       # read from this thread: through each scheduler's loop
        assert got[("cronoq.tasks.submitted", frozenset({("scheduler", "a")}))] == 1
        assert got[("cronoq.tasks.submitted", frozenset({("scheduler", "b")}))] == 2
        ia.uninstrument()
        got = points(reader)
        assert ("cronoq.tasks.submitted", frozenset({("scheduler", "a")})) not in got
        assert got[("cronoq.tasks.submitted", frozenset({("scheduler", "b")}))] == 2


@pytest.mark.asyncio
async def test_instrument_rules_and_uninstrument(tracing, meters):
    tracer_provider, exporter = tracing
    sched = cronoq.Scheduler([cronoq.Pool("default", flaky)])
    pool = sched.pools[0]
    handle = instrument(sched, tracer_provider=tracer_provider, meter_provider=meters[0])
    # Attached through the scheduler's hooks: the caller's pools are untouched.
    assert sched.pools[0] is pool and pool.executor is flaky and "submit" not in vars(sched)
    with pytest.raises(RuntimeError):
        instrument(sched)
    handle.uninstrument()
    tracer = tracer_provider.get_tracer("test")
    async with sched:
        with pytest.raises(RuntimeError):
            instrument(sched, tracer_provider=tracer_provider)    # spans need the executors before start
        late = instrument(sched, traces=False, meter_provider=meters[0])
        with tracer.start_as_current_span("request"):
            traced = await sched.submit("ok", retry=cronoq.RetryPolicy.none(), key="traced")
        late.uninstrument()
        with tracer.start_as_current_span("request"):
            handle = await sched.submit("ok", retry=cronoq.RetryPolicy.none(), key="plain")
        for h in (traced, handle):
            with pytest.raises(cronoq.TaskFailed):
                await h       # attempt 1 of flaky fails; with no retries it is final
    assert task_spans(exporter) == []
    assert seen_traceparents.get("traced") and seen_traceparents.get("plain") is None
    for bad in (-1, float("nan"), True):
        with pytest.raises(ValueError):
            instrument(cronoq.Scheduler([cronoq.Pool("default", flaky)]), snapshot_max_age=bad)


def test_cronoq_imports_without_opentelemetry():
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"      # as if the extra were not installed
        "import cronoq, cronoq.telemetry\n"
        "assert 'opentelemetry' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    import cronoq.telemetry.otel\n"
        "except ImportError as exc:\n"
        "    assert 'cronoq[otel]' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('imported without OpenTelemetry')\n"
        "with cronoq.BlockingScheduler([cronoq.Pool('default', lambda ctx, p: p * 2)]) as s:\n"
        "    assert s.submit(21).result(timeout=10) == 42\n"
        "print('ok')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_global_providers_are_used_by_default_even_when_set_after_instrumenting():
    code = (
        "import asyncio, cronoq\n"
        "from opentelemetry import metrics, trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from cronoq.telemetry.otel import instrument\n"
        "async def run(ctx, p):\n"
        "    return p\n"
        "sched = cronoq.Scheduler([cronoq.Pool('default', run)])\n"
        "instrument(sched)\n"                       # before any provider is configured
        "spans = InMemorySpanExporter()\n"
        "tp = TracerProvider(); tp.add_span_processor(SimpleSpanProcessor(spans))\n"
        "trace.set_tracer_provider(tp)\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "async def main():\n"
        "    async with sched:\n"
        "        with trace.get_tracer('t').start_as_current_span('req') as req:\n"
        "            h = await sched.submit(1)\n"
        "        await h\n"
        "        data = reader.get_metrics_data()\n"
        "    (span,) = [s for s in spans.get_finished_spans() if s.name == 'cronoq.task']\n"
        "    assert span.context.trace_id == req.context.trace_id\n"
        "    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}\n"
        "    assert 'cronoq.tasks.finished' in names, names\n"
        "asyncio.run(main())\n"
        "print('ok')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
