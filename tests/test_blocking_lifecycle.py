"""BlockingScheduler against shutdown (issue 10, point 8): any call that does
not raise is answered, calls in flight are settled on stop, a standby can be
shut down, and a failed start leaves no thread behind."""

import asyncio
import os
import subprocess
import sys
import threading

import pytest

import cronoq
from cronoq.store import InMemoryStore, MemoryDatabase

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = 20     # seconds; only reached when a test fails


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def double(ctx, x):
    return x * 2


def loop_threads():
    return [t for t in threading.enumerate() if t.name == "cronoq-scheduler"]


def in_thread(fn, name=None):
    """Run ``fn`` in a thread; returns (thread, outcome list [("ok", value) | ("error", exc)])."""
    outcome = []

    def run():
        try:
            outcome.append(("ok", fn()))
        except BaseException as exc:  # noqa: B036 - recorded for the test
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


CALLS = {
    "submit": lambda bs: bs.submit(1),
    "enqueue": lambda bs: bs.enqueue(1),
    "snapshot": lambda bs: bs.snapshot(),
    "events": lambda bs: bs.events(),
    "set_capacity": lambda bs: bs.set_capacity("default", 1),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_that_passed_its_checks_as_shutdown_ends_gets_a_scheduler_error(name):
    bs = cronoq.BlockingScheduler([fixed("default", double)])
    bs.start()
    stopped = threading.Event()
    waiting = threading.Event()
    real_check = bs._portal.check_thread

    def check_then_wait():
        # The call has passed its first checks; the scheduler stops before it goes on.
        real_check()
        if threading.current_thread().name == "racer":
            waiting.set()
            assert stopped.wait(WAIT)

    bs._portal.check_thread = check_then_wait
    thread, outcome = in_thread(lambda: CALLS[name](bs), name="racer")
    assert waiting.wait(WAIT)
    bs.shutdown()
    stopped.set()
    thread.join(WAIT)
    assert not thread.is_alive(), "the call never returned"
    [(kind, value)] = outcome
    assert kind == "error" and isinstance(value, cronoq.SchedulerError), value


def test_a_call_in_flight_when_the_scheduler_stops_gets_a_scheduler_error():
    bs = cronoq.BlockingScheduler([fixed("default", double)])
    bs.start()
    entered = threading.Event()

    async def never_answers(ref):
        entered.set()
        await asyncio.Event().wait()

    bs.scheduler.info = never_answers      # a call that goes through the loop
    thread, outcome = in_thread(lambda: bs.info(1))
    assert entered.wait(WAIT)
    bs.shutdown()
    thread.join(WAIT)
    assert not thread.is_alive(), "the call in flight was never settled"
    [(kind, value)] = outcome
    assert kind == "error" and isinstance(value, cronoq.SchedulerError), value


def test_threads_calling_through_a_shutdown_each_get_an_answer_or_an_error():
    bs = cronoq.BlockingScheduler([fixed("default", double, capacity=4)])
    bs.start()
    go = threading.Barrier(9, timeout=WAIT)
    busy = threading.Event()
    results: list = []

    def producer(i):
        go.wait()
        while True:
            try:
                handle = bs.submit(i) if i % 2 else bs.enqueue(i)
            except cronoq.SchedulerError:
                return
            except BaseException as exc:  # noqa: B036 - anything else is the defect
                results.append(("unexpected", exc))
                return
            results.append(("accepted", handle))
            if len(results) >= 100:
                busy.set()

    threads = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    go.wait()
    assert busy.wait(WAIT)
    bs.shutdown()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a caller never got an answer"
    assert [r for r in results if r[0] == "unexpected"] == []
    for _, value in results:
        if isinstance(value, cronoq.BlockingHandle):
            assert value.done()    # answered, or failed with status "shutdown"


def test_a_standby_waiting_to_lead_can_be_shut_down():
    database = MemoryDatabase()
    leader = cronoq.BlockingScheduler([fixed("default", double)], store=InMemoryStore(database))
    leader.start()
    standby = cronoq.BlockingScheduler([fixed("default", double)], store=InMemoryStore(database))
    try:
        before = len(loop_threads())
        starter, outcome = in_thread(standby.start)
        while len(loop_threads()) == before and starter.is_alive():
            threading.Event().wait(0.005)     # the standby's loop thread is up and waiting
        assert starter.is_alive()
        stopper, stopped = in_thread(standby.shutdown)
        stopper.join(WAIT)
        starter.join(WAIT)
        assert not stopper.is_alive(), "shutdown() of a standby never returned"
        assert not starter.is_alive(), "start() of a standby never gave up"
        assert stopped == [("ok", None)]
        [(kind, error)] = outcome
        assert kind == "error" and isinstance(error, cronoq.SchedulerError)
        assert "shut down" in str(error)
        assert not standby._portal.thread.is_alive()
        assert leader.submit(2).result(timeout=WAIT) == 4     # the leader did not notice
    finally:
        leader.shutdown()


class BrokenStore(InMemoryStore):
    """Leads, then fails to recover the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def recover(self, now_ns, retention_ns):
        if self.failures:
            self.failures -= 1
            raise cronoq.SchedulerError("recovery failed (test)")
        return await super().recover(now_ns, retention_ns)


def test_a_failed_start_leaves_no_thread_and_can_be_tried_again():
    bs = cronoq.BlockingScheduler([fixed("default", double)], store=BrokenStore(failures=1))
    before = len(loop_threads())
    with pytest.raises(cronoq.SchedulerError, match="recovery failed"):
        bs.start()
    assert len(loop_threads()) == before
    assert not bs._portal.thread.is_alive()
    with pytest.raises(RuntimeError, match="not started"):
        bs.submit(1)
    bs.start()          # the store recovers this time
    try:
        assert bs.submit(21).result(timeout=WAIT) == 42
    finally:
        bs.shutdown()
    assert len(loop_threads()) == before


def test_shutdown_after_a_failed_start_does_not_raise():
    bs = cronoq.BlockingScheduler([fixed("default", double)], store=BrokenStore(failures=1))
    with pytest.raises(cronoq.SchedulerError):
        bs.start()
    bs.shutdown()
    with pytest.raises(cronoq.SchedulerError, match="shut down"):
        bs.start()


STANDBY_INTERRUPTED = """
import os, signal, threading, cronoq
from cronoq.store import InMemoryStore, MemoryDatabase

async def double(ctx, x):
    return x * 2

database = MemoryDatabase()
pools = lambda: [cronoq.Pool("default", double, autoscale=False)]
leader = cronoq.BlockingScheduler(pools(), store=InMemoryStore(database))
leader.start()
standby = cronoq.BlockingScheduler(pools(), store=InMemoryStore(database))

def interrupt():
    leaders = leader._portal.thread
    while not [t for t in threading.enumerate() if t.name == "cronoq-scheduler" and t is not leaders]:
        threading.Event().wait(0.005)
    os.kill(os.getpid(), signal.SIGINT)     # Ctrl-C while the standby waits in start()

threading.Thread(target=interrupt, daemon=True).start()
try:
    standby.start()
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("loop threads left:", sum(t.name == "cronoq-scheduler" for t in threading.enumerate()) - 1, flush=True)
print("leader works:", leader.submit(4).result(timeout=20), flush=True)
leader.shutdown()
"""


def test_ctrl_c_while_a_standby_waits_in_start_stops_its_thread():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", STANDBY_INTERRUPTED], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["interrupted", "loop threads left: 0", "leader works: 8"]


def test_in_a_fork_child_the_parents_handles_and_streams_raise_instead_of_waiting(monkeypatch):
    from cronoq.runtime import process

    release = threading.Event()

    def work(ctx, payload):
        release.wait(WAIT)
        return payload

    bs = cronoq.BlockingScheduler([fixed("default", work)])
    bs.start()
    try:
        handle = bs.submit("pending")
        stream = bs.events()
        monkeypatch.setattr(process, "forks", process.forks + 1)   # as the fork handler does in a child
        bs._after_fork()
        for call in (lambda: handle.result(timeout=WAIT), lambda: stream.next(timeout=WAIT)):
            with pytest.raises(cronoq.SchedulerError, match="fork"):
                call()
        assert not bs.running and bs.state_here == "inherited"
        bs.shutdown()       # inherited and never started here: nothing to stop, the parent's is untouched
        stream.close()
        bs._at_exit()       # the child's exit hook leaves the parent's scheduler alone
        monkeypatch.undo()
        assert bs.running and bs._portal.thread.is_alive()
        release.set()
        assert handle.result(timeout=WAIT) == "pending"
    finally:
        release.set()
        bs.shutdown()


FORK_CHILD_STARTS_ITS_OWN = r"""
import os, sys, threading
import cronoq

def work(ctx, payload):
    return (payload, os.getpid())

bs = cronoq.BlockingScheduler([cronoq.Pool("p", work, min=2, max=2, autoscale=False)])
bs.start()
before = bs.submit("parent").result(timeout=30)
pid = os.fork()
if pid == 0:
    results = []
    def call(i):
        results.append(bs.submit(i).result(timeout=30))   # the first call starts the child's own scheduler
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    ok = sorted(r[0] for r in results) == list(range(8)) and {r[1] for r in results} == {os.getpid()}
    bs.shutdown()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child exit:", os.waitstatus_to_exitcode(status))
print("parent still runs here:", bs.submit("again").result(timeout=30) == ("again", os.getpid()))
bs.shutdown()
"""


def test_a_scheduler_started_before_a_fork_starts_afresh_in_the_child_on_first_use():
    """gunicorn --preload with a scheduler started at import: each worker's
    first calls (from several threads at once) start a scheduler of its own."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", FORK_CHILD_STARTS_ITS_OWN], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child exit: 0", "parent still runs here: True"], proc.stderr


