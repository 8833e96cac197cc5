"""Fixed starts: reservations, holds, the start, miss policies, interactions with
other features, and the duration learning that sizes reservations and holds."""

import pytest

from cronoq.core import (
    Dep, PoolConfig, QueueFull, ReservationConflict, ResourceConfig, RetryPolicy, TaskSpec,
)
from cronoq.core.metrics import bucket_mid, bucket_of
from enginekit import S, dispatches, drain, events, make_core, run_to

MS = S // 1000


def fixed_pool(max=4, initial=None, **kw):
    return PoolConfig("default", min=1, max=max, initial=max if initial is None else initial,
                      autoscale=False, **kw)


def submit(core, now, spec):
    task_id = core.submit(now, spec)[0]
    core.check_invariants()
    return task_id


def finish(core, now, lease, outcome="success", **kw):
    assert core.complete(now, lease, outcome, **kw)
    core.check_invariants()
    return drain(core)


def started(actions):
    """{task_id: dispatch time} for the dispatches in run_to's output."""
    return {a.task_id: t for t, a in actions if type(a).__name__ == "Dispatch"}


def pool_snap(core, now):
    snap = core.snapshot(now).pool("default")
    core.check_invariants()
    return snap


def occupy(core, now, n=1, priority="normal"):
    """Start ``n`` long regular tasks; returns their dispatches."""
    for _ in range(n):
        core.submit(now, TaskSpec("busy", priority=priority))
    core.check_invariants()
    ds = dispatches(drain(core))
    assert len(ds) == n
    return ds


# ------------------------------------------------------------------ status and start

def test_scheduled_before_the_start_then_runs_exactly_at_it():
    core = make_core(fixed_pool(max=2))
    tid = submit(core, 0, TaskSpec("job", start_in=10, tolerance=1))
    assert dispatches(drain(core)) == []
    assert core.status(tid) == "scheduled"
    snap = pool_snap(core, 0)
    assert snap.reservations == 1 and snap.pending == 1 and snap.busy == 0
    out = run_to(core, 10 * S - 1)
    assert started(out) == {}
    assert core.status(tid) == "scheduled"
    out = run_to(core, 10 * S)
    assert started(out) == {tid: 10 * S}
    assert core.status(tid) == "running"
    snap = pool_snap(core, 10 * S)
    assert snap.fixed_start_hit_rate == 1.0 and snap.held == 0 and snap.busy == 1


def test_start_at_an_absolute_time_and_a_start_in_the_past_runs_at_once():
    core = make_core(fixed_pool(max=2))
    at = submit(core, 5 * S, TaskSpec("at", start_at=20.0))
    past = submit(core, 5 * S, TaskSpec("past", start_at=3.0, tolerance=5))
    [d] = dispatches(drain(core))
    assert d.task_id == past                    # due already, within its tolerance
    out = run_to(core, 20 * S)
    assert started(out) == {at: 20 * S}
    snap = pool_snap(core, 20 * S)
    assert snap.fixed_start_hit_rate == 1.0      # |5 - 3| <= 5 and |20 - 20| <= 1


# ------------------------------------------------------------------ admission

@pytest.mark.parametrize("max_workers, fraction, limit", [
    (1, 0.5, 1),      # a max=1 pool can reserve its single slot
    (2, 0.5, 1),
    (3, 0.5, 1),      # floor(1.5)
    (4, 0.5, 2),
    (5, 0.5, 2),
    (10, 0.5, 5),
    (10, 0.0, 1),     # at least one reservation is always allowed
    (3, 1.0, 3),
    (10, 0.25, 2),
])
def test_admission_limit_is_floor_of_max_times_fraction_at_least_one(max_workers, fraction, limit):
    core = make_core(fixed_pool(max=max_workers, initial=1, reservable_fraction=fraction))
    for _ in range(limit):
        submit(core, 0, TaskSpec("r", start_at=100, duration_hint=10))
    before = pool_snap(core, 0)
    with pytest.raises(ReservationConflict):
        core.submit(0, TaskSpec("one too many", start_at=105, duration_hint=10, key="k"))
    core.check_invariants()
    after = pool_snap(core, 0)
    assert after.reservations == before.reservations == limit
    assert after.pending == before.pending == limit
    assert core.snapshot(0).totals["submitted"] == limit
    assert "k" not in core.keys   # nothing of the rejected task was admitted


