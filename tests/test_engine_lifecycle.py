"""The task lifecycle and its status events."""

import gc
import weakref

import pytest

from cronoq.core import TERMINAL, PoolConfig, RetryPolicy, StatusEvent, TaskSpec
from enginekit import S, aborts, dispatches, drain, events, make_core, run_to

NO_JITTER = RetryPolicy(max_attempts=3, initial_backoff=1.0, jitter=False)


def one_slot(**config):
    return make_core(PoolConfig("default", max=1, initial=1, autoscale=False), **config)


def statuses(actions, task_id=None):
    return [e.status for e in events(actions) if task_id is None or e.id == task_id]


def test_blocked_ready_running_succeeded_with_transitions():
    core = one_slot(emit_transitions=True)
    parent = core.submit(0, TaskSpec("p", key="p"))[0]
    child = core.submit(0, TaskSpec("c", key="c", after="p"))[0]
    core.check_invariants()
    acts = drain(core)
    assert statuses(acts, parent) == ["ready", "running"]
    assert statuses(acts, child) == ["blocked"]
    assert core.status(child) == "blocked"
    [dp] = dispatches(acts)
    assert core.complete(2 * S, dp.lease, output="out")
    core.check_invariants()
    acts = drain(core)
    assert statuses(acts, parent) == ["succeeded"]
    assert statuses(acts, child) == ["ready", "running"]
    assert core.status(child) == "running"
    [dc] = dispatches(acts)
    assert core.complete(3 * S, dc.lease)
    core.check_invariants()
    [ev] = events(drain(core))
    assert ev == StatusEvent(child, "default", "c", "succeeded", 1, 3.0, None, max_attempts=3)


def test_event_fields():
    pool = PoolConfig("work", max=2, initial=2, autoscale=False)
    core = make_core(pool, emit_transitions=True)
    tid = core.submit(1_500_000_000, TaskSpec("x", pool="work", key="k1", retry=NO_JITTER))[0]
    core.check_invariants()
    acts = drain(core)
    ready, running = events(acts)
    assert (ready.id, ready.pool, ready.key, ready.status, ready.attempt, ready.at, ready.message) == \
        (tid, "work", "k1", "ready", 0, 1.5, None)
    assert (running.status, running.attempt, running.at) == ("running", 1, 1.5)
    [d] = dispatches(acts)
    assert core.complete(2 * S, d.lease, "retryable", message="flaky")
    core.check_invariants()
    [retrying] = events(drain(core))
    assert (retrying.id, retrying.status, retrying.attempt, retrying.at, retrying.message) == \
        (tid, "retrying", 1, 2.0, "flaky")
    core.advance(3 * S)
    core.check_invariants()
    acts = drain(core)
    assert [(e.status, e.attempt, e.at) for e in events(acts)] == [("ready", 1, 3.0), ("running", 2, 3.0)]
    [d] = dispatches(acts)
    assert core.complete(4 * S, d.lease, "permanent", message="bad input")
    core.check_invariants()
    [failed] = events(drain(core))
    assert failed == StatusEvent(tid, "work", "k1", "failed", 2, 4.0, "bad input", max_attempts=NO_JITTER.max_attempts)


def test_without_emit_transitions_only_terminal_events_are_published():
    core = one_slot()
    a = core.submit(0, TaskSpec("a", key="a", retry=NO_JITTER))[0]
    b = core.submit(0, TaskSpec("b", after="a"))[0]
    acts = drain(core)
    assert events(acts) == []
    [d] = dispatches(acts)
    core.complete(S, d.lease, "retryable")
    core.check_invariants()
    assert events(drain(core)) == []
    core.advance(3 * S)
    [d] = dispatches(drain(core))
    core.complete(4 * S, d.lease, "success")
    core.check_invariants()
    acts = drain(core)
    assert [(e.id, e.status) for e in events(acts)] == [(a, "succeeded")]
    [d] = dispatches(acts)
    core.complete(5 * S, d.lease, "success")
    assert [(e.id, e.status) for e in events(drain(core))] == [(b, "succeeded")]
    core.check_invariants()


def test_permanent_failure_ends_failed_with_its_message():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    assert core.complete(S, d.lease, "permanent", message="no such user")
    core.check_invariants()
    [e] = events(drain(core))
    assert (e.status, e.attempt, e.message) == ("failed", 1, "no such user")
    info = core.info(tid)
    assert (info.status, info.message, info.attempt) == ("failed", "no such user", 1)
    assert core.snapshot(S).totals["failed"] == 1