FORK_CHILD_FIRST_CALL_ON_THE_LOOP = r"""
import os, sys
import cronoq

async def double(ctx, x):
    return x * 2

async def answer():
    return 42

CALLS = {   # each the child's first call: one that runs on the (child's own) loop
    "recurring": lambda bs: bs.recurring() == [],
    "list_tasks": lambda bs: isinstance(bs.list_tasks(), list),
    "set_capacity": lambda bs: bs.set_capacity("p", 2) is None,
    "remove_recurring": lambda bs: bs.remove_recurring("none") is False,
    "enqueue_batch": lambda bs: len(bs.enqueue_batch([cronoq.Task(1)])) == 1,
    "submit_batch": lambda bs: [h.result(timeout=30) for h in bs.submit_batch([cronoq.Task(2)])] == [4],
    "call": lambda bs: bs.call(answer) == 42,
}

bs = cronoq.BlockingScheduler([cronoq.Pool("p", double, min=1, max=4, autoscale=False)])
bs.start()
for name, call in CALLS.items():
    pid = os.fork()
    if pid == 0:
        try:
            outcome = "ok" if call(bs) else "wrong answer"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        print(f"{name}: {outcome}", flush=True)
        bs.shutdown()
        os._exit(0)
    os.waitpid(pid, 0)
print("parent:", bs.submit(5).result(timeout=30))
bs.shutdown()
"""


