"""OpenTelemetry for cronoq: metrics, one span per attempt, trace propagation.

Needs the extra ``cronoq[otel]`` (``opentelemetry-api``); nothing else in
cronoq imports this module. ``instrument(scheduler)`` turns it on for one
``Scheduler`` or ``BlockingScheduler``:

- Metrics: observable instruments created through the meter provider (the
  global one unless ``meter_provider`` is given). Their callbacks read one
  scheduler snapshot per collection, so they cost nothing between
  collections and nothing at all without a configured provider.
- Traces: every attempt runs inside a span ``cronoq.task`` with the attributes
  ``task.id``, ``task.pool``, ``task.kind`` and ``task.attempt``. The pools'
  executors are wrapped before the scheduler starts; nothing is added to the
  dispatch path of a scheduler that is not instrumented.
- Propagation: a submission made while a span is current gets that span's
  W3C ``traceparent`` as the task tag ``traceparent``; every attempt's span
  is a child of it, so retries appear under the submitting trace. The
  instance's ``submit``, ``enqueue``, ``submit_batch`` and ``enqueue_batch``
  are wrapped for this (on a ``BlockingScheduler``, in the caller's thread,
  where its span is current).

``Instrumentation.uninstrument()`` undoes all three (the executors stay
wrapped if the scheduler already started with them).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context
    from opentelemetry.metrics import Asynchronous, CallbackOptions, Meter, MeterProvider, Observation
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError("cronoq.telemetry.otel needs OpenTelemetry: pip install 'cronoq[otel]'") from exc

from .._version import __version__
from ..core.errors import Permanent, Retryable, SchedulerError
from ..core.snapshot import Snapshot
from ..core.types import CLASSES, TaskSpec
from ._snapshot import resolve, take_snapshot

if TYPE_CHECKING:
    from ..blocking import BlockingScheduler
    from ..runtime.context import TaskContext
    from ..runtime.scheduler import Scheduler

__all__ = ["instrument", "Instrumentation", "SPAN_NAME", "current_traceparent"]

SPAN_NAME = "cronoq.task"
_PROPAGATOR = TraceContextTextMapPropagator()
# Schedulers instrumented now (one instrumentation each).
_INSTRUMENTED: weakref.WeakKeyDictionary[Scheduler, Instrumentation] = weakref.WeakKeyDictionary()
_STATUSES = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")
_QUANTILES = (("0.5", "wait_p50"), ("0.9", "wait_p90"), ("0.99", "wait_p99"))


# ================================================================ propagation

def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None when no valid span is current."""
    if not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def _with_traceparent(spec: TaskSpec) -> TaskSpec:
    """The submission hook: the submitter's trace context as the tag
    ``traceparent`` (on a copy: the caller's Task is left as it was)."""
    traceparent = current_traceparent()
    if traceparent is None:
        return spec
    tags = spec.tags
    if tags and "traceparent" in tags:
        return spec
    spec = copy.copy(spec)
    spec.tags = {**(tags or {}), "traceparent": traceparent}
    spec.plain = False
    return spec


# ================================================================ spans

def _parent(ctx: TaskContext) -> Context:
    traceparent = ctx.traceparent
    if traceparent:
        return _PROPAGATOR.extract({"traceparent": traceparent})
    # No captured parent: a new trace, never whatever context the worker
    # coroutine happened to be created in.
    return Context()


def _attributes(ctx: TaskContext) -> dict[str, Any]:
    attributes: dict[str, Any] = {"task.id": ctx.id, "task.pool": ctx.pool, "task.kind": ctx.kind,
                                  "task.attempt": ctx.attempt}
    key = ctx.key
    if key is not None:
        attributes["task.key"] = key
    return attributes


def _ended(span: Span, exc: BaseException | None) -> None:
    if exc is None:
        span.set_attribute("task.outcome", "success")
        return
    if isinstance(exc, asyncio.CancelledError):
        span.set_attribute("task.outcome", "aborted")   # the scheduler gave the attempt up
        return
    span.set_attribute("task.outcome", "permanent" if isinstance(exc, Permanent) else "retryable")
    if isinstance(exc, Exception):
        span.record_exception(exc)
    message = exc.message if isinstance(exc, (Retryable, Permanent)) else str(exc)
    span.set_status(Status(StatusCode.ERROR, message or type(exc).__name__))


