"""Record a running scheduler's workload as a trace.

``TraceRecorder(sched, "trace.jsonl")`` attaches through the scheduler's
public hooks only:

- a submit hook notes when each submission arrived (before any wait for
  queue room);
- an admission listener (``Scheduler.add_admission_listener``) gives the
  ids of the tasks admitted, or the error that refused them;
- an executor middleware times every attempt and notes how it ended (only
  when the recorder is made before the scheduler starts: middleware cannot
  be added later);
- an event sink (``Scheduler.subscribe``) hears how each task ended. When
  the scheduler emits every transition (``emit_transitions=True``, as
  cronoq-server does), it also times the attempts the middleware cannot:
  those of pools with a ``runner`` (remote workers), or all of them when
  the recorder is made on a running scheduler. Such an attempt runs from
  its dispatch to the transition that ends it, and its outcome comes from
  that transition.

The hooks only append small tuples to a queue; a writer thread turns them
into JSON lines every ``flush_interval`` seconds, and also samples the
pools (``snapshot_from_thread``) for the live capacity and cost. The queue
is bounded: past ``max_buffer`` waiting records, new ones are dropped and
counted (the trace's footer says how many).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections import deque
from typing import IO, Any, Callable, Sequence

from ..core.errors import AdmissionError, SchedulerError
from ..core.types import (
    CANCELLED, DEAD_LETTERED, FAILED, NS, RETRYING, RUNNING, SUCCEEDED, TERMINAL, TaskSpec,
)
from ..runtime.context import TaskContext
from ..runtime.runner import outcome_of
from ..runtime.scheduler import Scheduler
from .policy import policy_of
from .trace import ABORTED, TRACE_VERSION, task_line

__all__ = ["TraceRecorder"]

log = logging.getLogger("cronoq.whatif")

_ARRIVE, _ADMIT, _ATTEMPT, _END = 1, 2, 3, 4
_EVENT_OUTCOMES = {RETRYING: "retryable", SUCCEEDED: "success", FAILED: "permanent",
                   DEAD_LETTERED: "retryable", CANCELLED: ABORTED}
_ARRIVALS_KEPT = 100_000   # arrivals never admitted (a failed encode, a hook that raised) are forgotten


class TraceRecorder:
    """Write ``scheduler``'s workload to ``path`` (a file name or an open
    text file) until ``close()`` or the scheduler's shutdown.

    Made before ``start()``, it also times every attempt (what a replay
    needs to run the workload as it ran); made on a running scheduler, it
    times them only if the scheduler emits every transition, else it records
    submissions and endings only (``times_attempts`` says which). Accepts a
    ``Scheduler`` or a ``BlockingScheduler``. ``sample_interval`` is how often (seconds) the
    pools' capacity, busy and cost are written (0: never).
    """

    def __init__(self, scheduler: Any, path: str | os.PathLike[str] | IO[str], *, flush_interval: float = 0.5,
                 sample_interval: float = 1.0, max_buffer: int = 1_000_000) -> None:
        sched = scheduler_of(scheduler)
        for name, value in (("flush_interval", flush_interval), ("sample_interval", sample_interval)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if flush_interval == 0:
            raise ValueError("flush_interval must be > 0")
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or max_buffer < 1:
            raise ValueError(f"max_buffer must be an integer >= 1, got {max_buffer!r}")
        self._sched = sched
        self._now_ns = sched.clock.now_ns
        self._own_file = isinstance(path, (str, os.PathLike))
        self._file: IO[str]
        if isinstance(path, (str, os.PathLike)):
            self._file = open(path, "w", encoding="utf-8")
        else:
            self._file = path
        self._queue: deque[tuple[Any, ...]] = deque()
        self._max = max_buffer
        self.dropped = 0
        self.written = 0
        self._recording = True
        self._closed = False
        self._close_lock = threading.Lock()
        self._flush_interval = float(flush_interval)
        self._sample_interval = float(sample_interval)
        self._arrivals: dict[int, tuple[int, TaskSpec]] = {}
        self._batches = 0
        self._refusals = 0
        self._first_usage: dict[str, tuple[float, float]] | None = None
        self._last_usage: dict[str, tuple[float, float]] | None = None
        self.t0_ns = self._now_ns()
        header = {"cronoq_trace": TRACE_VERSION, "t0": self.t0_ns / NS, "source": "recorder",
                  "policy": policy_of([p.config for p in sched.pools], list(sched.resources), sched.config)}
        self._file.write(json.dumps(header) + "\n")
        self._removers: list[Callable[[], None]] = []
        try:
            sched.add_executor_middleware(self._wrap)
            wrapped = True
        except SchedulerError:
            wrapped = False   # already started: only the events can time attempts
        untimed = [p.name for p in sched.pools if not (wrapped and p.runner is None)]
        self._event_timed = frozenset(untimed) if sched.config.emit_transitions else frozenset()
        self._started: dict[int, tuple[int, int]] = {}   # task id -> (attempt, dispatch ns): event-timed
        # Whether every pool's attempts are timed (by the middleware or the events).
        self.times_attempts = not untimed or bool(self._event_timed)
        self._removers.append(sched.add_submit_hook(self._arrived))
        self._removers.append(sched.add_admission_listener(self._admitted))
        self._subscribed = False
        self._subscribe()
        self._wake = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="cronoq-trace-writer", daemon=True)
        self._writer.start()

    # -------------------------------------------------------------- the hooks (hot paths)

    def _put(self, record: tuple[Any, ...]) -> None:
        if len(self._queue) < self._max:
            self._queue.append(record)
        else:
            self.dropped += 1

    def _subscribe(self) -> None:
        try:
            self._sched.subscribe(self)
            self._subscribed = True
        except RuntimeError:
            pass   # not started: the first submission subscribes

    def _arrived(self, spec: TaskSpec) -> TaskSpec:
        if self._recording:
            if not self._subscribed:
                self._subscribe()
            self._put((_ARRIVE, self._now_ns(), spec))
        return spec

    def _admitted(self, now: int, specs: Sequence[TaskSpec], results: Sequence[tuple[int, bool]] | None,
                  error: AdmissionError | None) -> None:
        if self._recording:
            self._put((_ADMIT, now, tuple(specs), results, error))

    def deliver(self, event: Any) -> None:
        """From the scheduler: a status event (its ``EventSink`` side)."""
        if not self._recording:
            return
        if self._event_timed and event.pool in self._event_timed:
            self._time_from_event(event)
        if event.status in TERMINAL:
            self._put((_END, event.id, round(event.at * NS), str(event.status)))

    def _time_from_event(self, event: Any) -> None:
        """An attempt of a pool the middleware does not time: from its
        dispatch (RUNNING) to the transition that ends it."""
        status = event.status
        at = round(event.at * 1e6) * 1000   # (a float of Unix seconds holds microseconds, no finer)
        if status == RUNNING:
            self._started[event.id] = (event.attempt, at)   # (a given-back lease: started again)
            return
        started = self._started.pop(event.id, None)
        if started is None:
            return
        attempt, start = started
        outcome = _EVENT_OUTCOMES.get(status)
        if status == RETRYING and event.attempt != attempt:
            outcome = None   # given back before it ran: not an attempt
        if outcome is None:
            return
        message = event.message or ""
        if status != SUCCEEDED and ("attempt timed out" in message or "lease expired" in message):
            outcome = ABORTED   # the scheduler gave it up: it reported nothing
        self._put((_ATTEMPT, event.id, attempt, start, at, outcome, None))

    def end(self) -> None:
        """From the scheduler: it stopped. The trace is closed."""
        self._subscribed = False
        self.close()

    def _wrap(self, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        now_ns = self._now_ns
        put = self._put

        if is_async:
            async def timed(ctx: TaskContext, payload: Any) -> Any:
                if not self._recording:
                    return await fn(ctx, payload)
                start = now_ns()
                try:
                    output = await fn(ctx, payload)
                except asyncio.CancelledError as exc:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():   # the scheduler gave the attempt up
                        put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), ABORTED, None))
                    else:
                        outcome, _, retry_after = outcome_of(exc)
                        put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), outcome, retry_after))
                    raise
                except BaseException as exc:
                    outcome, _, retry_after = outcome_of(exc)
                    put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), outcome, retry_after))
                    raise
                put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), "success", None))
                return output

            return timed

        def timed_sync(ctx: TaskContext, payload: Any) -> Any:
            if not self._recording:
                return fn(ctx, payload)
            start = now_ns()
            try:
                output = fn(ctx, payload)
            except BaseException as exc:
                outcome, _, retry_after = outcome_of(exc)
                put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), outcome, retry_after))
                raise
            put((_ATTEMPT, ctx.id, ctx.attempt, start, now_ns(), "success", None))
            return output

        return timed_sync

    # -------------------------------------------------------------- the writer

    def _write_loop(self) -> None:
        next_sample = 0.0
        elapsed = 0.0
        while not self._closed:
            self._wake.wait(self._flush_interval)
            elapsed += self._flush_interval
            try:
                if self._sample_interval and elapsed >= next_sample:
                    next_sample = elapsed + self._sample_interval
                    self._sample()
                self._drain()
            except Exception:  # a recorder must never take the program down
                log.exception("the trace recorder could not write", extra={"action": "trace_error"})

    def _sample(self) -> None:
        try:
            snap = self._sched.snapshot_from_thread(timeout=1.0)
        except (RuntimeError, SchedulerError):
            return   # not serving (yet, or any more)
        usage = {p.name: (p.worker_seconds, p.cost) for p in snap.pools}
        if self._first_usage is None:
            self._first_usage = usage
        self._last_usage = usage
        line = {"sample": round(snap.at * NS - self.t0_ns) / NS,
                "pools": {p.name: [p.capacity, p.desired, p.busy, p.pending] for p in snap.pools}}
        self._lines([json.dumps(line, separators=(",", ":"))])

    def _drain(self) -> None:
        queue = self._queue
        t0 = self.t0_ns
        dumps = json.dumps
        lines: list[str] = []
        while queue:
            record = queue.popleft()
            kind = record[0]
            if kind == _ATTEMPT:
                _, task_id, n, start, stop, outcome, retry_after = record
                if retry_after is None and type(task_id) is int:
                    # The common line, formatted directly (a float's repr is its JSON).
                    lines.append(f'{{"attempt":{task_id},"n":{n},"start":{(start - t0) / NS!r},'
                                 f'"seconds":{(stop - start) / NS!r},"outcome":"{outcome!s}"}}')
                    continue
                line: dict[str, Any] = {"attempt": task_id, "n": n, "start": (start - t0) / NS,
                                        "seconds": (stop - start) / NS, "outcome": str(outcome)}
                if retry_after is not None:
                    line["retry_after"] = retry_after / NS
                lines.append(dumps(line, separators=(",", ":")))
            elif kind == _END:
                _, task_id, at, status = record
                if type(task_id) is int:
                    lines.append(f'{{"end":{task_id},"at":{(at - t0) / NS!r},"status":"{status!s}"}}')
                else:
                    lines.append(dumps({"end": task_id, "at": (at - t0) / NS, "status": status},
                                       separators=(",", ":")))
            elif kind == _ARRIVE:
                arrivals = self._arrivals
                arrivals[id(record[2])] = (record[1], record[2])
                if len(arrivals) > _ARRIVALS_KEPT:
                    del arrivals[next(iter(arrivals))]
            else:
                _, now, specs, results, error = record
                batch = None
                if len(specs) > 1:
                    self._batches += 1
                    batch = self._batches
                for i, spec in enumerate(specs):
                    arrival = self._arrivals.pop(id(spec), None)
                    at = arrival[0] if arrival is not None and arrival[1] is spec else now
                    if error is not None:
                        self._refusals += 1
                        line = task_line(f"refused-{self._refusals}", at - t0, spec, t0, batch)
                        line["refused"] = f"{type(error).__name__}: {error}"
                    elif results[i][1]:
                        continue   # a duplicate: no new task
                    else:
                        line = task_line(results[i][0], at - t0, spec, t0, batch)
                    lines.append(dumps(line, separators=(",", ":")))
        self._lines(lines)

    def _lines(self, lines: list[str]) -> None:
        if lines:
            with self._close_lock:
                if self._file.closed:
                    return
                self._file.write("\n".join(lines) + "\n")
                self._file.flush()
            self.written += len(lines)

    # -------------------------------------------------------------- the end

    @property
    def recording(self) -> bool:
        return self._recording

    def close(self) -> None:
        """Stop recording, write what is left and the footer, close the file
        (if the recorder opened it). Closing twice does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._recording = False
        for remove in self._removers:
            remove()
        if self._subscribed:
            self._sched.unsubscribe(self)
        self._wake.set()
        if threading.current_thread() is not self._writer:
            self._writer.join(timeout=10)
        self._drain()
        footer: dict[str, Any] = {"end_of_trace": True, "dropped": self.dropped,
                                  "timed_attempts": self.times_attempts}
        if self._first_usage is not None and self._last_usage is not None:
            first, last = self._first_usage, self._last_usage
            footer["usage"] = {"worker_seconds": sum(last[p][0] - first.get(p, (0.0, 0.0))[0] for p in last),
                               "cost": sum(last[p][1] - first.get(p, (0.0, 0.0))[1] for p in last)}
        with self._close_lock:
            self._file.write(json.dumps(footer) + "\n")
            if self._own_file:
                self._file.close()
            else:
                self._file.flush()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scheduler_of(scheduler: Any) -> Scheduler:
    """The asyncio ``Scheduler`` behind a ``Scheduler`` or a ``BlockingScheduler``."""
    from ..blocking import BlockingScheduler

    if isinstance(scheduler, BlockingScheduler):
        return scheduler.scheduler
    if isinstance(scheduler, Scheduler):
        return scheduler
    raise TypeError(f"expected a cronoq.Scheduler or a cronoq.BlockingScheduler, got {type(scheduler).__name__}")
