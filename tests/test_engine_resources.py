"""Shared resources: semaphores and token buckets, parking, re-offers and admission."""

import pytest

from cronoq.core import (
    PoolConfig, ResourceConfig, ResourceExceedsCapacity, RetryPolicy, TaskSpec, UnknownResource,
)
from cronoq.simulation import Run, Simulator
from enginekit import S, aborts, dispatches, drain, make_core

MS = S // 1000


def core_with(*resources, slots=8):
    pool = PoolConfig("default", min=1, max=slots, initial=slots, autoscale=False)
    return make_core(pool, resources=resources)


def submit(core, now, payload, **options):
    task_id = core.submit(now, TaskSpec(payload, **options))[0]
    core.check_invariants()
    return task_id


def step(core, now):
    core.advance(now)
    core.check_invariants()
    return drain(core)


def finish(core, now, lease, outcome="success"):
    assert core.complete(now, lease, outcome)
    core.check_invariants()
    return drain(core)


def payloads(actions):
    return [d.payload for d in dispatches(actions)]


# ------------------------------------------------------------------ semaphores

def _end_by_success(core, now, d):
    return finish(core, now, d.lease)


def _end_by_retryable(core, now, d):
    return finish(core, now, d.lease, "retryable")


def _end_by_permanent(core, now, d):
    return finish(core, now, d.lease, "permanent")


def _end_by_executor_cancel(core, now, d):
    return finish(core, now, d.lease, "cancelled")


def _end_by_cancel(core, now, d):
    assert core.cancel(now, d.task_id)
    core.check_invariants()
    out = drain(core)
    assert [a.lease for a in aborts(out)] == [d.lease]
    return out


def _end_by_timeout(core, now, d):
    out = step(core, int(d.timeout * S))  # the holder was submitted at 0
    assert [a.reason for a in aborts(out)] == ["timeout"]
    return out


@pytest.mark.parametrize("end", [_end_by_success, _end_by_retryable, _end_by_permanent,
                                 _end_by_executor_cancel, _end_by_cancel, _end_by_timeout])
def test_a_semaphore_is_released_at_the_end_of_every_attempt(end):
    core = core_with(ResourceConfig.semaphore("gpu", 2))
    retry = RetryPolicy(max_attempts=2, initial_backoff=1000, jitter=False)
    submit(core, 0, "holder", resources={"gpu": 2}, timeout=5, retry=retry)
    [holder] = dispatches(drain(core))
    submit(core, 0, "waiter", resources={"gpu": 1})
    submit(core, 0, "plain")
    assert payloads(drain(core)) == ["plain"]          # the waiter is parked, the plain task runs
    assert core.resources["gpu"].available == 0
    out = end(core, 4 * S, holder)
    assert payloads(out) == ["waiter"]                  # the units came back at once
    assert core.resources["gpu"].available == 1


def test_a_semaphore_returns_units_to_waiters_in_fifo_order():
    core = core_with(ResourceConfig.semaphore("lic", 1))
    submit(core, 0, "first", resources={"lic": 1})
    [d] = dispatches(drain(core))
    for name in ("a", "b", "c"):
        submit(core, 0, name, resources={"lic": 1})
    order = []
    t = 0
    for _ in range(3):
        t += S
        # A newcomer asking for the same unit queues behind the parked waiters.
        submit(core, t, f"late{t // S}", resources={"lic": 1})
        [d] = dispatches(finish(core, t, d.lease))
        order.append(d.payload)
    assert order == ["a", "b", "c"]


def test_a_parked_high_priority_task_gets_the_unit_ahead_of_later_waiters():
    core = core_with(ResourceConfig.semaphore("lic", 1), slots=3)
    submit(core, 0, "holder", resources={"lic": 1})
    [holder] = dispatches(drain(core))
    submit(core, 0, "high", priority="high", resources={"lic": 1})
    submit(core, 0, "normal", resources={"lic": 1})
    submit(core, 0, "critical", priority="critical", resources={"lic": 1})
    assert dispatches(drain(core)) == []
    # The high task was parked first: it goes first, then the others in park order.
    [d] = dispatches(finish(core, S, holder.lease))
    assert d.payload == "high"
    [d] = dispatches(finish(core, 2 * S, d.lease))
    assert d.payload == "normal"