def test_reservation_interval_spans_tolerance_before_and_duration_plus_tolerance_after():
    # max=2: one reservation at a time. The first books [100 - 3, 100 + 10 + 3) = [97, 113).
    core = make_core(fixed_pool(max=2))
    submit(core, 0, TaskSpec("a", start_at=100, duration_hint=10, tolerance=3))

    def fits(start, hint, tol):
        try:
            core.submit(0, TaskSpec("probe", start_at=start, duration_hint=hint, tolerance=tol))
        except ReservationConflict:
            core.check_invariants()
            return False
        core.check_invariants()
        core.cancel(0, max(core.tasks))   # remove the probe again
        core.check_invariants()
        return True

    assert fits(114, 5, 1)                  # [113, 120): back to back after
    assert not fits(114 - 1e-9, 5, 1)       # overlaps by one nanosecond
    assert not fits(112.5, 1, 0)            # inside the trailing tolerance
    assert fits(90, 5, 2)                   # [88, 97): back to back before
    assert not fits(90, 5, 2 + 1e-9)        # its trailing tolerance reaches 97
    assert not fits(98, 1, 0)               # inside the leading tolerance
    assert not fits(50, 200, 1)             # a long task spanning the whole booking


def test_batch_reservations_are_counted_together_and_nothing_is_admitted_on_conflict():
    core = make_core(fixed_pool(max=4))     # two overlapping reservations allowed
    specs = [TaskSpec("a", start_at=100, duration_hint=10, key="a"),
             TaskSpec("plain", key="plain"),
             TaskSpec("b", start_at=105, duration_hint=10, key="b"),
             TaskSpec("c", start_at=109, duration_hint=10, key="c")]
    with pytest.raises(ReservationConflict) as info:
        core.submit_batch(0, specs)
    core.check_invariants()
    assert info.value.index == 3
    assert "3" in str(info.value)
    snap = core.snapshot(0)
    assert snap.totals["submitted"] == 0 and snap.pool("default").reservations == 0
    assert dispatches(drain(core)) == []
    ids = core.submit_batch(0, specs[:3])
    core.check_invariants()
    assert len(ids) == 3 and pool_snap(core, 0).reservations == 2
    # The batch's own reservations now count against later submissions.
    with pytest.raises(ReservationConflict):
        core.submit(0, TaskSpec("d", start_at=108, duration_hint=1))
    core.check_invariants()


def test_cancelling_a_fixed_start_releases_its_reservation_and_its_hold():
    core = make_core(fixed_pool(max=2))
    tid = submit(core, 0, TaskSpec("a", start_at=100, duration_hint=10))
    run_to(core, 99 * S)
    assert pool_snap(core, 99 * S).held == 1
    assert core.cancel(99 * S, tid)
    core.check_invariants()
    snap = pool_snap(core, 99 * S)
    assert (snap.held, snap.reservations, snap.pending) == (0, 0, 0)
    submit(core, 99 * S, TaskSpec("b", start_at=100, duration_hint=10))   # fits again
    assert [e.status for e in events(drain(core))] == ["cancelled"]


# ------------------------------------------------------------------ holding a slot

def test_hold_lead_is_the_tolerance_without_history_and_first_checked_at_start_minus_max_hold():
    core = make_core(fixed_pool(max=2))
    submit(core, 0, TaskSpec("job", start_at=1000, tolerance=5))
    assert core.next_wakeup() == 700 * S                 # start - max_hold (300 s)
    run_to(core, 700 * S)
    assert core.next_wakeup() == 995 * S                 # re-armed at start - lead
    run_to(core, 995 * S - 1)
    assert pool_snap(core, 995 * S - 1).held == 0
    run_to(core, 995 * S)
    assert pool_snap(core, 995 * S).held == 1