def test_dead_lettered_after_attempts_are_spent():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy(max_attempts=2, jitter=False)))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable", message="boom")
    core.check_invariants()
    assert core.status(tid) == "retrying"
    core.advance(2 * S)
    [d] = dispatches(drain(core))
    assert d.attempt == 2
    core.complete(3 * S, d.lease, "retryable", message="boom again")
    core.check_invariants()
    [e] = events(drain(core))
    assert (e.status, e.attempt) == ("dead_lettered", 2)
    assert "boom again" in e.message and "2 attempts" in e.message
    assert core.info(tid).message == e.message
    totals = core.snapshot(3 * S).totals
    assert (totals["dead_lettered"], totals["retries"], totals["failed"]) == (1, 1, 0)


def test_executor_reported_cancellation_ends_cancelled():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    assert core.complete(S, d.lease, "cancelled")
    core.check_invariants()
    [e] = events(drain(core))
    assert (e.id, e.status) == (tid, "cancelled")
    assert core.snapshot(S).totals["cancelled"] == 1


def test_invalid_outcome_is_rejected():
    core = one_slot()
    core.submit(0, TaskSpec("x"))
    [d] = dispatches(drain(core))
    with pytest.raises(ValueError, match="outcome"):
        core.complete(S, d.lease, "maybe")


def test_skipped_is_terminal_and_published():
    core = one_slot()
    core.submit(0, TaskSpec("p", key="p"))
    child = core.submit(0, TaskSpec("c", after="p"))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "permanent")
    core.check_invariants()
    evs = events(drain(core))
    assert [(e.status, e.id) for e in evs][-1] == ("skipped", child)
    assert evs[-1].attempt == 0
    assert core.status(child) == "skipped"


def test_event_stream_covers_every_terminal_status():
    pool = PoolConfig("default", max=1, initial=1, autoscale=False, max_pending=2,
                      overflow="shed_lowest")
    core = make_core(pool)
    seen = []

    def pump():
        core.check_invariants()
        acts = drain(core)
        seen.extend(events(acts))
        return dispatches(acts)

    ok = core.submit(0, TaskSpec("ok"))[0]
    [d_ok] = pump()
    low = core.submit(0, TaskSpec("low", priority="low", key="low"))[0]
    cancel_me = core.submit(0, TaskSpec("cancel"))[0]
    pump()
    high = core.submit(0, TaskSpec("high", priority="high", retry=RetryPolicy.none()))[0]
    pump()
    core.cancel(0, cancel_me)
    pump()
    skip_me = core.submit(0, TaskSpec("skip", after="low"))[0]   # low was shed
    pump()
    core.complete(S, d_ok.lease)
    [d_high] = pump()
    core.complete(2 * S, d_high.lease, "retryable")
    pump()
    by_id = {}
    for e in seen:
        assert e.status in TERMINAL
        assert e.id not in by_id, "one terminal event per task"
        by_id[e.id] = e.status
    assert by_id == {ok: "succeeded", low: "shed", cancel_me: "cancelled", high: "dead_lettered",
                     skip_me: "skipped"}


def test_cancel_publishes_cancelled_and_abort_for_running():
    core = one_slot(emit_transitions=True)
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    assert core.cancel(S, tid)
    core.check_invariants()
    acts = drain(core)
    [a] = aborts(acts)
    assert (a.lease, a.task_id) == (d.lease, tid)
    assert statuses(acts) == ["cancelled"]


def test_status_and_info_follow_the_lifecycle():
    core = one_slot()
    first = core.submit(0, TaskSpec("first"))[0]
    tid = core.submit(0, TaskSpec("x", key="x", kind="k"))[0]
    core.check_invariants()
    assert core.status(first) == "running"
    info = core.info("x")
    assert (info.id, info.status, info.pool, info.key, info.kind, info.attempt) == \
        (tid, "ready", "default", "x", "k", 0)
    [d] = dispatches(drain(core))
    core.complete(S, d.lease)
    core.check_invariants()
    assert core.status(tid) == "running"
    assert core.info(tid).attempt == 1
    [d] = dispatches(drain(core))
    core.complete(2 * S, d.lease)
    core.check_invariants()
    assert core.status("x") == "succeeded"
    assert core.status(first) == "succeeded"