def test_all_or_nothing_acquisition_of_several_resources():
    core = core_with(ResourceConfig.semaphore("a", 1), ResourceConfig.semaphore("b", 1))
    submit(core, 0, "holds b", resources={"b": 1})
    assert payloads(drain(core)) == ["holds b"]
    submit(core, 0, "needs both", resources={"a": 1, "b": 1})
    assert payloads(drain(core)) == []
    # Nothing of "a" was taken by the parked task: another task can use it.
    assert core.resources["a"].available == 1
    submit(core, 0, "needs a", resources={"a": 1})
    [user_of_a] = dispatches(drain(core))
    assert user_of_a.payload == "needs a"
    assert core.resources["a"].available == 0


def test_a_task_waiting_for_several_resources_starts_once_all_are_free():
    core = core_with(ResourceConfig.semaphore("a", 1), ResourceConfig.semaphore("b", 1))
    submit(core, 0, "holds a", resources={"a": 1})
    submit(core, 0, "holds b", resources={"b": 1})
    ha, hb = dispatches(drain(core))
    submit(core, 0, "needs both", resources={"a": 1, "b": 1})
    assert payloads(finish(core, S, ha.lease)) == []
    assert payloads(finish(core, 2 * S, hb.lease)) == ["needs both"]
    assert (core.resources["a"].available, core.resources["b"].available) == (0, 0)


def test_a_parked_task_does_not_block_the_tasks_behind_it():
    core = core_with(ResourceConfig.semaphore("gpu", 1), ResourceConfig.semaphore("db", 1), slots=3)
    submit(core, 0, "gpu user", resources={"gpu": 1})
    [gpu_user] = dispatches(drain(core))
    submit(core, 0, "gpu waiter", priority="critical", resources={"gpu": 1})
    submit(core, 0, "db user", resources={"db": 1})
    submit(core, 0, "plain")
    assert payloads(drain(core)) == ["db user", "plain"]
    snap = core.snapshot(0)
    core.check_invariants()
    assert snap.pool("default").busy == 3
    out = finish(core, S, gpu_user.lease)
    assert payloads(out) == ["gpu waiter"]


def test_parked_tasks_are_not_priority_inversions():
    core = core_with(ResourceConfig.semaphore("gpu", 1), slots=2)
    submit(core, 0, "gpu user", resources={"gpu": 1})
    [gpu_user] = dispatches(drain(core))
    submit(core, 0, "high waiter", priority="high", resources={"gpu": 1})
    lease = None
    t = 0
    for i in range(5):      # normal work runs while the high task is parked
        submit(core, t, f"n{i}")
        [d] = dispatches(drain(core)) if lease is None else dispatches(finish(core, t, lease))
        lease = d.lease
        t += S
    snap = core.snapshot(t)
    core.check_invariants()
    assert snap.pool("default").dispatched == 6
    assert snap.pool("default").priority_adherence == 1.0
    finish(core, t, gpu_user.lease)


def test_unknown_resources_and_requests_beyond_capacity_are_rejected_at_submission():
    core = core_with(ResourceConfig.semaphore("gpu", 2), ResourceConfig.token_bucket("api", 5.0, 10))
    with pytest.raises(UnknownResource):
        core.submit(0, TaskSpec("x", resources={"fpga": 1}))
    with pytest.raises(ResourceExceedsCapacity):
        core.submit(0, TaskSpec("x", resources={"gpu": 3}))
    with pytest.raises(ResourceExceedsCapacity):
        core.submit(0, TaskSpec("x", resources={"api": 11}))        # more than the burst
    with pytest.raises(ResourceExceedsCapacity) as info:
        core.submit_batch(0, [TaskSpec("ok", resources={"gpu": 2}), TaskSpec("x", resources={"gpu": 3})])
    assert info.value.index == 1
    with pytest.raises(UnknownResource) as info:
        core.submit_batch(0, [TaskSpec("ok"), TaskSpec("x", resources={"nope": 1})])
    assert info.value.index == 1
    core.check_invariants()
    snap = core.snapshot(0)
    assert snap.totals["submitted"] == 0 and snap.live_tasks == 0
    assert dispatches(drain(core)) == []
    # The full capacity is fine.
    submit(core, 0, "max gpu", resources={"gpu": 2})
    submit(core, 0, "max api", resources={"api": 10})
    assert payloads(drain(core)) == ["max gpu", "max api"]