def test_in_a_fork_child_a_first_call_that_runs_on_the_loop_starts_the_childs_own_scheduler():
    """The first call in a fork's child starts a scheduler of the child's own,
    whichever call it is: not only a submit, also one the loop answers."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", FORK_CHILD_FIRST_CALL_ON_THE_LOOP], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "recurring: ok", "list_tasks: ok", "set_capacity: ok", "remove_recurring: ok", "enqueue_batch: ok",
        "submit_batch: ok", "call: ok", "parent: 10"], proc.stderr


def test_a_shutdown_while_start_makes_its_loop_gives_no_error_and_leaves_no_thread(monkeypatch):
    """shutdown() from another thread at any moment of start() (here: while
    start() makes its event loop) stops the scheduler without an error of
    its own; start() raises SchedulerError and leaves no thread."""
    from cronoq import realtime

    bs = cronoq.BlockingScheduler([fixed("default", double)])
    real_new_event_loop = realtime.new_event_loop
    stopped = []

    def new_event_loop():
        stopper, outcome = in_thread(bs.shutdown)
        stopper.join(WAIT)
        stopped.extend(outcome)
        return real_new_event_loop()

    monkeypatch.setattr(realtime, "new_event_loop", new_event_loop)
    before = len(loop_threads())
    with pytest.raises(cronoq.SchedulerError, match="shut down"):
        bs.start()
    assert stopped == [("ok", None)]
    assert len(loop_threads()) == before
    assert bs.state_here == "stopped"
