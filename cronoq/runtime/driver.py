"""The engine driver: the lock, the engine, the action pump, the timer and
the runners' link.

Every change to the engine is made under ``EngineDriver.lock`` and followed
by ``pump``: dispatches go to the pool's runner, aborts cancel attempts,
terminal events resolve handles and reach event subscribers. With a store,
mutations go to the durable log's open batch first, and every other action
waits until the mutations before it are committed (the log's ``hold``),
then comes back through the same pump (``release``). One timer, armed for
the engine's next wake-up, is the only thing that runs on its own; an idle
scheduler arms none and uses no CPU.

The loop takes the lock for every step; other threads take it to admit a
task or read a snapshot at once (``EngineBackend.submit_from_thread``,
``snapshot_from_thread``), and then ask the loop to carry out what the
engine queued (``ask_pump``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..core.actions import ABORT, DISPATCH, EVENT, PERSIST, SCALE, event_from
from ..core.engine import Core
from ..core.types import CANCELLED, DEAD_LETTERED, SUCCEEDED, SUCCESS, TERMINAL, CoreConfig
from .checkpoints import CheckpointBook
from .clock import Cancellable, Clock, SystemClock
from .durability import DurableHooks, DurableLog
from .events import EventSink
from .lifecycle import NEW, RUNNING, SERVING, STARTING, STOPPED, Lifecycle
from .local import LocalRunner
from .pool import Pool
from .runner import Attempt, Runner, RunnerLink, abort_reason, aborter
from .threads import ThreadRunner
from . import process as _process

if TYPE_CHECKING:
    from .admission import Admission
    from .results import Results

__all__ = ["EngineDriver"]

log = logging.getLogger("cronoq.scheduler")

# The wall clock, read without a Python frame on the hot paths when the
# scheduler runs on a SystemClock. A module attribute on purpose: freezegun
# replaces module attributes that are the real function, so frozen time is seen.
_wall_ns = time.time_ns

# Terminal statuses the event path handles without logging (dead letters are logged).
_QUIET_ENDS = TERMINAL - {DEAD_LETTERED}

# A dispatch that found no thread to run it waits this long before it is tried again.
_NOT_STARTED_DELAY_NS = 1_000_000_000

Middleware = Callable[[Callable[..., Any], bool], Callable[..., Any]]


class EngineDriver:
    def __init__(self, life: Lifecycle, clock: Clock, config: CoreConfig, checkpoints: CheckpointBook,
                 middleware: list[Middleware]) -> None:
        self.life = life
        self.clock = clock
        self.now_ns = clock.now_ns
        self.system_time = type(clock) is SystemClock
        self.config = config
        self.checkpoints = checkpoints
        self.middleware = middleware
        # Guards the engine, the handles and the sinks (see the module docstring).
        self.lock = threading.RLock()
        self.core: Core | None = None
        self.log: DurableLog | None = None
        self.leading = False                       # this process runs the engine now
        self.runners: dict[str, Runner] = {}
        self.aborts: list[Callable[[int, str], bool]] = []   # each runner's abort(lease, reason)
        self.sinks: list[EventSink] = []
        self.scale_listeners: list[Callable[[str, int], None]] = []   # (pool, desired) when a target moves
        self.timer: Cancellable | None = None
        self.timer_at: int | None = None
        self.drained: asyncio.Event | None = None   # set once nothing runs (a shutdown waits on it)
        self._pump_asked = False                   # a thread asked the loop to pump
        self.forget_siblings: Callable[[], None] | None = None   # in memory: see process.note_in_memory
        # Set by the scheduler once made (they hold this driver).
        self.results: Results
        self.admission: Admission
        self.room: dict[Any, Any] = {}
        self._fork_hook = _process.after_fork(self._after_fork)

    def attach(self, results: Results, admission: Admission) -> None:
        self.results = results
        self.admission = admission
        self.room = admission.room

    def _after_fork(self) -> None:
        # In the child of a fork: a thread of the parent may have held it.
        self.lock = threading.RLock()

    # ================================================================ the pump

    def pump(self, released: int = 0) -> None:
        """Carry out everything the engine asked for, then re-arm the timer
        (under the lock). Each action is carried out here and only here.
        With a store, mutations go to the durable log's open batch and the
        effects after them are held until they are committed; ``released``:
        how many actions at the front are effects the log let go (see
        ``release``), carried out as they are."""
        core = self.core
        assert core is not None
        actions = core.actions
        log_ = self.log
        runners = self.runners
        results = self.results
        handles = results.handles
        sinks = self.sinks
        life = self.life
        while actions:
            raw = actions.popleft()
            kind = raw[0]
            if released:
                released -= 1
            elif log_ is not None:
                if kind == PERSIST:
                    log_.add(raw[1])
                    continue
                if log_.hold(raw):
                    continue
            if kind == DISPATCH:
                if life.state is not RUNNING:
                    # Committed before the shutdown began: it has not started, so it
                    # goes back to the queue (and the store) without using an attempt.
                    core.give_back(self.now_ns(), raw[2])
                    continue
                entry = raw[1]
                runners[entry.pool.name].start(Attempt(entry, raw[2], raw[3]))
            elif kind == EVENT:
                status = raw[4]
                if status is SUCCEEDED:
                    results.deliver(raw[1])
                elif status in _QUIET_ENDS:
                    if handles:
                        handle = handles.pop(raw[1], None)
                        if handle is not None:
                            results.resolve(handle, raw[1], status, raw[7])
                elif status is DEAD_LETTERED:
                    results.dead_letter(raw)
                if sinks:
                    event = event_from(raw)
                    for sink in sinks:
                        sink.deliver(event)
            elif kind == ABORT:
                self.abort(raw[1], abort_reason(raw[3]))
            elif kind == SCALE:
                for listener in self.scale_listeners:
                    listener(raw[1], raw[2])
        if log_ is not None:
            log_.kick()
        if self.room:
            self.admission.wake_room()
        if self.drained is not None and not core.running:
            self.drained.set()
        if self.timer_at is not None or core.timer_heap:
            self._arm()

    def release(self, effects: list[Any]) -> None:
        """Effects whose mutations were committed (the durable log's hook):
        carried out first, before whatever the engine asked for since."""
        with self.lock:
            if self.life.state not in SERVING:
                return
            core = self.core
            assert core is not None
            core.actions.extendleft(reversed(effects))
            self.pump(len(effects))

    def ask_pump(self) -> bool:
        """From another thread, under the lock: have the loop pump (once).
        True when this call must wake the loop: call ``wake_to_pump`` then,
        once the lock is released. (The wake-up is a system call that lets
        go of the interpreter: the loop thread, taking it then, would block
        on the lock this thread still holds, and both would queue for each
        other's lock and interpreter from then on.)"""
        if self._pump_asked:
            return False
        self._pump_asked = True
        return True

    def wake_to_pump(self) -> None:
        """From another thread, not under the lock, after ``ask_pump`` said so."""
        loop = self.life.loop
        assert loop is not None
        loop.call_soon_threadsafe(self._asked_pump)

    def _asked_pump(self) -> None:
        with self.lock:
            self._pump_asked = False
            if self.life.state in SERVING:
                self.pump()

    # ================================================================ the durable log's hooks

    def durable_hooks(self, fenced: Callable[[str], None]) -> DurableHooks:
        return DurableHooks(accepting_commits=self._accepting_commits, release=self.release,
                            withdraw=self._withdraw, drop_schedule=self._drop_schedule, fenced=fenced)

    def _accepting_commits(self) -> bool:
        return self.life.state in SERVING

    def _withdraw(self, task_ids: Iterable[int], message: str) -> None:
        """Submissions the store did not make durable, whose callers are told
        so: the engine forgets them."""
        with self.lock:
            if self.core is None:
                return
            handles = self.results.handles
            for task_id in self.core.withdraw(self.clock.now_ns(), task_ids, message):
                handle = handles.pop(task_id, None)
                for h in handle if isinstance(handle, list) else (() if handle is None else (handle,)):
                    h.set_failure(CANCELLED, message)
            self.pump()

    def _drop_schedule(self, name: str) -> None:
        """A schedule the store refused: remove it, so memory and store agree."""
        with self.lock:
            if self.core is not None:
                self.core.remove_recurring(self.clock.now_ns(), name)
                self.pump()

    # ================================================================ the timer

    def _arm(self) -> None:
        core = self.core
        assert core is not None
        if self.timer_at is None and not core.timer_heap:
            return   # no timer armed and none wanted: the common case, kept cheap
        at = core.next_wakeup()
        if at == self.timer_at:
            return
        self.stop_timer()
        self.timer_at = at
        if at is not None and self.life.state in SERVING:
            self.timer = self.clock.call_at(at, self.on_timer)

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def on_timer(self) -> None:
        with self.lock:
            self.timer = None
            self.timer_at = None
            loop = self.life.loop
            if self.life.state not in SERVING or loop is None or loop.is_closed():
                return
            core = self.core
            assert core is not None
            core.advance(self.clock.now_ns())
            self.pump()

    # ================================================================ the runners' link

    def engine_link(self, pool: Pool) -> RunnerLink:
        loop = self.life.loop
        assert loop is not None
        name = pool.name

        def set_capacity(labels: dict[str, str], slots: int) -> None:
            self._set_capacity_now(name, labels, slots)

        return RunnerLink(name, loop, self._report, self._heartbeat, self._not_started, set_capacity,
                          checkpoints=self.checkpoints)

    def make_runner(self, pool: Pool) -> Runner:
        link = self.engine_link(pool)
        if pool.runner is not None:
            return pool.runner(link)
        return self.executor_runner(pool, link)

    def executor_runner(self, pool: Pool, link: RunnerLink) -> Runner:
        """The runner of a pool's own executor (middleware applied), reporting through ``link``."""
        executor = pool.executor
        assert executor is not None
        for middleware in self.middleware:
            executor = middleware(executor, pool.is_async)
        return LocalRunner(link, executor) if pool.is_async else ThreadRunner(link, executor)

    def use_runners(self, runners: dict[str, Runner]) -> None:
        self.runners = runners
        self.aborts = [aborter(runner) for runner in runners.values()]

    def abort(self, lease: int, reason: str) -> None:
        """The runner that holds ``lease`` gives it up (``reason``: one of ABORT_REASONS)."""
        for abort in self.aborts:
            if abort(lease, reason):
                break

    def _report(self, attempt: Attempt, outcome: str, output: Any, message: str | None,
                retry_after_ns: int | None) -> None:
        """A runner's outcome for one attempt."""
        with self.lock:
            core = self.core
            if self.life.state is STOPPED or core is None:
                return
            now = _wall_ns() if self.system_time else self.now_ns()
            if core.complete(now, attempt.lease, outcome, output, message, retry_after_ns) \
                    and outcome == SUCCESS:
                # Kept until its success event goes out (with a store, once committed):
                # then it goes to the handles waiting for it, whatever the cache holds.
                self.results.delivering[attempt.id] = output
            self.pump()

    def _not_started(self, lease: int, message: str) -> None:
        """A runner could not start this attempt: it gives the attempt back."""
        with self.lock:
            state = self.life.state
            if state not in SERVING:
                return
            delay = _NOT_STARTED_DELAY_NS if state is RUNNING else 0
            core = self.core
            assert core is not None
            if core.give_back(self.now_ns(), lease, delay, message):
                log.warning("an attempt could not start (%s); its task waits %g s without using an attempt",
                            message, delay / 1e9, extra={"action": "not_started", "error": message})
            self.pump()

    def _heartbeat(self, lease: int) -> bool:
        with self.lock:
            if self.life.state not in SERVING:
                return False
            core = self.core
            assert core is not None
            alive = core.heartbeat(self.clock.now_ns(), lease)
            self.pump()
            return alive

    def _set_capacity_now(self, pool: str, labels: dict[str, str], slots: int) -> None:
        """A runner's capacity for a worker group (remote workers came or went;
        also while the runner is made, at start)."""
        with self.lock:
            core = self.core
            state = self.life.state
            if state is NEW or state is STOPPED or core is None:
                return
            core.set_group_capacity(self.clock.now_ns(), pool, labels, slots)
            if state is not STARTING:
                self.pump()

    def give_back(self, lease: int) -> None:
        """An attempt another process gave back unstarted: it waits again, no attempt used."""
        with self.lock:
            core = self.core
            if self.life.state not in SERVING or core is None or not self.leading:
                return
            core.give_back(self.now_ns(), lease)
            self.pump()

    # ================================================================ the end

    def finish(self) -> None:
        """The scheduler stops: no timer, every waiting handle fails, every
        subscriber's stream ends. (Its background tasks end on their own, or
        in ``shutdown``, which cancels and awaits those left.)"""
        with self.lock:
            self.stop_timer()
            self.results.fail_all()
            sinks, self.sinks = self.sinks, []
            self.life.stop()
        for sink in sinks:
            sink.end()
        forget, self.forget_siblings = self.forget_siblings, None
        if forget is not None:
            forget()