def test_cancelling_a_parked_task_lets_the_next_waiter_take_free_units():
    core = core_with(ResourceConfig.semaphore("gpu", 2))
    submit(core, 0, "holder", resources={"gpu": 1})
    drain(core)
    big = submit(core, 0, "needs two", resources={"gpu": 2})
    submit(core, 0, "needs one", resources={"gpu": 1})
    assert payloads(drain(core)) == []          # FIFO: "needs one" waits behind "needs two"
    assert core.cancel(S, big)
    core.check_invariants()
    assert payloads(drain(core)) == ["needs one"]


# ------------------------------------------------------------------ token buckets

def test_a_token_bucket_starts_full_and_wakes_its_waiter_when_the_tokens_are_there():
    core = core_with(ResourceConfig.token_bucket("api", 2.0, 3))
    for i in range(4):
        submit(core, 0, f"t{i}", resources={"api": 1})
    assert payloads(drain(core)) == ["t0", "t1", "t2"]      # the burst
    # One token every 0.5 s: the parked waiter's timer is at 0.5 s (to the nanosecond).
    wake = core.next_wakeup()
    assert S // 2 <= wake <= S // 2 + 2
    assert payloads(step(core, wake - 3)) == []
    assert payloads(step(core, wake)) == ["t3"]
    assert core.next_wakeup() is None


def test_a_token_bucket_paces_a_burst_at_its_rate():
    core = core_with(ResourceConfig.token_bucket("api", 4.0, 2))
    sim = Simulator(core, lambda d: Run(0.01), check=True)
    for i in range(10):
        sim.submit(TaskSpec(f"t{i}", resources={"api": 1}), at=100.0)
    sim.run()
    times = [sim.records[t].dispatches[0] - 100.0 for t in sorted(sim.records)]
    # Two at once (the burst), then one every 1/4 s.
    expected = [0.0, 0.0] + [0.25 * k for k in range(1, 9)]
    assert times == pytest.approx(expected, abs=1e-6)
    assert core.snapshot(sim.now).totals["succeeded"] == 10


def test_a_multi_unit_request_waits_for_all_its_tokens():
    core = core_with(ResourceConfig.token_bucket("tpm", 1.0, 5))
    submit(core, 0, "a", resources={"tpm": 5})
    submit(core, 0, "b", resources={"tpm": 3})
    assert payloads(drain(core)) == ["a"]
    wake = core.next_wakeup()
    assert 3 * S <= wake <= 3 * S + 2
    assert payloads(step(core, wake)) == ["b"]


def test_a_token_bucket_refills_only_up_to_its_burst():
    core = core_with(ResourceConfig.token_bucket("api", 10.0, 2))
    submit(core, 0, "a", resources={"api": 2})
    drain(core)
    for i in range(3):
        submit(core, 1000 * S, f"late{i}", resources={"api": 1})
    assert payloads(drain(core)) == ["late0", "late1"]
    wake = core.next_wakeup()
    assert 1000 * S + S // 10 <= wake <= 1000 * S + S // 10 + 2


