"""cronoq.runtime.portal: the loop thread under BlockingScheduler, on its own."""

import asyncio
import contextvars
import threading

import pytest

from cronoq import SchedulerError
from cronoq.runtime.portal import Portal, PortalState

WAIT = 20     # seconds; only reached when a test fails

request = contextvars.ContextVar("request", default=None)


async def nothing():
    return None


def in_thread(fn):
    outcome = []

    def run():
        try:
            outcome.append(("ok", fn()))
        except BaseException as exc:  # noqa: B036 - recorded for the test
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def portal():
    portal = Portal("Thing", "test-portal")
    portal.start(nothing, nothing)
    yield portal
    portal.stop(nothing)


def test_a_call_runs_on_the_loop_thread_and_returns_or_raises():
    portal = Portal("Thing", "test-portal")
    with pytest.raises(RuntimeError, match="not started"):
        portal.call(lambda: 1)
    portal.start(nothing, nothing)
    try:
        assert portal.state is PortalState.RUNNING
        assert portal.call(threading.current_thread).name == "test-portal"     # a plain call

        async def add(a, b):
            await asyncio.sleep(0)
            return a + b

        assert portal.call(add, 2, b=3) == 5                                    # a coroutine function

        async def fails():
            raise KeyError("inside")

        with pytest.raises(KeyError, match="inside"):
            portal.call(fails)
        with pytest.raises(ZeroDivisionError):
            portal.call(lambda: 1 / 0)
    finally:
        portal.stop(nothing)
    assert portal.state is PortalState.STOPPED and not portal.thread.is_alive()
    with pytest.raises(SchedulerError, match="shut down"):
        portal.call(lambda: 1)
    with pytest.raises(SchedulerError, match="shut down"):
        portal.start(nothing, nothing)


def test_a_call_runs_in_a_copy_of_the_callers_context(portal):
    async def read():
        request.set("changed on the loop")     # the copy changes, not the caller's
        return request.get()

    token = request.set("the caller's")
    try:
        assert portal.call(request.get) == "the caller's"
        assert portal.call(read) == "changed on the loop"
        assert request.get() == "the caller's"
    finally:
        request.reset(token)


def test_a_call_from_the_loop_thread_raises_instead_of_waiting_for_itself(portal):
    def from_the_loop():
        errors = []
        for attempt in (lambda: portal.call(lambda: 1), portal.check, lambda: portal.stop(nothing)):
            try:
                attempt()
            except SchedulerError as exc:
                errors.append(str(exc))
        return errors

    errors = portal.call(from_the_loop)
    assert len(errors) == 3 and all("Thing was called from its own event loop thread" in e for e in errors)
    assert portal.state is PortalState.RUNNING


def test_every_call_in_flight_is_settled_when_the_portal_stops():
    portal = Portal("Thing", "test-portal")
    portal.start(nothing, nothing)
    under_way = []
    all_under_way = threading.Event()

    async def never_answers():
        under_way.append(True)         # on the loop thread: no race
        if len(under_way) == 3:
            all_under_way.set()
        await asyncio.Event().wait()

    callers = [in_thread(lambda: portal.call(never_answers)) for _ in range(3)]
    closing_ran = []

    async def closing():
        closing_ran.append(True)

    assert all_under_way.wait(WAIT)
    portal.stop(closing)
    for thread, outcome in callers:
        thread.join(WAIT)
        assert not thread.is_alive(), "a call in flight was never settled"
        [(kind, error)] = outcome
        assert kind == "error" and isinstance(error, SchedulerError) and "shut down" in str(error)
    assert closing_ran == [True]


def test_the_opening_and_closing_run_on_the_loop_and_their_errors_reach_the_caller():
    portal = Portal("Thing", "test-portal")

    async def opening_fails():
        raise ValueError("cannot open")

    with pytest.raises(ValueError, match="cannot open"):
        portal.start(opening_fails, nothing)
    assert portal.state is PortalState.NEW and not portal.thread.is_alive()   # and it may start again
    portal.start(nothing, nothing)

    async def closing_fails():
        raise OSError("cannot close")

    with pytest.raises(OSError, match="cannot close"):
        portal.stop(closing_fails)
    assert portal.state is PortalState.STOPPED and not portal.thread.is_alive()
    portal.stop(nothing)     # again: nothing to do, nothing raised


def test_a_stop_during_the_opening_makes_it_give_up():
    portal = Portal("Thing", "test-portal")
    opening_waits = threading.Event()
    give_up = asyncio.Event()

    async def opening():
        opening_waits.set()
        await give_up.wait()
        raise SchedulerError("gave up")

    async def closing():
        give_up.set()

    starter, started = in_thread(lambda: portal.start(opening, nothing))
    assert opening_waits.wait(WAIT)
    portal.stop(closing)
    starter.join(WAIT)
    assert not starter.is_alive(), "start() never gave up"
    [(kind, error)] = started
    assert kind == "error" and str(error) == "gave up"
    assert portal.state is PortalState.STOPPED and not portal.thread.is_alive()


def test_a_stop_that_overtakes_the_start_of_the_thread_waits_for_it(monkeypatch):
    # start() has taken the state but not yet started its thread when another
    # thread stops the portal: the stop waits for the thread instead of failing
    # with "cannot join thread before it is started".
    import cronoq.runtime.portal as portal_module

    entered, release = threading.Event(), threading.Event()

    class SlowToStart(threading.Thread):
        def start(self):
            if self.name == "test-portal":   # the portal's loop thread, not the test's helpers
                entered.set()
                assert release.wait(WAIT)
            super().start()

    monkeypatch.setattr(portal_module.threading, "Thread", SlowToStart)
    portal = Portal("Thing", "test-portal")
    starter, started = in_thread(lambda: portal.start(nothing, nothing))
    assert entered.wait(WAIT)
    stopper, stopped = in_thread(lambda: portal.stop(nothing))
    stopper.join(0.2)
    assert stopper.is_alive()               # waiting for the thread, not failed
    release.set()
    stopper.join(WAIT)
    starter.join(WAIT)
    assert stopped == [("ok", None)]
    [(kind, error)] = started
    assert kind == "error" and isinstance(error, SchedulerError) and "shut down" in str(error)
    assert portal.state is PortalState.STOPPED and not portal.thread.is_alive()
