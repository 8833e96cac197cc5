"""The legacy ElasticPriorityScheduler drop-in (cronoq_compat / cronoq.compat)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import cronoq
import cronoq.compat
import cronoq_compat
from cronoq_compat import (
    DuplicateTaskError, ElasticPriorityScheduler, Priority, QualityMetrics, ReservationConflictError,
    Task, UnknownDependencyError,
)

ROOT = Path(__file__).resolve().parent.parent


def test_both_imports_give_the_same_objects():
    for name in ("ElasticPriorityScheduler", "Priority", "Task", "QualityMetrics"):
        assert getattr(cronoq.compat, name) is getattr(cronoq_compat, name)


def test_the_books_step_one_script_runs_unchanged_after_the_import_swap():
    script = textwrap.dedent("""\
        from cronoq.compat import ElasticPriorityScheduler, Priority, Task

        import time

        scheduler = ElasticPriorityScheduler(initial_workers=1, max_workers=4)
        scheduler.start()
        scheduler.submit(Task(id="report", duration=2.0, priority=Priority.HIGH))
        scheduler.submit(Task(id="nightly", duration=0.5, fixed_start=time.time() + 60))
        scheduler.submit(Task(id="email", duration=0.2, dependencies=["report"]))
        ...
        print(scheduler.get_metrics())   # QualityMetrics(schedule_quality=..., priority_adherence=...)
        scheduler.stop()
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("QualityMetrics(schedule_quality=")
    assert "priority_adherence=1.0" in out.stdout


def wait_for(predicate, timeout=10.0):
    # Polling a legacy, synchronous API is what its users do; the timeout only bounds a failure.
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_legacy_calls_run_tasks_in_priority_order_and_count_completions():
    order = []
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1) as sched:
        native = sched.native
        seen = native.events()
        sched.submit(Task(id="blocker", duration=0.05))
        sched.submit(Task(id="low", duration=0.0, priority=Priority.LOW))
        sched.submit(Task(id="critical", duration=0.0, priority=Priority.CRITICAL))
        sched.submit(Task(id="normal", duration=0.0))
        for _ in range(4):
            event = seen.next(timeout=10)
            order.append(native.info(event.id).key)
        seen.close()
        assert order == ["blocker", "critical", "normal", "low"]
        assert sched.completed_count == 4
        metrics = sched.get_metrics()
        assert isinstance(metrics, QualityMetrics)
        assert metrics.completed == 4
        assert metrics.priority_adherence == 1.0
        assert sched.get_cost() == 0.0


def test_dependencies_run_after_their_parent_and_skip_when_it_cannot_succeed():
    with ElasticPriorityScheduler(initial_workers=2, max_workers=2) as sched:
        sched.submit(Task(id="parent", duration=0.02))
        sched.submit(Task(id="child", duration=0.0, dependencies=["parent"]))
        child = sched.native.handle("child")
        assert child.result(timeout=10) is None
        parent = sched.native.info("parent")
        assert parent.status == "succeeded"
        # A parent that ended long before still counts (retained statuses).
        sched.submit(Task(id="late-child", duration=0.0, dependencies=["parent"]))
        assert sched.native.handle("late-child").result(timeout=10) is None


def test_submit_errors_are_value_errors_and_admit_nothing():
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1) as sched:
        sched.submit(Task(id="a", duration=0.0))
        before = sched.native.snapshot().totals["submitted"]
        with pytest.raises(DuplicateTaskError) as dup:
            sched.submit(Task(id="a", duration=0.0))
        assert isinstance(dup.value, ValueError) and "'a'" in str(dup.value)
        with pytest.raises(UnknownDependencyError) as unknown:
            sched.submit(Task(id="b", duration=0.0, dependencies=["nope"]))
        assert isinstance(unknown.value, ValueError)
        assert isinstance(unknown.value, cronoq.UnknownDependency)
        start = time.time() + 30
        sched.submit(Task(id="fixed-1", duration=1.0, fixed_start=start))
        with pytest.raises(ReservationConflictError) as conflict:
            sched.submit(Task(id="fixed-2", duration=1.0, fixed_start=start + 0.5))
        assert isinstance(conflict.value, ValueError)
        with pytest.raises(ValueError):
            Task(id="c", duration=-1)
        with pytest.raises(ValueError):
            Task(id="c", duration=float("nan"))
        after = sched.native.snapshot().totals["submitted"]
        assert after == before + 1          # only fixed-1 was admitted
        with pytest.raises(cronoq.UnknownTask):
            sched.native.info("b")
        with pytest.raises(cronoq.UnknownTask):
            sched.native.info("fixed-2")


