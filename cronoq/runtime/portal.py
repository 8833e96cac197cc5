"""A portal into an event loop that runs on a thread of its own.

``BlockingScheduler`` is a synchronous facade over a ``Scheduler``: its
``Portal`` owns the loop thread, starts and stops it, and carries calls from
any thread onto the loop. Its promises:

- a call checks that the portal serves and hands itself to the loop under one
  lock, so a call that does not raise is one the loop will answer;
- when the loop thread ends, every call still in flight is settled with
  ``SchedulerError``; nothing waits for an answer that cannot come;
- a call from the loop thread itself raises instead of waiting for itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import threading
import time
import _thread
from typing import Any, Awaitable, Callable, ParamSpec, TypeVar, overload

from .. import realtime
from ..core.errors import SchedulerError

__all__ = ["Portal", "PortalState"]

log = logging.getLogger("cronoq.scheduler")

_T = TypeVar("_T")
_P = ParamSpec("_P")

Opening = Callable[[], Awaitable[None]]
Closing = Callable[[], Awaitable[None]]


class PortalState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


NEW, STARTING, RUNNING, STOPPING, STOPPED = PortalState


class _Call:
    """One blocked caller: a lock the loop releases with the answer.

    Settled once: the first answer wins (the loop's, or the error every call
    still in flight gets when the loop thread ends). While it waits it is in
    its portal's set of calls in flight, and it leaves the set when settled.
    """

    __slots__ = ("lock", "value", "error", "settled", "calls")

    def __init__(self, calls: set[_Call] | None = None) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.settled = False
        self.calls = calls

    def set(self, value: Any) -> None:
        if not self.settled:
            self.settled = True
            self.value = value
            if self.calls is not None:
                self.calls.discard(self)
            self.lock.release()

    def fail(self, error: BaseException) -> None:
        if not self.settled:
            self.settled = True
            self.error = error
            if self.calls is not None:
                self.calls.discard(self)
            self.lock.release()

    def wait(self) -> Any:
        self.lock.acquire()
        if self.error is not None:
            raise self.error
        return self.value


class Portal:
    """The loop thread of a synchronous facade, and the way in from other threads.

    ``start(opening, closing)`` starts the thread and runs ``await opening()``
    there; ``stop(closing)`` runs ``await closing()`` there and ends the
    thread. In between, ``call(fn, ...)`` runs ``fn`` on the loop (awaiting
    what it returns, if awaitable) and returns its result or raises its error.
    ``owner`` names the facade in the errors it raises.
    """

    def __init__(self, owner: str, thread_name: str) -> None:
        self._owner = owner
        self._thread_name = thread_name
        # The gate guards the state and the set of calls in flight: a call
        # checks the state and reaches the loop under it (see the module's doc).
        self._gate = threading.Lock()
        self._state = NEW
        self._calls: set[_Call] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None     # the loop thread's, while it runs
        # One run of the loop thread (reset by each start):
        self._opened = False                    # on the loop: the opening returned
        self._stop_signal: asyncio.Future[None] | None = None
        self._closing: Closing | None = None    # the first stop request's
        self._early_closing: asyncio.Task[None] | None = None
        self._stop_error: Exception | None = None

    @property
    def state(self) -> PortalState:
        return self._state

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    # ================================================================ from any thread

    def check_thread(self) -> None:
        """Raise if called from the loop thread (it would wait for itself)."""
        if threading.get_ident() == self._loop_ident:
            raise SchedulerError(f"{self._owner} was called from its own event loop thread (an async "
                                 "executor?); that would deadlock: use the async Scheduler there")

    def check(self) -> None:
        """Raise unless the portal serves, and this is not its loop thread:
        for a facade's calls that do their work on the calling thread. (No
        lock: nothing is handed to the loop here.)"""
        self.check_thread()
        if self._state is not RUNNING:
            raise self._refusal()

    @overload
    def call(self, fn: Callable[_P, Awaitable[_T]], /, *args: _P.args, **kwargs: _P.kwargs) -> _T: ...

    @overload
    def call(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T: ...

    def call(self, fn: Callable[_P, Any], /, *args: _P.args, **kwargs: _P.kwargs) -> Any:
        """Run ``fn(*args, **kwargs)`` on the loop, await its result if it is
        awaitable, and return it (or raise what it raised). It runs in a copy
        of the caller's context, as it would on the caller's thread (the
        scheduler's submit hooks read the caller's context variables)."""
        self.check_thread()
        context = contextvars.copy_context()
        waiter = _Call(self._calls)
        with self._gate:
            if self._state is not RUNNING:
                raise self._refusal()
            self._calls.add(waiter)
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._begin, waiter, fn, args, kwargs, context)
        return waiter.wait()

    def start(self, opening: Opening, closing: Closing) -> None:
        """Start the loop thread and run ``await opening()`` on it; return once
        it returned, or raise what it raised with the thread gone (the portal
        is then new again). A stop requested meanwhile makes ``start()``
        raise. ``closing`` is how to stop if this thread is interrupted
        while it waits (Ctrl-C)."""
        loop = realtime.new_event_loop()   # real timers even while a test freezes time
        ready = _Call()
        thread = threading.Thread(target=self._serve, args=(loop, opening, ready), name=self._thread_name,
                                  daemon=True)
        with self._gate:
            state = self._state
            if state is NEW:
                self._state = STARTING
                self._loop, self._thread = loop, thread
                self._opened, self._stop_signal, self._closing = False, None, None
                self._early_closing, self._stop_error = None, None
        if state is not NEW:
            loop.close()
            if state in (STOPPING, STOPPED):
                raise SchedulerError(f"this {self._owner} is shut down; create a new one to start again")
            raise SchedulerError(f"this {self._owner} was already started (it is {state.value})")
        try:
            thread.start()
            ready.wait()
        except BaseException as exc:  # noqa: B036 - re-raised once the thread is gone
            self._start_failed(thread, loop, closing, failed=exc is ready.error)
            raise
        with self._gate:
            serving = self._state is STARTING
            if serving:
                self._state = RUNNING
        if not serving:   # stopped meanwhile, from another thread
            thread.join()
            raise SchedulerError("the scheduler was shut down while it started")

    def request_stop(self, closing: Closing) -> threading.Thread | None:
        """Ask the loop thread to run ``await closing()`` and end (the first
        request counts); returns the thread to wait for, if there is one. A
        start still under way is asked to give up: ``closing`` runs at once,
        beside the opening, and again once the opening returned (if it
        succeeded)."""
        with self._gate:
            state = self._state
            if state is NEW:
                self._state = STOPPED
                return None
            if state in (STARTING, RUNNING):
                self._state = STOPPING
                self._closing = closing
                loop = self._loop
                assert loop is not None
                loop.call_soon_threadsafe(self._on_stop_request)   # open until the thread ends: see _serve
            return self._thread

    def stop(self, closing: Closing) -> None:
        """``request_stop(closing)``, then wait for the thread to end; raise
        what ``closing`` raised (an ``Exception``), if anything."""
        self.check_thread()     # the loop thread must never wait for itself
        thread = self.request_stop(closing)
        if thread is not None:
            self._join(thread)
        error, self._stop_error = self._stop_error, None
        if error is not None:
            raise error

    def _join(self, thread: threading.Thread) -> None:
        """Wait for ``thread`` to end. A stop can overtake ``start()`` between
        its taking the state and its ``Thread.start()``: then wait for the
        thread to be started, unless starting it failed (the portal is new
        again)."""
        while True:
            try:
                thread.join()
                return
            except RuntimeError:   # not started yet
                if thread.ident is None and self._state is NEW:
                    return
                time.sleep(0.001)

    def _refusal(self) -> BaseException:
        """The error for a call made while the portal does not serve."""
        if self._state is NEW:
            return RuntimeError("the scheduler is not started: use 'with' or call start()")
        if self._state is STARTING:
            return SchedulerError("the scheduler is starting")
        return SchedulerError("the scheduler is shut down")

    def _start_failed(self, thread: threading.Thread, loop: asyncio.AbstractEventLoop, closing: Closing,
                      failed: bool) -> None:
        """Leave no thread behind after a start that failed (``failed``) or was
        interrupted (Ctrl-C while a standby waits, no thread to be had)."""
        if not failed:
            self.request_stop(closing)
        deadline = realtime.real_monotonic() + 1.0
        while True:
            try:
                thread.join()
                return
            except RuntimeError:   # not started: interrupted inside Thread.start(), or never will be
                if realtime.real_monotonic() > deadline and thread.ident is None:
                    break
                time.sleep(0.001)
        loop.close()               # nothing ran on it
        with self._gate:
            self._state = NEW

    # ================================================================ on the loop thread

    def _serve(self, loop: asyncio.AbstractEventLoop, opening: Opening, ready: _Call) -> None:
        self._loop_ident = threading.get_ident()
        asyncio.set_event_loop(loop)
        try:
            main = loop.create_task(self._main(opening, ready))
            while not main.done():
                try:
                    loop.run_until_complete(main)
                except (KeyboardInterrupt, SystemExit) as exc:
                    # An async executor raised it (its attempt already failed): a
                    # private loop thread has no caller to hand it to, so it goes on.
                    log.error("an executor raised %s on the scheduler's loop thread; the scheduler goes "
                              "on", type(exc).__name__, extra={"action": "executor_exit"})
        finally:
            with self._gate:
                # From here no call reaches the loop: fail those in flight.
                self._state = NEW if self._state is STARTING else STOPPED
                pending = list(self._calls)
            error = SchedulerError("the scheduler shut down")
            for call in pending:
                call.fail(error)
            ready.fail(error)    # only if the start never answered
            try:
                self._close_loop(loop)
            finally:
                self._loop_ident = None

    async def _main(self, opening: Opening, ready: _Call) -> None:
        self._stop_signal = asyncio.get_running_loop().create_future()
        with self._gate:
            stop_early = self._state is STOPPING
        try:
            if stop_early:
                raise SchedulerError("the scheduler was shut down while it started")
            await opening()
        except BaseException as exc:  # noqa: B036 - handed to the start() caller
            ready.fail(exc)
            if self._early_closing is not None:
                await self._early_closing
            return
        self._opened = True
        ready.set(None)
        await self._stop_signal
        if self._early_closing is not None:   # it came too late to make the opening give up
            await self._early_closing
        await self._close()

    def _on_stop_request(self) -> None:
        stop = self._stop_signal
        if stop is not None and not stop.done():
            stop.set_result(None)
        if not self._opened and self._early_closing is None:
            # A start that waits (a standby waiting to lead) gives up; its
            # start() raises.
            self._early_closing = asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        closing = self._closing
        assert closing is not None
        try:
            await closing()
        except Exception as exc:  # handed to the stop() caller
            self._stop_error = exc

    def _begin(self, call: _Call, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               context: contextvars.Context) -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: B036 - handed to the caller
            call.fail(exc)
            return
        if inspect.isawaitable(result):
            asyncio.get_running_loop().create_task(self._finish(call, result), context=context)
        else:
            call.set(result)

    @staticmethod
    async def _finish(call: _Call, awaitable: Awaitable[Any]) -> None:
        try:
            value = await awaitable
        except BaseException as exc:  # noqa: B036 - handed to the caller
            call.fail(exc)
        else:
            call.set(value)

    @staticmethod
    def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