def _traced(fn: Callable[..., Any], is_async: bool, tracer: Tracer) -> Callable[..., Any]:
    use_span = _trace.use_span
    traced: Callable[..., Any]
    if is_async:
        async def traced_async(ctx: TaskContext, payload: Any) -> Any:
            span = tracer.start_span(SPAN_NAME, context=_parent(ctx), kind=SpanKind.INTERNAL,
                                     attributes=_attributes(ctx))
            with use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                try:
                    result = await fn(ctx, payload)
                except BaseException as exc:
                    _ended(span, exc)
                    raise
                _ended(span, None)
                return result
        traced = traced_async
    else:
        def traced_sync(ctx: TaskContext, payload: Any) -> Any:
            span = tracer.start_span(SPAN_NAME, context=_parent(ctx), kind=SpanKind.INTERNAL,
                                     attributes=_attributes(ctx))
            with use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                try:
                    result = fn(ctx, payload)
                except BaseException as exc:
                    _ended(span, exc)
                    raise
                _ended(span, None)
                return result
        traced = traced_sync
    # Sets only __wrapped__ (what inspect.unwrap follows).
    return functools.update_wrapper(traced, fn, assigned=(), updated=())


# ================================================================ metrics

class _Source:
    """One instrumented scheduler, as seen by the metric callbacks."""

    def __init__(self, sched: Scheduler, attributes: dict[str, str], max_age: float, timeout: float) -> None:
        self.sched = sched
        self.attributes = attributes
        self.max_age = max_age
        self.timeout = timeout
        self._snap: Snapshot | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot | None:
        with self._lock:
            now = time.monotonic()
            if self._snap is not None and now - self._at <= self.max_age:
                return self._snap
            snap = take_snapshot(self.sched, self.timeout)
            self._snap, self._at = snap, now
            return snap


# A metric's reader: (value, attributes) pairs from a snapshot and the source's attributes.
_Reader = Callable[[Snapshot, dict[str, str]], Iterator[tuple[float, dict[str, str]]]]