def test_fixed_starts_are_admitted_against_real_capacity():
    # max_workers=4 allows floor(4 * 0.5) = 2 overlapping reservations, not 1.
    with ElasticPriorityScheduler(initial_workers=1, max_workers=4) as sched:
        start = time.time() + 60
        sched.submit(Task(id="f1", duration=5.0, fixed_start=start))
        sched.submit(Task(id="f2", duration=5.0, fixed_start=start + 1))
        with pytest.raises(ReservationConflictError):
            sched.submit(Task(id="f3", duration=5.0, fixed_start=start + 2))
        # Back-to-back with f1 and f2 is fine.
        sched.submit(Task(id="f4", duration=1.0, fixed_start=start + 20))


def test_fixed_start_runs_on_time_and_counts_in_the_metrics():
    with ElasticPriorityScheduler(initial_workers=1, max_workers=2) as sched:
        sched.submit(Task(id="soon", duration=0.0, fixed_start=time.time() + 0.2))
        assert sched.native.handle("soon").result(timeout=10) is None
        metrics = sched.get_metrics()
        assert metrics.fixed_start_hit_rate == 1.0
        assert metrics.timeliness == 1.0


def test_schedule_quality_is_the_documented_combination():
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1) as sched:
        # A deadline that is already past can only be missed; one that is far
        # away is met: timeliness is exactly one half.
        sched.submit(Task(id="missed", duration=0.0, deadline=time.time() - 10))
        sched.submit(Task(id="met", duration=0.0, deadline=time.time() + 60))
        sched.native.handle("met").result(timeout=10)
        sched.native.handle("missed").result(timeout=10)
        m = sched.get_metrics()
        assert m.deadline_hit_rate == 0.5
        assert m.timeliness == 0.5
        assert m.priority_adherence == 1.0
        assert m.schedule_quality == pytest.approx(0.4 * 0.5 + 0.4 * 1.0 + 0.2 * m.utilization)
        for value in (m.schedule_quality, m.priority_adherence, m.utilization, m.timeliness):
            assert 0.0 <= value <= 1.0


def test_a_busy_single_worker_scores_near_one():
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1) as sched:
        for i in range(20):
            sched.submit(Task(id=f"t{i}", duration=0.01))
        sched.native.handle("t19").result(timeout=10)
        m = sched.get_metrics()
        # Busy almost all the time since start; no deadline; no inversion.
        assert m.utilization > 0.5
        assert m.schedule_quality == pytest.approx(0.4 + 0.4 + 0.2 * m.utilization)


def test_native_tasks_run_beside_legacy_ones():
    def double(ctx, x):
        return x * 2

    pool = cronoq.Pool("native", double, max=2)
    with ElasticPriorityScheduler(initial_workers=1, max_workers=2, native_pools=[pool]) as sched:
        assert isinstance(sched.native, cronoq.BlockingScheduler)
        sched.submit(Task(id="legacy", duration=0.0))
        handle = sched.submit_native(21, priority="high")
        assert handle.result(timeout=10) == 42
        assert sched.native.handle("legacy").result(timeout=10) is None


def test_native_tasks_declare_stages_and_a_retry_resumes_from_their_checkpoints():
    ran: list[tuple[int, str]] = []

    def pipeline(ctx, doc):
        for stage in ("chunk", "embed", "index"):
            if stage in ctx.checkpoints:
                continue
            ran.append((ctx.attempt, stage))
            if stage == "index" and ctx.attempt == 1:
                raise RuntimeError("index failed")
            ctx.checkpoint_from_thread(stage, f"{stage}:{doc}")
        return ctx.resumed_from

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    pool = cronoq.Pool("native", pipeline, max=1, retry=retry)
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1, native_pools=[pool]) as sched:
        handle = sched.submit_native("doc-1", stages=["chunk", "embed", "index"])
        assert handle.result(timeout=10) == "embed"
        info = sched.native.info(handle.id)
    assert ran == [(1, "chunk"), (1, "embed"), (1, "index"), (2, "index")]
    assert info.stages == ["chunk", "embed", "index"]
    assert [(c.stage, c.data, c.attempt) for c in info.checkpoints] == [
        ("chunk", "chunk:doc-1", 1), ("embed", "embed:doc-1", 1), ("index", "index:doc-1", 2)]