def test_ids_increase_monotonically():
    core = make_core()
    ids = [core.submit(i, TaskSpec(i, key=f"k{i}" if i % 2 else None))[0] for i in range(20)]
    ids += [r[0] for r in core.submit_batch(30, [TaskSpec(i) for i in range(5)])]
    core.check_invariants()
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_time_going_backwards_counts_as_the_latest_time():
    core = one_slot()
    core.submit(10 * S, TaskSpec("x"))
    [d] = dispatches(drain(core))
    core.complete(5 * S, d.lease)
    core.check_invariants()
    [e] = events(drain(core))
    assert e.at == 10.0


# ---------------------------------------------------------------- stale timers


class Payload:
    """A payload that can be watched (weakref) to see whether anything keeps it."""


def _finished_workload(core, n, **options):
    """Run ``n`` tasks with ``options`` to success, 100 at a time; weak references to their payloads."""
    watched = []
    for start in range(0, n, 100):
        specs = []
        for _ in range(100):
            payload = Payload()
            watched.append(weakref.ref(payload))
            specs.append(TaskSpec(payload, **options))
        core.submit_batch(core.now, specs)
        while leases := [d.lease for d in dispatches(drain(core))]:
            for lease in leases:
                assert core.complete(core.now, lease)
    return watched


def test_finished_tasks_leave_no_timers_or_payloads_behind():
    # An hour-long timeout and a lease check per attempt: both timers go stale
    # when the attempt ends. The heap must follow the live tasks, not keep every
    # finished task (and its payload) for an hour.
    core = make_core(PoolConfig("default", max=100, initial=100, autoscale=False, lease_ttl=60.0))
    watched = _finished_workload(core, 20_000, timeout=3600.0)
    core.check_invariants()
    assert not core.tasks and not core.running
    assert len(core.timers) <= 2 * 100 + 64
    gc.collect()
    assert sum(ref() is not None for ref in watched) <= 200
    # The same with nothing else happening afterwards: the last calls compacted.
    assert core.next_wakeup() is None


def test_cancelled_and_retrying_tasks_leave_no_timers_behind():
    core = make_core(PoolConfig("default", max=1, initial=0, autoscale=False))
    watched = []
    for i in range(5_000):
        payload = Payload()
        watched.append(weakref.ref(payload))
        tid, _ = core.submit(i, TaskSpec(payload, start_in=3600.0 + i))   # start, hold and miss timers
        assert core.cancel(i, tid)
    core.set_capacity(10_000, "default", 1)
    retry = RetryPolicy(max_attempts=5, initial_backoff=3600.0, jitter=False)
    for i in range(2_000):
        payload = Payload()
        watched.append(weakref.ref(payload))
        tid, _ = core.submit(10_000 + i, TaskSpec(payload, retry=retry))
        [d] = dispatches(drain(core))
        core.complete(10_000 + i, d.lease, "retryable", message="later")   # a retry timer, an hour away
        assert core.cancel(10_000 + i, tid)
    drain(core)
    core.check_invariants()
    assert not core.tasks
    assert len(core.timers) <= 64
    gc.collect()
    assert sum(ref() is not None for ref in watched) <= 64


def test_live_timers_survive_compaction():
    # Many stale timers next to live ones: compaction keeps every live timer,
    # and each still fires at its time.
    core = make_core(PoolConfig("default", max=1, initial=1, autoscale=False),
                     retention=100_000.0)
    core.submit(0, TaskSpec("late", key="late", start_at=7200.0))
    _finished_workload(core, 1_000, timeout=3600.0)
    blocker = core.submit(S, TaskSpec("blocker", timeout=10.0, retry=RetryPolicy.none()))[0]
    [d] = dispatches(drain(core))
    assert d.task_id == blocker
    for i in range(1_000):   # more stale timers: each cancelled task had start, hold and miss timers
        tid, _ = core.submit(2 * S, TaskSpec(i, start_at=3600.0 + i))
        assert core.cancel(2 * S, tid)
    assert len(core.timers) <= 64
    assert core.next_wakeup() == 11 * S          # the blocker's timeout
    core.advance(11 * S)
    assert core.info(blocker).message == "gave up after 1 attempt: attempt timed out"
    drain(core)
    run_to(core, 7200 * S)
    assert core.status("late") == "running"
