"""The task lifecycle and its status events."""

import pytest

from cronoq.core import TERMINAL, PoolConfig, RetryPolicy, StatusEvent, TaskSpec
from enginekit import S, aborts, dispatches, drain, events, make_core

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
    assert ev == StatusEvent(child, "default", "c", "succeeded", 1, 3.0, None)


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
    assert failed == StatusEvent(tid, "work", "k1", "failed", 2, 4.0, "bad input")


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