def test_idle_scheduler_arms_no_timer():
    with ElasticPriorityScheduler(initial_workers=1, max_workers=1, min_workers=1) as sched:
        sched.submit(Task(id="x", duration=0.0))
        sched.native.handle("x").result(timeout=10)
        inner = sched.native.scheduler

        def idle():
            return inner._driver.core.next_wakeup() is None or inner._driver.core.next_wakeup() > time.time_ns() + 3600e9

        wait_for(lambda: inner._driver.core.pools["legacy"].scaler.armed is None)
        assert idle()


def test_sixteen_threads_lose_and_repeat_nothing():
    runs: list[str] = []
    lock = threading.Lock()

    class Counting(ElasticPriorityScheduler):
        async def _run(self, ctx, job):
            with lock:
                runs.append(ctx.key)
            return await super()._run(ctx, job)

    threads, per_thread = 16, 2000
    with Counting(initial_workers=4, max_workers=8) as sched:
        def submitter(k: int) -> None:
            for i in range(per_thread):
                sched.submit(Task(id=f"{k}-{i}", duration=0.0))

        pool = [threading.Thread(target=submitter, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        sched.stop(wait=True, timeout=120)
    assert len(runs) == threads * per_thread
    assert len(set(runs)) == threads * per_thread
    assert sched.completed_count == threads * per_thread


def test_task_is_a_frozen_dataclass_that_checks_its_fields():
    import dataclasses

    task = Task("a", 1)
    assert [f.name for f in dataclasses.fields(Task)] == [
        "id", "duration", "priority", "fixed_start", "dependencies", "deadline"]
    assert task == Task(id="a", duration=1) and hash(task) == hash(Task("a", 1))
    assert (task.priority, task.fixed_start, task.dependencies, task.deadline) == (Priority.NORMAL, None, (), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.id = "b"
    moved = dataclasses.replace(task, priority=3, dependencies=["x"])
    assert moved.priority is Priority.CRITICAL and moved.dependencies == ("x",)
    assert Task("n", 0.0, dependencies=None).dependencies == ()
    for bad in ({"duration": True}, {"duration": 1e12}, {"duration": "1"}, {"duration": float("inf")},
                {"duration": 0, "deadline": float("nan")}, {"duration": 0, "fixed_start": -1e20},
                {"duration": 0, "priority": 7}, {"duration": 0, "dependencies": "a"}):
        with pytest.raises(ValueError):
            Task("bad", **bad)
    with pytest.raises(ValueError):
        Task("", 0)


class CountingLock:
    """A lock that counts its acquisitions (by any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self):
        self._lock.acquire()
        self.taken += 1
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_plain_tasks_take_no_lock_shared_with_the_loop_and_judged_ones_still_count():
    # A lock both the submitting thread and the loop's executor take for every
    # task makes them queue for each other (a lock convoy: on an idle machine
    # legacy submit ran at a fifth of its speed). Plain tasks need none: the
    # engine's key refuses duplicates and only the loop counts completions.
    with ElasticPriorityScheduler(initial_workers=2, max_workers=2) as sched:
        sched._lock = lock = CountingLock()
        for i in range(200):
            sched.submit(Task(id=f"p{i}", duration=0.0, priority=Priority(i % 4)))
        with pytest.raises(DuplicateTaskError):
            sched.submit(Task(id="p0", duration=0.0))
        wait_for(lambda: sched.completed_count == 200)
        assert lock.taken == 0
        info = sched.native.info("p5")
        assert (info.pool, info.kind, info.key) == ("legacy", "legacy", "p5")
        # A deadline is judged under the lock, before the task can run and when it has run.
        sched.submit(Task(id="judged", duration=0.0, deadline=time.time() + 60))
        wait_for(lambda: sched.completed_count == 201)
        assert lock.taken >= 2
        assert sched.get_metrics().deadline_hit_rate == 1.0
        with pytest.raises(cronoq.InvalidTask):
            sched.submit(Task(id="k" * 1025, duration=0.0))   # the key's limit, as before


def test_start_after_stop_starts_again_on_a_fresh_scheduler():
    """As the legacy prototype's start() did after stop(): work again. The new
    scheduler has the configuration and the native hooks of the first; what
    stop() dropped (in memory) stays dropped."""
    sched = ElasticPriorityScheduler(initial_workers=1, max_workers=1, shutdown_grace=0.0)
    hooked: list[str | None] = []

    def hook(task):
        hooked.append(task.key)
        return task

    sched.native.add_submit_hook(hook)
    sched.start()
    sched.submit(Task(id="before", duration=0.0))
    wait_for(lambda: sched.completed_count == 1)
    sched.submit(Task(id="long", duration=3600.0))
    sched.submit(Task(id="queued", duration=0.0))
    wait_for(lambda: sched.get_metrics().running == 1)
    sched.stop()
    first = sched.native
    assert not first.running
    sched.start()
    try:
        assert sched.native is not first and sched.native.running
        sched.start()   # idempotent again while it runs
        with pytest.raises(cronoq.UnknownTask):
            sched.native.info("queued")   # queued at stop() without a store: dropped, as documented
        with pytest.raises(UnknownDependencyError):
            sched.submit(Task(id="orphan", duration=0.0, dependencies=["before"]))
        sched.submit(Task(id="queued", duration=0.0))   # the id is free in the new scheduler
        sched.submit(Task(id="after", duration=0.0))
        wait_for(lambda: sched.completed_count == 3)
        assert sched.native.info("after").status == "succeeded"
        assert sched.get_metrics().workers == 1
        assert hooked == ["before", "long", "queued", "orphan", "queued", "after"]
    finally:
        sched.stop()


def test_stop_before_start_then_start_serves():
    sched = ElasticPriorityScheduler(initial_workers=1, max_workers=1)
    sched.stop()
    sched.start()
    try:
        sched.submit(Task(id="x", duration=0.0))
        wait_for(lambda: sched.completed_count == 1)
    finally:
        sched.stop()


def test_a_start_that_failed_can_be_called_again(monkeypatch):
    sched = ElasticPriorityScheduler(initial_workers=1, max_workers=1)
    failing = [True]
    start = type(sched.native).start

    def start_once_failing(self):
        if failing:
            failing.clear()
            raise OSError("no thread to be had")
        start(self)

    monkeypatch.setattr(type(sched.native), "start", start_once_failing)
    with pytest.raises(OSError):
        sched.start()
    sched.start()
    try:
        sched.submit(Task(id="x", duration=0.0))
        wait_for(lambda: sched.completed_count == 1)
    finally:
        sched.stop()


def test_legacy_tasks_can_be_kept_in_a_store_and_survive_a_restart(tmp_path):
    """With store=, legacy jobs are stored as JSON (no codec needed); a task
    queued when the process stopped runs after the next start from the store."""
    path = tmp_path / "legacy.db"
    sched = ElasticPriorityScheduler(initial_workers=1, max_workers=1, shutdown_grace=0.0,
                                     store=cronoq.SqliteStore(str(path)))
    sched.start()
    try:
        sched.submit(Task(id="first", duration=0.0))
        wait_for(lambda: sched.completed_count == 1)
        sched.submit(Task(id="long", duration=3600.0, priority=Priority.HIGH))
        wait_for(lambda: sched.get_metrics().running == 1)
        sched.submit(Task(id="queued", duration=0.0, deadline=time.time() + 3600))
    finally:
        sched.stop()
    again = ElasticPriorityScheduler(initial_workers=1, max_workers=2, shutdown_grace=0.0,
                                     store=cronoq.SqliteStore(str(path)))
    again.start()
    try:
        wait_for(lambda: again.native.handle("queued").status == "succeeded")
        assert again.native.handle("first").status == "succeeded"
        with pytest.raises(DuplicateTaskError):
            again.submit(Task(id="queued", duration=0.0))
    finally:
        again.stop()