def test_first_hold_check_respects_a_configured_max_hold():
    core = make_core(fixed_pool(max=2), max_hold=60.0)
    submit(core, 0, TaskSpec("job", start_at=1000))
    assert core.next_wakeup() == 940 * S


def learn_regular(core, now, seconds, n=5, kind="default"):
    """Run n regular tasks of ``seconds`` each, one after the other; returns the new now."""
    for _ in range(n):
        core.submit(now, TaskSpec("learn", kind=kind, priority="critical"))
        core.check_invariants()
        [d] = dispatches(drain(core))
        now += int(seconds * S)
        finish(core, now, d.lease)
    return now


def test_hold_lead_follows_the_p90_run_time_of_regular_tasks():
    core = make_core(fixed_pool(max=2))
    now = learn_regular(core, 0, 20, n=10)
    lead = bucket_mid(bucket_of(20 * S))           # the histogram's estimate of 20 s
    assert 19 * S < lead < 22 * S
    start = now + 1000 * S
    submit(core, now, TaskSpec("job", start_at=start / S))
    run_to(core, start - 300 * S)
    assert core.next_wakeup() == start - int(lead)
    run_to(core, start - int(lead) - 1)
    assert pool_snap(core, core.now).held == 0
    run_to(core, start - int(lead))
    assert pool_snap(core, core.now).held == 1
    out = run_to(core, start)
    assert [a.payload for _, a in out if type(a).__name__ == "Dispatch"] == ["job"]


def test_hold_lead_ignores_run_times_of_fixed_start_tasks():
    core = make_core(fixed_pool(max=2))
    now = 0
    for _ in range(5):            # fixed-start tasks that run for 100 s each
        start = now + 10 * S
        tid = submit(core, now, TaskSpec("fixed", start_at=start / S))
        [(_, d)] = [(t, a) for t, a in run_to(core, start) if type(a).__name__ == "Dispatch"]
        assert d.task_id == tid
        now = start + 100 * S
        finish(core, now, d.lease)
    start = now + 1000 * S
    submit(core, now, TaskSpec("job", start_at=start / S, tolerance=2))
    run_to(core, start - 300 * S)
    assert core.next_wakeup() == start - 2 * S        # still the tolerance


def test_hold_lead_is_capped_by_max_hold():
    core = make_core(fixed_pool(max=2))
    now = learn_regular(core, 0, 500, n=3)
    start = now + 1000 * S
    submit(core, now, TaskSpec("job", start_at=start / S))
    run_to(core, start - 300 * S - 1)
    assert pool_snap(core, core.now).held == 0
    run_to(core, start - 300 * S)                      # lead = min(~500 s, 300 s)
    assert pool_snap(core, core.now).held == 1


def test_hold_lead_is_re_evaluated_so_slower_work_holds_earlier():
    core = make_core(fixed_pool(max=2))
    submit(core, 0, TaskSpec("job", start_at=1000))
    # Before the first check the pool's work gets slow: about 50 s per task.
    learn_regular(core, 10 * S, 50, n=5)
    lead = int(bucket_mid(bucket_of(50 * S)))
    run_to(core, 700 * S)
    assert core.next_wakeup() == 1000 * S - lead
    run_to(core, 1000 * S - lead - 1)
    assert pool_snap(core, core.now).held == 0
    run_to(core, 1000 * S - lead)
    assert pool_snap(core, core.now).held == 1


