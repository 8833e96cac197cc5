"""cronoq.BlockingScheduler: the thread-safe synchronous facade."""

import asyncio
import atexit
import concurrent.futures
import inspect
import os
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import wsgiref.simple_server

import pytest

import cronoq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def double(ctx, x):
    return x * 2


def failure(handle, timeout=10):
    with pytest.raises(cronoq.TaskFailed) as info:
        handle.result(timeout=timeout)
    return info.value


@pytest.fixture
def gate():
    event = threading.Event()
    yield event
    event.set()     # never leave an executor thread blocked


# ---------------------------------------------------------------- parity


def _public_methods(cls):
    return {name: fn for name, fn in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def _shape(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_public_scheduler_method_has_a_synchronous_twin():
    # The entry points other threads use to reach a running Scheduler need no twin.
    async_methods = {name: fn for name, fn in _public_methods(cronoq.Scheduler).items()
                     if not name.endswith("_from_thread")}
    sync_methods = _public_methods(cronoq.BlockingScheduler)
    assert len(async_methods) >= 15
    missing = sorted(set(async_methods) - set(sync_methods))
    assert missing == []
    for name, fn in async_methods.items():
        twin = sync_methods[name]
        assert _shape(twin) == _shape(fn), name
        assert not inspect.iscoroutinefunction(twin), f"BlockingScheduler.{name} must be synchronous"


# Public members of Scheduler that BlockingScheduler deliberately lacks, and why.
NO_TWIN = {
    "submit_from_thread": "the entry point of other threads into a running Scheduler: "
                          "BlockingScheduler.submit and enqueue are built on it",
    "snapshot_from_thread": "likewise: BlockingScheduler.snapshot is built on it",
    "config": "read it on .scheduler: a plain attribute, safe from any thread",
    "leading": "read it on .scheduler (start() says so): a plain attribute, safe from any thread",
    "epoch": "read it on .scheduler: the leader's term, a property safe from any thread",
    "lost_reason": "read it on .scheduler: why the lead was lost, a property safe from any thread",
}
# Public members of BlockingScheduler alone, and why.
FACADE_ONLY = {
    "call": "runs a coroutine function on the scheduler's loop: async code awaits it instead",
    "ensure_started": "starts the loop thread unless it runs in this process (server hooks, forks)",
    "scheduler": "the async Scheduler underneath",
    "loop": "the event loop of the facade's thread",
    "state_here": "the facade's lifecycle in this process, fork included",
}
# Twins with a docstring of their own: the async one does not describe the blocking call.
OWN_DOCSTRINGS = {"submit", "events", "start", "shutdown"}


def _public_members(cls):
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_the_public_surfaces_are_equal_but_for_the_listed_differences():
    async_members = _public_members(cronoq.Scheduler)
    sync_members = _public_members(cronoq.BlockingScheduler)
    assert sorted(set(async_members) - set(sync_members)) == sorted(NO_TWIN)
    assert sorted(set(sync_members) - set(async_members)) == sorted(FACADE_ONLY)
    for name in sorted(set(async_members) & set(sync_members)):
        original, twin = async_members[name], sync_members[name]
        assert type(twin) is type(original), f"BlockingScheduler.{name} is not of the same kind"
        if inspect.isfunction(original):
            assert _shape(twin) == _shape(original), name
            assert not inspect.iscoroutinefunction(twin), f"BlockingScheduler.{name} must be synchronous"
            assert twin.__doc__, f"BlockingScheduler.{name} has no docstring"
            if name not in OWN_DOCSTRINGS:
                assert twin.__doc__ == original.__doc__, f"BlockingScheduler.{name}: not the shared docstring"


def test_blocking_scheduler_takes_the_same_options():
    assert _shape(cronoq.BlockingScheduler.__init__) == _shape(cronoq.Scheduler.__init__)
    assert isinstance(inspect.getattr_static(cronoq.BlockingScheduler, "running"), property)


def test_handle_and_stream_have_the_documented_surface():
    assert [p.name for p in inspect.signature(cronoq.BlockingHandle.result).parameters.values()] == \
        ["self", "timeout"]
    assert inspect.signature(cronoq.BlockingHandle.result).parameters["timeout"].default is None
    for name in ("id", "key", "duplicate"):
        assert name in cronoq.BlockingHandle.__slots__
    assert callable(cronoq.BlockingHandle.done)
    assert callable(cronoq.BlockingEventStream.__next__)


# ---------------------------------------------------------------- lifecycle


def test_with_block_submit_and_result():
    with cronoq.BlockingScheduler([fixed("default", double)]) as bs:
        assert bs.running is True
        handle = bs.submit(21, key="answer")
        assert isinstance(handle, cronoq.BlockingHandle)
        assert (handle.key, handle.duplicate) == ("answer", False)
        assert isinstance(handle.id, int)
        assert handle.result(timeout=10) == 42
        assert handle.done() is True and handle.status == "succeeded"
        assert handle.result() == 42
        dup = bs.submit(0, key="answer")
        assert (dup.id, dup.duplicate) == (handle.id, True)
        assert dup.result(timeout=10) == 42
    assert bs.running is False
    assert not bs._portal.thread.is_alive()


def test_explicit_start_and_shutdown_and_errors_around_them():
    bs = cronoq.BlockingScheduler([fixed("default", double)])
    with pytest.raises(RuntimeError, match="not started"):
        bs.submit(1)
    with pytest.raises(RuntimeError):
        bs.snapshot()
    bs.start()
    try:
        with pytest.raises(cronoq.SchedulerError, match="already"):
            bs.start()
        assert bs.submit(2).result(timeout=10) == 4
    finally:
        bs.shutdown()
    bs.shutdown()       # idempotent
    for call in (lambda: bs.submit(1), lambda: bs.enqueue(1), bs.snapshot, lambda: bs.info(1),
                 lambda: bs.cancel(1), lambda: bs.events(), lambda: bs.set_capacity("default", 2)):
        with pytest.raises(cronoq.SchedulerError):
            call()


def test_sync_and_async_executors_both_work():
    def plain(ctx, x):
        return ("thread", threading.current_thread().name != "cronoq-scheduler", x)

    async def coro(ctx, x):
        return ("loop", threading.current_thread().name == "cronoq-scheduler", x)

    with cronoq.BlockingScheduler([fixed("sync", plain), fixed("async", coro)]) as bs:
        assert bs.submit(1, pool="sync").result(timeout=10) == ("thread", True, 1)
        assert bs.submit(2, pool="async").result(timeout=10) == ("loop", True, 2)


def test_result_timeout_raises_builtin_timeout_error_while_the_task_keeps_running(gate):
    def slow(ctx, x):
        assert gate.wait(10)
        return x

    with cronoq.BlockingScheduler([fixed("default", slow)]) as bs:
        handle = bs.submit("v")
        t = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            handle.result(timeout=0.05)
        assert type(info.value) is TimeoutError
        assert time.monotonic() - t >= 0.04
        assert handle.done() is False and handle.status is None
        assert bs.info(handle.id).status == "running"
        with pytest.raises(TimeoutError):
            handle.result(timeout=0)
        gate.set()
        assert handle.result(timeout=10) == "v"


def test_explain_says_why_a_task_waits_and_that_a_running_one_does_not(gate):
    def slow(ctx, x):
        assert gate.wait(10)
        return x

    with cronoq.BlockingScheduler([fixed("default", slow)]) as bs:
        running = bs.submit("first")
        queued = bs.submit("second", priority="low")
        while bs.info(running.id).status != "running":
            time.sleep(0.01)
        assert bs.explain(running.id).reasons == ()
        answer = bs.explain(queued.id)
        assert (answer.status, answer.priority, answer.position) == ("ready", "low", 1)
        assert [r.code for r in answer.reasons] == ["pool_full"]
        with pytest.raises(cronoq.UnknownTask):
            bs.explain(10**12)
        gate.set()
        assert queued.result(timeout=10) == "second"


def test_many_threads_can_wait_on_one_handle(gate):
    def slow(ctx, x):
        assert gate.wait(10)
        return x

    with cronoq.BlockingScheduler([fixed("default", slow)]) as bs:
        handle = bs.submit("shared")
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            waits = [ex.submit(handle.result, 10) for _ in range(4)]
            assert not any(w.done() for w in waits)
            gate.set()
            assert [w.result(timeout=10) for w in waits] == ["shared"] * 4
        assert handle.result() == "shared"


def test_failed_task_raises_task_failed():
    async def run(ctx, x):
        raise cronoq.Permanent(f"bad {x}")

    with cronoq.BlockingScheduler([fixed("default", run)]) as bs:
        handle = bs.submit(3)
        err = failure(handle)
    assert (err.status, err.message, err.task_id) == ("failed", "bad 3", handle.id)
    assert handle.status == "failed"


def test_shutdown_resolves_unfinished_handles_with_shutdown(gate):
    cancelled = threading.Event()

    async def stuck(ctx, x):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    bs = cronoq.BlockingScheduler([fixed("default", stuck)], shutdown_grace=0.05)
    bs.start()
    running = bs.submit("running")
    queued = bs.submit("queued")
    bs.shutdown()
    for handle in (running, queued):
        err = failure(handle, timeout=5)
        assert (err.status, err.task_id) == ("shutdown", handle.id)
    assert cancelled.is_set()


def test_shutdown_grace_lets_running_work_finish(gate):
    def slow(ctx, x):
        assert gate.wait(10)
        return x

    bs = cronoq.BlockingScheduler([fixed("default", slow)], shutdown_grace=30)
    bs.start()
    handle = bs.submit("done in time")
    stopper = threading.Thread(target=bs.shutdown)
    stopper.start()
    stopper.join(0.05)
    assert stopper.is_alive()        # waiting for the running attempt
    gate.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert handle.result(timeout=0) == "done in time"


# ---------------------------------------------------------------- the rest of the API


def test_enqueue_batches_cancel_handle_info_snapshot_capacity(gate):
    def run(ctx, x):
        if x == "block":
            assert gate.wait(10)
        if x == "bad":
            raise cronoq.Permanent("no")
        return x

    pool = cronoq.Pool("default", run, min=1, max=4, initial=1, autoscale=False)   # room for set_capacity
    with cronoq.BlockingScheduler([pool]) as bs:
        blocker = bs.submit("block")
        task_id = bs.enqueue("queued", key="q")
        assert isinstance(task_id, int) and task_id > blocker.id
        handles = bs.submit_batch([cronoq.Task("b1", key="b1"), cronoq.Task("b2", after="b1")])
        assert [h.key for h in handles] == ["b1", None]
        ids = bs.enqueue_batch([cronoq.Task("e1"), cronoq.Task("e2")])
        assert len(ids) == 2 and ids[0] < ids[1]
        with pytest.raises(cronoq.UnknownPool) as info:
            bs.submit_batch([cronoq.Task("ok"), cronoq.Task("x", pool="nope")])
        assert info.value.index == 1
        assert bs.cancel("q") is True
        assert bs.cancel(task_id) is False
        with pytest.raises(cronoq.UnknownTask):
            bs.cancel("missing")
        with pytest.raises(cronoq.InvalidTask):
            bs.submit(1, timeout=-1)
        assert bs.info("q").status == "cancelled"
        assert failure(bs.handle("q")).status == "cancelled"
        snap = bs.snapshot()
        assert isinstance(snap, cronoq.Snapshot)
        assert (snap.pool("default").busy, snap.pool("default").pending) == (1, 4)
        bs.set_capacity("default", 3)
        assert bs.snapshot().pool("default").capacity == 3
        bs.set_group_capacity("default", {"zone": "eu"}, 1)
        labelled = bs.submit("labelled", labels={"zone": "eu"})
        gate.set()
        assert blocker.result(timeout=10) == "block"
        assert [h.result(timeout=10) for h in handles] == ["b1", "b2"]
        assert [bs.handle(i).result(timeout=10) for i in ids] == ["e1", "e2"]
        assert labelled.result(timeout=10) == "labelled"
        assert bs.handle("b1").result(timeout=10) == "b1"
        totals = bs.snapshot().totals
    assert totals["succeeded"] == 6 and totals["cancelled"] == 1


def test_recurring_with_a_virtual_clock():
    clock = cronoq.VirtualClock()
    runs = []

    async def run(ctx, x):
        runs.append((ctx.key, clock.now()))
        return x

    with cronoq.BlockingScheduler([fixed("default", run)], clock=clock) as bs:
        t0 = clock.now()
        assert bs.add_recurring("tick", "*/5 * * * *", "t", key="tick") is None
        asyncio.run_coroutine_threadsafe(clock.advance(900), bs.loop).result(10)
        assert bs.remove_recurring("tick") is True
        assert bs.remove_recurring("tick") is False
        asyncio.run_coroutine_threadsafe(clock.advance(900), bs.loop).result(10)
        assert bs.handle("tick@2026-01-01T00:10:00Z").result(timeout=10) == "t"
    assert runs == [(f"tick@2026-01-01T00:{m:02d}:00Z", t0 + 60 * m) for m in (5, 10, 15)]


def test_overflow_wait_blocks_the_submitting_thread_until_room(gate):
    def run(ctx, x):
        if x == "block":
            assert gate.wait(10)
        return x

    pool = fixed("default", run, max_pending=1, overflow="wait")
    with cronoq.BlockingScheduler([pool]) as bs:
        first = bs.submit("block")
        bs.enqueue("pending")
        result = {}

        def submitter():
            result["handle"] = bs.submit("waited")

        thread = threading.Thread(target=submitter)
        thread.start()
        thread.join(0.05)
        assert thread.is_alive()
        assert bs.snapshot().totals["submitted"] == 2
        gate.set()
        thread.join(10)
        assert not thread.is_alive()
        assert result["handle"].result(timeout=10) == "waited"
        assert first.result(timeout=10) == "block"


def test_overflow_reject_raises_queue_full_in_the_calling_thread(gate):
    def run(ctx, x):
        assert gate.wait(10)
        return x

    pool = fixed("default", run, max_pending=1, overflow="reject")
    with cronoq.BlockingScheduler([pool]) as bs:
        bs.submit("running")
        bs.submit("pending")
        errors = []

        def submitter():
            try:
                bs.submit("refused")
            except cronoq.QueueFull as exc:
                errors.append(exc)

        thread = threading.Thread(target=submitter)
        thread.start()
        thread.join(10)
        assert len(errors) == 1 and isinstance(errors[0], cronoq.AdmissionError)
        gate.set()


def test_waiting_submitter_gets_scheduler_error_at_shutdown(gate):
    def run(ctx, x):
        assert gate.wait(10)
        return x

    pool = fixed("default", run, max_pending=1, overflow="wait")
    bs = cronoq.BlockingScheduler([pool], shutdown_grace=0)
    bs.start()
    bs.submit("running")
    bs.submit("pending")
    errors = []

    def submitter():
        try:
            bs.submit("never")
        except cronoq.SchedulerError as exc:
            errors.append(exc)

    thread = threading.Thread(target=submitter)
    thread.start()
    thread.join(0.05)
    assert thread.is_alive()
    bs.shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1


# ---------------------------------------------------------------- events


def test_blocking_event_stream():
    async def run(ctx, x):
        if x == "bad":
            raise cronoq.Permanent("nope")
        return x

    bs = cronoq.BlockingScheduler([fixed("default", run)])
    bs.start()
    try:
        with bs.events() as events:
            assert isinstance(events, cronoq.BlockingEventStream)
            ok = bs.submit("ok", key="ok")
            bad = bs.submit("bad")
            first = events.next(timeout=10)
            second = next(events)
            assert [(e.id, e.key, e.status) for e in (first, second)] == \
                [(ok.id, "ok", "succeeded"), (bad.id, None, "failed")]
            assert second.message == "nope"
            with pytest.raises(TimeoutError):
                events.next(timeout=0.01)
        assert events.closed
        # a stream iterated in another thread ends at shutdown
        stream = bs.events()
        seen = []
        consumer = threading.Thread(target=lambda: seen.extend(e.status for e in stream))
        consumer.start()
        bs.submit("x").result(timeout=10)
    finally:
        bs.shutdown()
    consumer.join(10)
    assert not consumer.is_alive()
    assert seen == ["succeeded"]


def test_blocking_event_stream_lag():
    with cronoq.BlockingScheduler([fixed("default", double)], event_capacity=2) as bs:
        dropping = bs.events()
        raising = bs.events(on_lag="raise")
        handles = [bs.submit(i) for i in range(5)]
        for h in handles:
            h.result(timeout=10)
        assert dropping.lagged == 3
        assert [e.id for e in (dropping.next(1), dropping.next(1))] == [h.id for h in handles[-2:]]
        with pytest.raises(cronoq.EventsLagged) as info:
            raising.next(1)
        assert info.value.skipped == 3
        assert [e.id for e in (raising.next(1), raising.next(1))] == [h.id for h in handles[-2:]]
        dropping.close()
        raising.close()
        with pytest.raises(ValueError):
            bs.events(on_lag="wait")


# ---------------------------------------------------------------- threads


def test_sixteen_threads_submitting_concurrently_lose_and_duplicate_nothing():
    executed = []

    async def run(ctx, payload):
        executed.append(ctx.id)
        thread, i = payload
        return thread * 1000 + i

    threads, per_thread = 16, 2000
    with cronoq.BlockingScheduler([fixed("default", run, capacity=8)]) as bs:
        start = threading.Barrier(threads)

        def work(t):
            start.wait()
            handles = [bs.submit((t, i)) for i in range(per_thread)]
            return [(h.id, h.result(timeout=30), t * 1000 + i) for i, h in enumerate(handles)]

        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            results = [r for chunk in ex.map(work, range(threads)) for r in chunk]
        snap = bs.snapshot()
    ids = [task_id for task_id, _, _ in results]
    assert len(results) == threads * per_thread
    assert len(set(ids)) == len(ids)
    assert all(got == expected for _, got, expected in results)
    assert sorted(executed) == sorted(ids)
    assert snap.totals["submitted"] == snap.totals["succeeded"] == threads * per_thread


def test_threads_using_enqueue_and_keys_concurrently():
    seen = []

    def run(ctx, payload):
        seen.append(payload)
        return payload

    with cronoq.BlockingScheduler([fixed("default", run, capacity=4)]) as bs:
        def work(t):
            # every thread submits the same 50 keys: each key runs once
            return [bs.submit(f"k{i}", key=f"k{i}").id for i in range(50)]

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            per_thread = list(ex.map(work, range(8)))
        assert all(ids == per_thread[0] for ids in per_thread)
        for key_id in per_thread[0]:
            bs.handle(key_id).result(timeout=10)
    assert sorted(seen) == sorted(f"k{i}" for i in range(50))


def test_sync_executor_may_use_the_blocking_scheduler():
    # plain executors run in worker threads, not the loop thread: allowed
    holder = {}

    def parent(ctx, x):
        return holder["bs"].submit(x, pool="child").result(timeout=10) + 1

    async def child(ctx, x):
        return x * 10

    with cronoq.BlockingScheduler([fixed("parent", parent), fixed("child", child)]) as bs:
        holder["bs"] = bs
        assert bs.submit(4, pool="parent").result(timeout=10) == 41


def test_calls_from_the_loop_thread_raise_instead_of_deadlocking():
    holder = {}

    async def run(ctx, x):
        bs = holder["bs"]
        errors = []
        for call in (lambda: bs.submit(1), lambda: bs.enqueue(1), bs.snapshot, lambda: bs.info(1),
                     lambda: bs.events(), lambda: bs.cancel(1), lambda: bs.shutdown()):
            try:
                call()
            except cronoq.SchedulerError as exc:
                errors.append(str(exc))
        return errors

    bs = cronoq.BlockingScheduler([fixed("default", run)])
    holder["bs"] = bs
    bs.start()
    try:
        errors = bs.submit(0).result(timeout=10)
        assert len(errors) == 7
        assert all("own event loop thread" in e for e in errors)
        # still fully usable afterwards (the failed shutdown did not stop anything half-way)
        assert bs.running
        assert isinstance(bs.submit(0).result(timeout=10), list)
    finally:
        bs.shutdown()
    assert not bs.running
    assert not bs._portal.thread.is_alive()


def test_shutdown_called_from_an_executor_during_shutdown_raises_instead_of_deadlocking():
    holder = {}
    started = threading.Event()
    entered = asyncio.Event()

    async def run(ctx, x):
        started.set()
        await entered.wait()           # the main thread is inside shutdown(), holding its lock
        try:
            holder["bs"].shutdown()
        except cronoq.SchedulerError as exc:
            return f"refused: {exc}"
        return "no error"

    bs = cronoq.BlockingScheduler([fixed("default", run)], shutdown_grace=10)
    holder["bs"] = bs
    real_shutdown = bs.scheduler.shutdown

    async def shutdown_hook(grace=None):
        entered.set()
        await real_shutdown(grace)

    bs.scheduler.shutdown = shutdown_hook
    bs.start()
    handle = bs.submit(0)
    assert started.wait(10)
    stopper = threading.Thread(target=bs.shutdown, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "shutdown deadlocked"
    assert handle.result(timeout=0).startswith("refused: ")
    assert not bs._portal.thread.is_alive()


# ---------------------------------------------------------------- atexit


def test_the_exit_hook_knows_a_scheduler_from_start_to_shutdown():
    from cronoq import blocking

    bs = cronoq.BlockingScheduler([fixed("default", double)])
    assert bs not in blocking._live
    bs.start()
    assert bs in blocking._live
    assert blocking._exit_hook_registered
    bs.shutdown()
    assert bs not in blocking._live


def test_the_atexit_hook_shuts_the_scheduler_down():
    async def stuck(ctx, x):
        await asyncio.Event().wait()

    bs = cronoq.BlockingScheduler([fixed("default", stuck)], shutdown_grace=0.01)
    bs.start()
    handle = bs.submit("x")
    try:
        bs._at_exit()        # what the interpreter does at exit
        assert not bs.running and not bs._portal.thread.is_alive()
        assert failure(handle, timeout=5).status == "shutdown"
    finally:
        bs.shutdown()


SCRIPT = """
import asyncio, cronoq

async def stuck(ctx, x):
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        print("executor cancelled", flush=True)
        raise

bs = cronoq.BlockingScheduler([cronoq.Pool("default", stuck, autoscale=False)], shutdown_grace=0.05)
bs.start()
handle = bs.submit(1)
print("submitted", handle.id, flush=True)
# the script ends without calling shutdown()
"""


def test_interpreter_exit_without_shutdown_is_clean():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["submitted 1", "executor cancelled"]
    assert "Traceback" not in proc.stderr


WAITER_AT_EXIT = """
import asyncio, threading, cronoq

async def stuck(ctx, x):
    await asyncio.Event().wait()

bs = cronoq.BlockingScheduler([cronoq.Pool("default", stuck, autoscale=False)], shutdown_grace=0.05)
bs.start()
handle = bs.submit(1)

def wait_for_it():
    try:
        handle.result()          # no timeout: only the scheduler's shutdown ends this wait
    except cronoq.TaskFailed as exc:
        print("the waiter saw", exc.status, flush=True)

threading.Thread(target=wait_for_it).start()   # not a daemon: interpreter exit joins it
# the main thread ends without calling shutdown()
"""


def test_interpreter_exit_shuts_down_before_it_joins_a_thread_that_waits_for_a_task():
    # Why the exit hook runs before the interpreter joins non-daemon threads:
    # one that waits for a task's result would otherwise be waited for forever.
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", WAITER_AT_EXIT], capture_output=True, text=True, timeout=60,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["the waiter saw shutdown"]


WITHOUT_THE_EARLY_HOOK = {
    "missing": "del threading._register_atexit\n",
    "refusing": "def refuse(fn):\n    raise RuntimeError(\"can't register atexit after shutdown\")\n"
                "threading._register_atexit = refuse\n",
}


@pytest.mark.parametrize("how", sorted(WITHOUT_THE_EARLY_HOOK))
def test_without_threadings_early_exit_hook_interpreter_exit_still_shuts_down(how):
    # The fallback (atexit) where threading._register_atexit is missing or
    # refuses: the scheduler still stops at exit, its executors cancelled.
    # (concurrent.futures registers its own hook with it first, at import.)
    script = "import threading, concurrent.futures.thread\n" + WITHOUT_THE_EARLY_HOOK[how] + SCRIPT
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["submitted 1", "executor cancelled"]
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- inside a threaded WSGI server


class ThreadingWSGIServer(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    daemon_threads = True


class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


def test_blocking_scheduler_inside_a_threaded_wsgi_server():
    released = threading.Event()

    def work(ctx, payload):
        op, n = payload
        if op == "square":
            return n * n
        if op == "wait":                # blocks until another request releases it
            assert released.wait(10)
            return -1
        if op == "release":
            released.set()
            return 0
        raise cronoq.Permanent(f"unknown op {op!r}")

    sched = cronoq.BlockingScheduler([fixed("default", work, capacity=4)])
    served_by = set()

    def app(environ, start_response):
        served_by.add(threading.get_ident())
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        op = environ["PATH_INFO"].strip("/")
        n = int(query.get("n", ["0"])[0])
        try:
            value = sched.submit((op, n), kind=op, priority="high" if op == "release" else "normal") \
                .result(timeout=20)
        except cronoq.TaskFailed as exc:
            start_response("422 Unprocessable Entity", [("Content-Type", "text/plain")])
            return [f"{exc.status}: {exc.message}".encode()]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(value).encode()]

    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, server_class=ThreadingWSGIServer,
                                               handler_class=QuietHandler)
    port = server.server_address[1]
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(path):
        try:
            with opener.open(f"http://127.0.0.1:{port}{path}", timeout=20) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    sched.start()
    serving.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as clients:
            waiting = clients.submit(get, "/wait")
            squares = list(clients.map(get, [f"/square?n={i}" for i in range(40)]))
            assert not waiting.done()          # still blocked in its task
            assert get("/release") == (200, "0")
            assert waiting.result(timeout=20) == (200, "-1")
            assert get("/explode") == (422, "failed: unknown op 'explode'")
        assert squares == [(200, str(i * i)) for i in range(40)]
        assert len(served_by) > 1                 # requests were served on several threads
        snap = sched.snapshot()
        assert snap.totals["succeeded"] == 42 and snap.totals["failed"] == 1
    finally:
        server.shutdown()
        server.server_close()
        serving.join(10)
        sched.shutdown()
    assert not serving.is_alive()
    assert not sched.running and not sched._portal.thread.is_alive()


def test_a_submit_from_a_thread_does_not_wait_for_the_loop():
    # Admission runs on the submitting thread, under the engine's lock: while
    # an executor holds the loop thread, submissions are still answered (with
    # their ids, and their errors), and they run once the loop is free.
    hold, holding = threading.Event(), threading.Event()

    async def blocks_the_loop(ctx, payload):
        if payload == "hog":
            holding.set()
            hold.wait(30)          # on purpose: the loop thread is stuck here
        return payload

    with cronoq.BlockingScheduler([fixed("default", blocks_the_loop, capacity=4)]) as bs:
        bs.enqueue("hog")
        assert holding.wait(30)
        handles = [bs.submit(i, key=f"k{i}") for i in range(100)]
        assert [h.duplicate for h in handles] == [False] * 100
        with pytest.raises(cronoq.UnknownPool):
            bs.submit(1, pool="nope")
        again = bs.submit(0, key="k0")
        assert again.duplicate and again.id == handles[0].id
        hold.set()
        assert [h.result(timeout=30) for h in handles] == list(range(100))


def test_a_submit_wakes_the_idle_loop_once_it_let_go_of_the_engine():
    # Waking the loop is a system call that lets go of the interpreter. Made
    # under the engine's lock, it let the loop thread take the interpreter
    # only to block on that lock; then each thread held what the other waited
    # for, and every submit after met a busy engine.
    with cronoq.BlockingScheduler([fixed("default", double)]) as bs:
        driver = bs.scheduler._driver
        loop = bs.loop
        real = loop.call_soon_threadsafe
        held_at_wake = []

        def spy(callback, *args, **kwargs):
            if callback == driver._asked_pump:
                held_at_wake.append(driver.lock._is_owned())
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = spy
        try:
            for i in range(5):
                assert bs.submit(i).result(timeout=10) == 2 * i   # the loop is idle again after each
            handles = [bs.submit(i) for i in range(100)]
            assert [h.result(timeout=10) for h in handles] == [2 * i for i in range(100)]
        finally:
            del loop.call_soon_threadsafe
    assert len(held_at_wake) >= 5
    assert not any(held_at_wake)


def test_reservations_lists_a_fixed_start_from_a_plain_thread():
    with cronoq.BlockingScheduler([fixed("default", double)]) as bs:
        later = bs.enqueue(1, start_in=3600, key="hourly")
        soon = bs.submit(2)
        assert soon.result(timeout=10) == 4
        listed = bs.reservations(7200)
        assert [(r.id, r.key, r.held) for r in listed] == [(later, "hourly", False)]
        assert bs.reservations(60) == []
        assert bs.reservations(7200, pools=["elsewhere"]) == []