def test_a_cancelled_parked_head_lets_the_next_waiter_wake_for_its_own_tokens():
    core = core_with(ResourceConfig.token_bucket("api", 1.0, 5))
    submit(core, 0, "drain", resources={"api": 5})
    big = submit(core, 0, "five", resources={"api": 5})
    submit(core, 0, "one", resources={"api": 1})
    assert payloads(drain(core)) == ["drain"]
    assert 5 * S <= core.next_wakeup() <= 5 * S + 2
    assert core.cancel(S // 10, big)
    core.check_invariants()
    drain(core)
    wake = core.next_wakeup()
    assert S <= wake <= S + 2                 # one token, not five
    assert payloads(step(core, wake)) == ["one"]


def test_tokens_are_consumed_not_returned():
    core = core_with(ResourceConfig.token_bucket("api", 1.0, 1))
    submit(core, 0, "a", resources={"api": 1})
    [a] = dispatches(drain(core))
    submit(core, 0, "b", resources={"api": 1})
    assert payloads(finish(core, S // 10, a.lease)) == []    # finishing gives nothing back
    wake = core.next_wakeup()
    assert S <= wake <= S + 2
    assert payloads(step(core, wake)) == ["b"]


def test_a_bucket_and_a_semaphore_together():
    core = core_with(ResourceConfig.token_bucket("rate", 1.0, 2), ResourceConfig.semaphore("conc", 1))
    for i in range(3):
        submit(core, 0, f"t{i}", resources={"rate": 1, "conc": 1})
    [d0] = dispatches(drain(core))
    assert d0.payload == "t0"
    # The semaphore is the limit now, though a token is left.
    [d1] = dispatches(finish(core, S // 2, d0.lease))
    assert d1.payload == "t1"
    # Tokens: 2 - 2 + 0.5 refilled, so t2 must wait for the bucket after the unit returns.
    assert payloads(finish(core, S // 2 + MS, d1.lease)) == []
    wake = core.next_wakeup()
    assert S <= wake <= S + 2
    assert payloads(step(core, wake)) == ["t2"]


def _offered_then(end_offered):
    """A semaphore of one permit; "holder" runs on it. "first" (pool a) and
    "second" (pool b) park on it, in that order. The holder ends: the permit
    is offered to "first", which goes back to its queue; pool a has no slot
    any more, so it waits there with the permit in view. ``end_offered``
    then takes "first" out of the running; "second" must get the permit."""
    core = make_core(PoolConfig("a", min=0, max=2, initial=2, autoscale=False),
                     PoolConfig("b", min=0, max=1, initial=1, autoscale=False),
                     resources=[ResourceConfig.semaphore("s", 1)])
    submit(core, 0, "holder", pool="a", resources={"s": 1})
    [holder] = dispatches(drain(core))
    first = submit(core, 0, "first", pool="a", resources={"s": 1})
    second = submit(core, 0, "second", pool="b", resources={"s": 1})
    assert dispatches(drain(core)) == []                   # both parked on "s"
    core.set_capacity(0, "a", 0)
    core.check_invariants()
    assert dispatches(finish(core, 1 * MS, holder.lease)) == []
    assert core.status(first) == "ready" and core.status(second) == "ready"
    end_offered(core, first)
    core.check_invariants()
    [started] = dispatches(drain(core))
    assert started.task_id == second
    return core


def test_a_cancelled_task_gives_back_the_permit_it_was_offered():
    # Regression (seed 6794 of the simulation sweep): the offered task was
    # cancelled in its queue and the free permit stayed promised to nobody,
    # with the next waiter parked for good.
    _offered_then(lambda core, first: core.cancel(2 * MS, first))


def test_an_offered_task_that_parks_elsewhere_gives_back_the_permit():
    # "first" needs s and t. Offered s, it finds t taken and parks on t: the
    # permit of s goes to "second", parked behind it on s.
    core = make_core(PoolConfig("a", min=0, max=2, initial=2, autoscale=False),
                     PoolConfig("b", min=0, max=2, initial=2, autoscale=False),
                     resources=[ResourceConfig.semaphore("s", 1), ResourceConfig.semaphore("t", 1)])
    submit(core, 0, "s-holder", pool="a", resources={"s": 1})
    submit(core, 0, "t-holder", pool="b", resources={"t": 1})
    [s_holder, _] = dispatches(drain(core))
    first = submit(core, 0, "first", pool="a", resources={"s": 1, "t": 1})
    second = submit(core, 0, "second", pool="b", resources={"s": 1})
    assert dispatches(drain(core)) == []                   # both parked on s
    [started] = dispatches(finish(core, 1 * MS, s_holder.lease))
    assert started.task_id == second
    assert core.status(first) == "ready"                    # now parked on t