def test_a_held_slot_is_not_taken_by_regular_work():
    core = make_core(fixed_pool(max=2))
    tid = submit(core, 0, TaskSpec("job", start_at=100))
    run_to(core, 99 * S)
    snap = pool_snap(core, 99 * S)
    assert (snap.held, snap.busy) == (1, 0)
    for i in range(3):
        core.submit(99 * S + S // 2, TaskSpec(f"r{i}", priority="critical"))
    core.check_invariants()
    ds = dispatches(drain(core))
    assert [d.payload for d in ds] == ["r0"]            # only the unheld slot
    snap = pool_snap(core, 99 * S + S // 2)
    assert (snap.held, snap.busy, snap.pending) == (1, 1, 3)
    out = run_to(core, 100 * S)
    assert started(out) == {tid: 100 * S}               # on its held slot
    snap = pool_snap(core, 100 * S)
    assert (snap.held, snap.busy, snap.pending) == (0, 2, 2)
    assert snap.fixed_start_hit_rate == 1.0


def test_if_no_slot_is_free_at_hold_time_the_first_freed_slot_is_held_before_queued_work():
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    tid = submit(core, 0, TaskSpec("job", start_at=100, tolerance=1))
    crit = submit(core, 50 * S, TaskSpec("urgent", priority="critical"))
    run_to(core, 99 * S)
    assert pool_snap(core, 99 * S).held == 0              # nothing free to hold yet
    out = finish(core, 99 * S + S // 2, blocker.lease)
    assert dispatches(out) == []                           # the critical task may not take it
    assert pool_snap(core, core.now).held == 1
    assert core.status(crit) == "ready"
    out = run_to(core, 100 * S)
    assert started(out) == {tid: 100 * S}
    assert core.status(crit) == "ready"


def test_a_slot_freed_after_the_start_but_within_tolerance_is_a_hit():
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    tid = submit(core, 0, TaskSpec("job", start_at=100, tolerance=2, on_miss="skip"))
    run_to(core, 101 * S)
    assert core.status(tid) == "ready"
    out = finish(core, 102 * S - MS, blocker.lease)
    [d] = dispatches(out)
    assert d.task_id == tid
    assert pool_snap(core, 102 * S).fixed_start_hit_rate == 1.0


# ------------------------------------------------------------------ missing the start

def test_run_late_is_the_default_and_runs_ahead_of_everything_counted_as_a_miss():
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    crit = submit(core, 0, TaskSpec("urgent", priority="critical"))
    tid = submit(core, 0, TaskSpec("job", start_at=10, tolerance=1))
    run_to(core, 40 * S)
    assert core.status(tid) == "ready"               # missed, but still waiting to run late
    assert pool_snap(core, 40 * S).fixed_start_hit_rate == 1.0   # nothing measured yet
    out = finish(core, 50 * S, blocker.lease)
    [d] = dispatches(out)
    assert d.task_id == tid                           # ahead of the critical task
    snap = pool_snap(core, 50 * S)
    assert snap.fixed_start_hit_rate == 0.0
    assert core.status(crit) == "ready"
    out = finish(core, 51 * S, d.lease)
    assert [e.status for e in events(out)] == ["succeeded"]
    assert [x.task_id for x in dispatches(out)] == [crit]


@pytest.mark.parametrize("policy, status", [("skip", "missed"), ("fail", "failed")])
def test_skip_and_fail_policies_end_the_task_once_start_plus_tolerance_has_come(policy, status):
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    queued = submit(core, 0, TaskSpec("regular"))
    tid = submit(core, 0, TaskSpec("job", start_at=10, tolerance=2, on_miss=policy))
    run_to(core, 12 * S - 1)
    assert core.status(tid) == "ready"                # still within its tolerance
    out = run_to(core, 12 * S)
    [e] = [a for _, a in out if type(a).__name__ == "StatusEvent"]
    assert (e.id, e.status, e.at) == (tid, status, 12.0)
    assert core.status(tid) == status
    snap = core.snapshot(12 * S)
    core.check_invariants()
    assert snap.totals[status] == 1
    pool = snap.pool("default")
    assert (pool.reservations, pool.held, pool.pending) == (0, 0, 1)
    assert pool.fixed_start_hit_rate == 0.0
    out = finish(core, 20 * S, blocker.lease)
    assert [d.task_id for d in dispatches(out)] == [queued]   # the slot is not held any more


def test_tolerance_zero_starts_exactly_at_the_start_time():
    core = make_core(fixed_pool(max=1))
    tid = submit(core, 0, TaskSpec("job", start_at=10, tolerance=0, on_miss="skip"))
    out = run_to(core, 10 * S)
    assert started(out) == {tid: 10 * S}
    assert core.status(tid) == "running"
    assert pool_snap(core, 10 * S).fixed_start_hit_rate == 1.0


def test_tolerance_zero_anything_later_is_a_miss():
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    tid = submit(core, 0, TaskSpec("job", start_at=10, tolerance=0, on_miss="skip"))
    run_to(core, 10 * S - 1)
    assert core.status(tid) == "scheduled"
    run_to(core, 10 * S)                               # no slot on the step at its time
    assert core.status(tid) == "missed"
    late = submit(core, 10 * S + 1, TaskSpec("late", start_at=11, tolerance=0))   # run_late
    run_to(core, 12 * S)
    [d] = dispatches(finish(core, 12 * S, blocker.lease))
    assert d.task_id == late
    assert pool_snap(core, 12 * S).fixed_start_hit_rate == 0.0


# ------------------------------------------------------------------ interactions

def test_dependencies_met_before_the_start_wait_for_the_start():
    core = make_core(fixed_pool(max=2))
    parent = submit(core, 0, TaskSpec("parent", key="p"))
    [pd] = dispatches(drain(core))
    tid = submit(core, 0, TaskSpec("child", start_at=10, after="p"))
    assert core.status(tid) == "blocked"
    finish(core, 2 * S, pd.lease)
    assert core.status(tid) == "scheduled"
    out = run_to(core, 10 * S)
    assert started(out) == {tid: 10 * S}
    assert core.status(parent) == "succeeded"


def test_dependencies_met_after_the_start_run_then_as_a_late_start():
    core = make_core(fixed_pool(max=2))
    submit(core, 0, TaskSpec("parent", key="p"))
    [pd] = dispatches(drain(core))
    tid = submit(core, 0, TaskSpec("child", start_at=10, tolerance=1, deps=[Dep("p", on="complete")]))
    out = run_to(core, 30 * S)
    assert started(out) == {}
    assert core.status(tid) == "blocked"
    out = finish(core, 30 * S, pd.lease, "permanent")
    assert [d.task_id for d in dispatches(out)] == [tid]
    assert pool_snap(core, 30 * S).fixed_start_hit_rate == 0.0


def test_a_failed_dependency_skips_the_fixed_start_and_frees_its_reservation():
    core = make_core(fixed_pool(max=2))
    submit(core, 0, TaskSpec("parent", key="p"))
    [pd] = dispatches(drain(core))
    tid = submit(core, 0, TaskSpec("child", start_at=10, after="p"))
    finish(core, 1 * S, pd.lease, "permanent")
    assert core.status(tid) == "skipped"
    assert pool_snap(core, 1 * S).reservations == 0


def test_a_blocked_fixed_start_does_not_hold_the_slot_its_dependency_needs():
    # One slot, busy. The parent queues for it; the child has a fixed start and
    # depends on the parent. Holding the slot for the blocked child would keep
    # the parent out of it for ever: the child must wait for its dependency first.
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    parent = submit(core, 0, TaskSpec("parent", key="p"))
    child = submit(core, 0, TaskSpec("child", start_at=10, after="p"))
    run_to(core, 9 * S)
    out = finish(core, 20 * S, blocker.lease)
    [d] = dispatches(out)
    assert d.task_id == parent
    assert pool_snap(core, 20 * S).held == 0
    out = finish(core, 21 * S, d.lease)
    [d] = dispatches(out)
    assert d.task_id == child                       # late, run as soon as possible
    assert core.status(child) == "running"


def test_a_fixed_start_unblocked_early_still_holds_its_slot_before_the_start():
    core = make_core(fixed_pool(max=1, initial=0))
    parent = submit(core, 0, TaskSpec("parent", key="p"))
    child = submit(core, 0, TaskSpec("child", start_at=1000, tolerance=5, after="p"))
    run_to(core, 700 * S)                     # first hold check while blocked: no hold
    assert pool_snap(core, 700 * S).held == 0
    core.set_capacity(899 * S, "default", 1)
    core.check_invariants()
    [pd] = dispatches(drain(core))
    assert pd.task_id == parent
    finish(core, 900 * S, pd.lease)           # the pool's p90 is now 1 s: lead = tolerance
    assert core.status(child) == "scheduled"
    assert core.next_wakeup() == 995 * S
    run_to(core, 995 * S)
    assert pool_snap(core, 995 * S).held == 1
    core.submit(996 * S, TaskSpec("regular"))
    core.check_invariants()
    assert dispatches(drain(core)) == []
    out = run_to(core, 1000 * S)
    assert started(out) == {child: 1000 * S}


def test_a_fixed_start_unblocked_inside_its_lead_holds_at_once():
    core = make_core(fixed_pool(max=2, initial=0))
    parent = submit(core, 0, TaskSpec("parent", key="p"))
    child = submit(core, 0, TaskSpec("child", start_at=1000, tolerance=5, after="p"))
    core.set_capacity(996 * S, "default", 2)
    core.check_invariants()
    [pd] = dispatches(drain(core))
    assert pd.task_id == parent
    finish(core, 997 * S, pd.lease)
    assert pool_snap(core, 997 * S).held == 1
    core.submit(997 * S, TaskSpec("r1"))
    core.submit(997 * S, TaskSpec("r2"))
    core.check_invariants()
    assert [d.payload for d in dispatches(drain(core))] == ["r1"]   # one slot is held
    out = run_to(core, 1000 * S)
    assert started(out) == {child: 1000 * S}


def test_a_fixed_start_waits_for_its_resources_while_keeping_its_hold():
    core = make_core(fixed_pool(max=2), resources=[ResourceConfig.semaphore("gpu", 1)])
    submit(core, 0, TaskSpec("holder", resources={"gpu": 1}))
    [holder] = dispatches(drain(core))
    tid = submit(core, 0, TaskSpec("job", start_at=10, resources={"gpu": 1}))
    out = run_to(core, 10 * S)
    assert started(out) == {}
    snap = pool_snap(core, 10 * S)
    assert (snap.held, snap.busy) == (1, 1)
    assert core.status(tid) == "ready"
    core.submit(10 * S + MS, TaskSpec("regular"))      # may not take the held slot
    core.check_invariants()
    assert dispatches(drain(core)) == []
    out = finish(core, 10 * S + S // 2, holder.lease)
    ds = dispatches(out)
    assert [d.payload for d in ds] == ["job", "regular"]
    snap = pool_snap(core, core.now)
    assert (snap.held, snap.busy) == (0, 2)
    assert snap.fixed_start_hit_rate == 1.0            # 0.5 s late, within the 1 s tolerance


def test_a_retried_attempt_has_no_hold_no_miss_policy_and_goes_ahead_of_regular_work():
    core = make_core(fixed_pool(max=1))
    retry = RetryPolicy(max_attempts=2, initial_backoff=5, jitter=False)
    tid = submit(core, 0, TaskSpec("job", start_at=10, tolerance=1, on_miss="skip", retry=retry))
    [(t, d)] = [(t, a) for t, a in run_to(core, 10 * S) if type(a).__name__ == "Dispatch"]
    assert (t, d.attempt) == (10 * S, 1)
    finish(core, 11 * S, d.lease, "retryable")
    assert core.status(tid) == "retrying"
    submit(core, 11 * S, TaskSpec("long", priority="critical"))
    [long] = dispatches(drain(core))                 # the slot is not held for the retry
    assert pool_snap(core, 11 * S).held == 0
    crit = submit(core, 12 * S, TaskSpec("crit", priority="critical"))
    run_to(core, 60 * S)                             # the retry is ready at 16 s; no miss
    assert core.status(tid) == "ready"
    assert pool_snap(core, 60 * S).held == 0
    [d2] = dispatches(finish(core, 60 * S, long.lease))
    assert (d2.task_id, d2.attempt) == (tid, 2)      # ahead of the critical task
    assert core.status(crit) == "ready"
    finish(core, 61 * S, d2.lease)
    assert core.status(tid) == "succeeded"
    assert core.snapshot(61 * S).totals["missed"] == 0


def test_fixed_start_tasks_are_never_shed():
    pool = PoolConfig("default", min=1, max=2, initial=1, autoscale=False, max_pending=2,
                      overflow="shed_lowest")
    core = make_core(pool)
    occupy(core, 0)
    fixed = submit(core, 0, TaskSpec("fixed", priority="low", start_at=100))
    low = submit(core, 0, TaskSpec("regular", priority="low"))
    crit = submit(core, 0, TaskSpec("c1", priority="critical"))     # sheds the regular low task
    assert core.status(low) == "shed"
    assert core.status(fixed) == "scheduled"
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("c2", priority="critical"))
    core.check_invariants()
    assert core.status(fixed) == "scheduled" and core.status(crit) == "ready"


def test_shed_oldest_also_spares_fixed_starts():
    pool = PoolConfig("default", min=1, max=2, initial=1, autoscale=False, max_pending=1,
                      overflow="shed_oldest")
    core = make_core(pool)
    occupy(core, 0)
    fixed = submit(core, 0, TaskSpec("fixed", priority="low", start_at=100))
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("low", priority="low"))
    core.check_invariants()
    assert core.status(fixed) == "scheduled"


def test_fixed_starts_in_the_due_queue_go_in_start_order():
    core = make_core(fixed_pool(max=1))
    [blocker] = occupy(core, 0)
    b = submit(core, 0, TaskSpec("b", start_at=20, duration_hint=0, tolerance=0))
    a = submit(core, 0, TaskSpec("a", start_at=10, duration_hint=0, tolerance=0))
    run_to(core, 30 * S)
    [d] = dispatches(finish(core, 30 * S, blocker.lease))
    assert d.task_id == a
    [d] = dispatches(finish(core, 31 * S, d.lease))
    assert d.task_id == b


# ------------------------------------------------------------------ duration learning

def test_learned_kind_median_sizes_the_reservation():
    core = make_core(fixed_pool(max=2))           # one reservation at a time
    now = learn_regular(core, 0, 60, n=3, kind="report")
    now = learn_regular(core, now, 2, n=5, kind="ping")
    # A "report" books about 60 s: [100 - 1, 100 + 60 + 1).
    start = now + 100 * S
    submit(core, now, TaskSpec("report", kind="report", start_at=start / S))
    with pytest.raises(ReservationConflict):
        core.submit(now, TaskSpec("x", kind="ping", start_at=(start + 40 * S) / S))
    core.check_invariants()
    submit(core, now, TaskSpec("x", kind="ping", start_at=(start + 70 * S) / S))
    # A "ping" books about 2 s; an unseen kind uses the pool's median (pings dominate).
    submit(core, now, TaskSpec("y", kind="ping", start_at=(start + 80 * S) / S))
    submit(core, now, TaskSpec("z", kind="new", start_at=(start + 90 * S) / S))
    with pytest.raises(ReservationConflict):
        core.submit(now, TaskSpec("w", kind="new", start_at=(start + 93 * S) / S))
    core.check_invariants()


def test_learned_durations_feed_the_latest_start_time():
    core = make_core(fixed_pool(max=1))
    now = learn_regular(core, 0, 100, n=3, kind="long")
    [blocker] = occupy(core, now)
    short = submit(core, now, TaskSpec("short", deadline_in=150))   # default kind: pool median
    new = submit(core, now, TaskSpec("new", kind="fresh", deadline_in=500))
    long = submit(core, now, TaskSpec("long", kind="long", deadline_in=200))
    # The pool has only seen "long" tasks: every estimate is about 100 s, so the
    # latest start times are about now + 50, now + 400 and now + 100.
    assert abs(core.tasks[long].lst - (now + 100 * S)) < 10 * S
    assert abs(core.tasks[short].lst - (now + 50 * S)) < 10 * S
    assert abs(core.tasks[new].lst - (now + 400 * S)) < 10 * S
    order = []
    lease = blocker.lease
    t = now
    for _ in range(3):
        t += S
        [d] = dispatches(finish(core, t, lease))
        order.append(d.task_id)
        lease = d.lease
    assert order == [short, long, new]


def test_without_history_the_pool_default_duration_is_the_estimate():
    core = make_core(fixed_pool(max=2, default_duration=30.0))
    submit(core, 0, TaskSpec("a", start_at=100))          # [99, 131)
    with pytest.raises(ReservationConflict):
        core.submit(0, TaskSpec("b", start_at=125))
    core.check_invariants()
    submit(core, 0, TaskSpec("c", start_at=132))