def _pools(field: str) -> _Reader:
    def read(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
        for p in snap.pools:
            yield getattr(p, field), {**base, "pool": p.name}
    return read


def _total(key: str) -> _Reader:
    def read(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
        yield snap.totals.get(key, 0), base
    return read


def _tasks_finished(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
    for status in _STATUSES:
        yield snap.totals.get(status, 0), {**base, "status": status}


def _pending_by_class(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
    for p in snap.pools:
        for c in CLASSES:
            yield p.pending_by_class.get(c, 0), {**base, "pool": p.name, "class": c}


def _waits(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
    for p in snap.pools:
        for q, field in _QUANTILES:
            yield getattr(p, field), {**base, "pool": p.name, "quantile": q}


def _attempts(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
    for p in snap.pools:
        yield p.succeeded, {**base, "pool": p.name, "result": "succeeded"}
        yield p.failed, {**base, "pool": p.name, "result": "failed"}


def _groups(field: str) -> _Reader:
    def read(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
        for p in snap.pools:
            for g in p.groups:
                label = ",".join(f"{k}={v}" for k, v in sorted(g.labels.items()))
                yield getattr(g, field), {**base, "pool": p.name, "group": label}
    return read


def _snapshot_field(field: str) -> _Reader:
    def read(snap: Snapshot, base: dict[str, str]) -> Iterator[tuple[float, dict[str, str]]]:
        yield getattr(snap, field), base
    return read


# (kind, name, unit, description, reader)
INSTRUMENTS = (
    ("counter", "cronoq.tasks.finished", "{task}", "Tasks that ended, by terminal status.", _tasks_finished),
    ("counter", "cronoq.tasks.submitted", "{task}", "Tasks admitted.", _total("submitted")),
    ("counter", "cronoq.dispatches", "{attempt}", "Attempts started.", _total("dispatched")),
    ("counter", "cronoq.retries", "{attempt}", "Retries scheduled.", _total("retries")),
    ("counter", "cronoq.timeouts", "{attempt}", "Attempts aborted by their timeout.", _total("timeouts")),
    ("counter", "cronoq.lease_expiries", "{attempt}", "Attempts aborted for a missing heartbeat.",
     _total("lease_expiries")),
    ("counter", "cronoq.stale_completions", "{report}",
     "Outcome reports for attempts that had already ended.",
     _total("stale_completions")),
    ("counter", "cronoq.recurring.conflicts", "{occurrence}",
     "Recurring occurrences not created for lack of reservable capacity.", _total("recurring_conflicts")),
    ("counter", "cronoq.recurring.invalid", "{schedule}",
     "Recurring schedules or occurrences the configuration cannot support.", _total("recurring_invalid")),
    ("gauge", "cronoq.tasks.live", "{task}", "Tasks not yet ended.", _snapshot_field("live_tasks")),
    ("gauge", "cronoq.tasks.running", "{task}", "Attempts running now.", _snapshot_field("running")),
    ("gauge", "cronoq.tasks.pending", "{task}", "Tasks waiting to run.", _snapshot_field("pending")),
    ("gauge", "cronoq.pool.capacity", "{worker}", "Concurrency slots of the pool.", _pools("capacity")),
    ("gauge", "cronoq.pool.busy", "{worker}", "Slots running an attempt.", _pools("busy")),
    ("gauge", "cronoq.pool.held", "{worker}", "Free slots held for imminent fixed starts.", _pools("held")),
    ("gauge", "cronoq.pool.stray_threads", "{thread}",
     "Threads still running a plain function whose attempt was given up.", _pools("stray_threads")),
    ("gauge", "cronoq.pool.desired_workers", "{worker}", "The autoscaler's target capacity.",
     _pools("desired")),
    ("gauge", "cronoq.pool.group.capacity", "{worker}", "Capacity of each worker group.",
     _groups("capacity")),
    ("gauge", "cronoq.pool.group.busy", "{worker}", "Busy slots of each worker group.", _groups("busy")),
    ("gauge", "cronoq.pool.pending", "{task}", "Pending tasks by priority class.", _pending_by_class),
    ("gauge", "cronoq.pool.reservations", "{reservation}", "Fixed-start reservations booked.",
     _pools("reservations")),
    ("gauge", "cronoq.pool.utilization", "1", "Busy / capacity slot-time over the metrics window.",
     _pools("utilization")),
    ("gauge", "cronoq.pool.priority_adherence", "1", "1 - inversions / dispatches over the metrics window.",
     _pools("priority_adherence")),
    ("gauge", "cronoq.pool.fixed_start_hit_rate", "1",
     "On-time fixed starts / judged, over the metrics window.",
     _pools("fixed_start_hit_rate")),
    ("gauge", "cronoq.pool.schedule_efficiency", "1", "Succeeded run time / all run time, over the window.",
     _pools("schedule_efficiency")),
    ("gauge", "cronoq.pool.wait", "s", "Wait from ready to dispatch over the window, by quantile.", _waits),
    ("gauge", "cronoq.pool.window.dispatches", "{attempt}", "Attempts started over the metrics window.",
     _pools("dispatched")),
    ("gauge", "cronoq.pool.window.attempts", "{attempt}", "Attempts that ended over the window, by result.",
     _attempts),
    ("counter", "cronoq.pool.worker_time", "s", "Capacity integrated over time since start.",
     _pools("worker_seconds")),
    ("counter", "cronoq.pool.cost", "{cost}", "worker_time x cost_per_worker_second since start.",
     _pools("cost")),
)


class _Instruments:
    """The instruments of one meter provider, shared by every scheduler instrumented with it."""

    def __init__(self, meter: Meter) -> None:
        self.sources: list[_Source] = []
        self.lock = threading.Lock()
        self.instruments: list[Asynchronous] = []
        for kind, name, unit, description, reader in INSTRUMENTS:
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            self.instruments.append(create(name, callbacks=[self._callback(reader)], unit=unit,
                                           description=description))

    def _callback(self, reader: _Reader) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self.lock:
                sources = list(self.sources)
            out: list[Observation] = []
            for source in sources:
                snap = source.snapshot()
                if snap is not None:
                    out.extend(Observation(value, attributes)
                               for value, attributes in reader(snap, source.attributes))
            return out
        return callback


_GLOBAL: _Instruments | None = None
_BY_PROVIDER: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()
_CREATE = threading.Lock()


def _instruments_for(meter_provider: MeterProvider | None) -> _Instruments:
    global _GLOBAL
    with _CREATE:
        if meter_provider is None:
            if _GLOBAL is None:
                _GLOBAL = _Instruments(_metrics.get_meter("cronoq", __version__))
            return _GLOBAL
        found = _BY_PROVIDER.get(meter_provider)
        if found is None:
            found = _BY_PROVIDER[meter_provider] = _Instruments(
                _metrics.get_meter("cronoq", __version__, meter_provider=meter_provider))
        return found


# ================================================================ the entry point

class Instrumentation:
    """What ``instrument`` turned on; ``uninstrument()`` turns it off."""

    def __init__(self, scheduler: Scheduler | BlockingScheduler, sched: Scheduler, source: _Source | None,
                 instruments: _Instruments | None, remove_middleware: Callable[[], None] | None,
                 remove_hook: Callable[[], None] | None, traces: bool, propagate: bool) -> None:
        self.scheduler = scheduler
        self._sched = sched
        self._source = source
        self._instruments = instruments
        self._remove_middleware = remove_middleware
        self._remove_hook = remove_hook
        self.traces = traces
        self.metrics = source is not None
        self.propagate = propagate
        self.active = True

    def uninstrument(self) -> None:
        """Stop reporting metrics and capturing trace context. Executors wrapped
        for spans stay wrapped once the scheduler has started."""
        if not self.active:
            return
        self.active = False
        if self._instruments is not None and self._source is not None:
            with self._instruments.lock:
                if self._source in self._instruments.sources:
                    self._instruments.sources.remove(self._source)
        if self._remove_hook is not None:
            self._remove_hook()
        if self._remove_middleware is not None:
            try:
                self._remove_middleware()
            except SchedulerError:
                pass   # started: its executors stay wrapped
        _INSTRUMENTED.pop(self._sched, None)

    def __repr__(self) -> str:
        on = [name for name, flag in (("metrics", self.metrics), ("traces", self.traces),
                                      ("propagate", self.propagate)) if flag]
        return f"<cronoq Instrumentation {'+'.join(on) or 'nothing'}{'' if self.active else ' (off)'}>"


def instrument(scheduler: Scheduler | BlockingScheduler, *, tracer_provider: TracerProvider | None = None,
               meter_provider: MeterProvider | None = None, traces: bool = True,
               metrics: bool = True, propagate: bool = True, name: str | None = None,
               snapshot_max_age: float = 0.5, timeout: float = 5.0) -> Instrumentation:
    """Instrument a ``Scheduler`` or ``BlockingScheduler`` with OpenTelemetry.

    ``traces`` (one span per attempt) must be turned on before the scheduler
    starts; ``metrics`` and ``propagate`` may be turned on at any time.
    ``tracer_provider`` / ``meter_provider`` default to the global providers.
    ``name``, when given, is added to every metric as the attribute
    ``scheduler`` (needed to tell several schedulers apart). Metric callbacks
    reuse a snapshot younger than ``snapshot_max_age`` seconds, and wait at
    most ``timeout`` seconds for the scheduler to answer.
    """
    sched = resolve(scheduler)
    if sched in _INSTRUMENTED:
        raise RuntimeError("this scheduler is already instrumented; call uninstrument() first")
    if isinstance(snapshot_max_age, bool) or not isinstance(snapshot_max_age, (int, float)) \
            or not snapshot_max_age >= 0:
        raise ValueError(f"snapshot_max_age must be a number of seconds >= 0, got {snapshot_max_age!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    remove_middleware = None
    if traces:
        tracer = _trace.get_tracer("cronoq", __version__, tracer_provider=tracer_provider)
        try:
            remove_middleware = sched.add_executor_middleware(
                lambda fn, is_async: _traced(fn, is_async, tracer))
        except SchedulerError:
            raise RuntimeError("instrument the scheduler before starting it to trace its attempts "
                               "(or pass traces=False)") from None
    source = instruments = None
    if metrics:
        source = _Source(sched, {} if name is None else {"scheduler": name}, float(snapshot_max_age),
                         float(timeout))
        instruments = _instruments_for(meter_provider)
        with instruments.lock:
            instruments.sources.append(source)
    remove_hook = sched.add_submit_hook(_with_traceparent) if propagate else None
    handle = Instrumentation(scheduler, sched, source, instruments, remove_middleware, remove_hook, traces,
                             propagate)
    _INSTRUMENTED[sched] = handle
    return handle
