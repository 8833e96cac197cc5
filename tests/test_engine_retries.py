"""Retries and backoff, timeouts, leases and heartbeats, stale completions."""

import pytest

from cronoq.core import InvalidTask, PoolConfig, RetryPolicy, TaskSpec
from enginekit import S, aborts, dispatches, drain, events, make_core


def pool(**kw):
    kw.setdefault("max", 4)
    kw.setdefault("initial", 4)
    return PoolConfig("default", autoscale=False, **kw)


def fail_and_measure(core, task_id, attempts, now=0, retry_after_ns=None):
    """Fail every attempt of ``task_id`` at once; return the delays before
    attempts 2.. and the attempt numbers seen."""
    delays = []
    seen = []
    [d] = dispatches(drain(core))
    while True:
        assert d.task_id == task_id
        seen.append(d.attempt)
        assert core.complete(now, d.lease, "retryable", retry_after_ns=retry_after_ns)
        core.check_invariants()
        drain(core)
        if core.status(task_id) != "retrying":
            return delays, seen
        wake = core.next_wakeup()
        assert wake is not None and wake >= now
        # nothing happens before the wakeup
        if wake > now:
            core.advance(wake - 1)
            core.check_invariants()
            assert core.status(task_id) == "retrying"
            assert dispatches(drain(core)) == []
        core.advance(wake)
        core.check_invariants()
        [d] = dispatches(drain(core))
        delays.append(wake - now)
        now = wake


def test_retry_policy_defaults():
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.multiplier, policy.max_backoff,
            policy.jitter) == (3, 1.0, 2.0, 60.0, True)
    assert PoolConfig("p").retry == policy


def test_default_policy_makes_three_attempts_with_jittered_delays():
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x"))[0]
    delays, seen = fail_and_measure(core, tid, 3)
    assert seen == [1, 2, 3]
    assert len(delays) == 2
    assert 0 <= delays[0] <= 1 * S
    assert 0 <= delays[1] <= 2 * S
    assert core.status(tid) == "dead_lettered"


def test_exact_exponential_delays_without_jitter():
    policy = RetryPolicy(max_attempts=9, initial_backoff=1.0, multiplier=2.0, max_backoff=60.0,
                         jitter=False)
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    delays, seen = fail_and_measure(core, tid, 9)
    assert seen == list(range(1, 10))
    assert delays == [s * S for s in (1, 2, 4, 8, 16, 32, 60, 60)]
    assert core.snapshot(core.now).totals["retries"] == 8


def test_delays_with_fractional_values_and_other_multiplier():
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.5, multiplier=3.0, max_backoff=10.0,
                         jitter=False)
    assert [policy.backoff_ns(n) for n in (2, 3, 4, 5, 6)] == [
        S // 2, 3 * S // 2, 9 * S // 2, 10 * S, 10 * S]
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    delays, _ = fail_and_measure(core, tid, 5)
    assert delays == [S // 2, 3 * S // 2, 9 * S // 2, 10 * S]


def test_pool_retry_policy_applies_and_task_policy_overrides_it():
    no_jitter = RetryPolicy(max_attempts=2, initial_backoff=7.0, jitter=False)
    core = make_core(pool(retry=no_jitter))
    a = core.submit(0, TaskSpec("a"))[0]
    delays, seen = fail_and_measure(core, a, 2)
    assert (delays, seen) == ([7 * S], [1, 2])
    b = core.submit(100 * S, TaskSpec("b", retry=RetryPolicy(max_attempts=3, initial_backoff=2.0,
                                                             jitter=False)))[0]
    delays, seen = fail_and_measure(core, b, 3, now=100 * S)
    assert (delays, seen) == ([2 * S, 4 * S], [1, 2, 3])


def test_jittered_delays_stay_within_the_full_delay_and_vary():
    policy = RetryPolicy(max_attempts=2, initial_backoff=10.0, jitter=True)
    core = make_core(pool(), seed=7)
    delays = []
    for i in range(40):
        tid = core.submit(core.now, TaskSpec(i, retry=policy))[0]
        d, _ = fail_and_measure(core, tid, 2, now=core.now)
        delays += d
    assert all(0 <= x <= 10 * S for x in delays)
    assert len(set(delays)) > 30          # random, not constant
    assert min(delays) < 3 * S and max(delays) > 7 * S   # spread over the range


def _jitter_run(seed):
    policy = RetryPolicy(max_attempts=6, initial_backoff=1.0, jitter=True)
    core = make_core(pool(), seed=seed)
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    delays, _ = fail_and_measure(core, tid, 6)
    return delays


def test_jitter_is_deterministic_for_a_seed():
    assert _jitter_run(1) == _jitter_run(1)
    assert _jitter_run(1) != _jitter_run(2)
    for n, delay in enumerate(_jitter_run(3), start=2):
        assert 0 <= delay <= min(2 ** (n - 2), 60) * S


def test_retry_after_raises_the_delay_to_at_least_that():
    policy = RetryPolicy(max_attempts=4, initial_backoff=1.0, jitter=False)
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    delays, _ = fail_and_measure(core, tid, 4, retry_after_ns=3 * S)
    # max(1, 3), max(2, 3), max(4, 3)
    assert delays == [3 * S, 3 * S, 4 * S]


def test_retry_after_may_exceed_max_backoff():
    policy = RetryPolicy(max_attempts=2, initial_backoff=1.0, max_backoff=2.0, jitter=False)
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    delays, _ = fail_and_measure(core, tid, 2, retry_after_ns=120 * S)
    assert delays == [120 * S]


def test_retry_after_with_jitter_is_a_floor():
    core = make_core(pool(), seed=5)
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy(max_attempts=3, initial_backoff=1.0)))[0]
    delays, _ = fail_and_measure(core, tid, 3, retry_after_ns=5 * S)
    assert delays == [5 * S, 5 * S]


def test_permanent_failure_is_not_retried():
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy(max_attempts=5, jitter=False)))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "permanent", message="nope")
    core.check_invariants()
    assert core.status(tid) == "failed"
    assert core.next_wakeup() is None
    totals = core.snapshot(S).totals
    assert (totals["failed"], totals["retries"], totals["dead_lettered"]) == (1, 0, 0)


def test_attempts_exhausted_dead_letters_with_a_message():
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy(max_attempts=2, jitter=False)))[0]
    [d] = dispatches(drain(core))
    core.complete(0, d.lease, "retryable", message="first")
    core.advance(S)
    [d] = dispatches(drain(core))
    core.complete(2 * S, d.lease, "retryable", message="the last error")
    core.check_invariants()
    [e] = events(drain(core))
    assert e.status == "dead_lettered"
    assert "the last error" in e.message
    assert core.info(tid).message == e.message
    assert core.info(tid).attempt == 2


def test_retry_policy_none_disables_retries():
    assert RetryPolicy.none().max_attempts == 1
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy.none()))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable", message="oops")
    core.check_invariants()
    [e] = events(drain(core))
    assert (e.id, e.status, e.attempt) == (tid, "dead_lettered", 1)
    assert core.snapshot(S).totals["retries"] == 0


def test_max_attempts_below_one_is_invalid():
    with pytest.raises(InvalidTask, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(InvalidTask, match="multiplier"):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(InvalidTask, match="initial_backoff"):
        RetryPolicy(initial_backoff=-1)


def test_attempt_numbers_strictly_increase_across_failures_timeouts_and_expiries():
    core = make_core(pool(lease_ttl=10))
    policy = RetryPolicy(max_attempts=5, initial_backoff=1.0, jitter=False)
    tid = core.submit(0, TaskSpec("x", timeout=5, retry=policy))[0]
    seen = []
    leases = []
    # attempt 1: retryable failure
    [d] = dispatches(drain(core))
    seen.append(d.attempt)
    leases.append(d.lease)
    core.complete(S, d.lease, "retryable")
    # attempt 2: times out after 5 s
    core.advance(2 * S)
    [d] = dispatches(drain(core))
    seen.append(d.attempt)
    leases.append(d.lease)
    core.advance(7 * S)
    core.check_invariants()
    assert aborts(drain(core))
    # attempt 3: its retry delay (2 s) has elapsed by 11 s; it succeeds
    core.advance(11 * S)
    [d] = dispatches(drain(core))
    seen.append(d.attempt)
    leases.append(d.lease)
    # late report for attempt 2 changes nothing
    assert core.complete(11 * S, leases[1], "success") is False
    assert core.status(tid) == "running"
    core.complete(12 * S, d.lease)
    core.check_invariants()
    assert seen == [1, 2, 3]
    assert len(set(leases)) == 3 and leases == sorted(leases)
    assert core.info(tid).attempt == 3


# ------------------------------------------------------------------ timeouts

def test_timeout_aborts_the_attempt_and_retries():
    core = make_core(pool())
    policy = RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    tid = core.submit(0, TaskSpec("x", timeout=2.5, retry=policy))[0]
    [d] = dispatches(drain(core))
    assert d.timeout == 2.5
    assert core.next_wakeup() == 2_500_000_000
    core.advance(2_500_000_000 - 1)
    core.check_invariants()
    assert aborts(drain(core)) == []
    core.advance(2_500_000_000)
    core.check_invariants()
    [a] = aborts(drain(core))
    assert (a.lease, a.task_id, a.reason) == (d.lease, tid, "timeout")
    assert core.status(tid) == "retrying"
    snap = core.snapshot(2_500_000_000)
    assert snap.totals["timeouts"] == 1
    assert snap.pool("default").busy == 0
    # a late completion for the aborted lease is stale
    assert core.complete(3 * S, d.lease, "success") is False
    core.check_invariants()
    assert core.snapshot(3 * S).totals["stale_completions"] == 1
    assert core.status(tid) == "retrying"
    core.advance(3_500_000_000)
    [d2] = dispatches(drain(core))
    assert d2.attempt == 2 and d2.lease != d.lease
    # the second attempt times out too: attempts spent
    core.advance(6 * S)
    core.check_invariants()
    acts = drain(core)
    assert [a.reason for a in aborts(acts)] == ["timeout"]
    [e] = events(acts)
    assert e.status == "dead_lettered" and "timed out" in e.message
    assert core.snapshot(6 * S).totals["timeouts"] == 2


def test_completion_before_the_timeout_disarms_it():
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x", timeout=5))[0]
    [d] = dispatches(drain(core))
    assert core.complete(S, d.lease)
    core.advance(10 * S)
    core.check_invariants()
    assert aborts(drain(core)) == []
    assert core.status(tid) == "succeeded"
    assert core.snapshot(10 * S).totals["timeouts"] == 0
    assert core.next_wakeup() is None


def test_timeout_frees_the_slot_for_the_next_task():
    core = make_core(PoolConfig("default", max=1, initial=1, autoscale=False))
    core.submit(0, TaskSpec("slow", timeout=1, retry=RetryPolicy.none()))
    nxt = core.submit(0, TaskSpec("next"))[0]
    drain(core)
    core.advance(S)
    core.check_invariants()
    acts = drain(core)
    assert len(aborts(acts)) == 1
    assert [d.task_id for d in dispatches(acts)] == [nxt]


def test_double_completion_is_stale():
    core = make_core(pool())
    core.submit(0, TaskSpec("x"))
    [d] = dispatches(drain(core))
    assert core.complete(S, d.lease) is True
    assert core.complete(S, d.lease) is False
    assert core.complete(S, 987654) is False
    core.check_invariants()
    totals = core.snapshot(S).totals
    assert (totals["succeeded"], totals["stale_completions"]) == (1, 2)


# ------------------------------------------------------------------ leases

def test_lease_expires_without_heartbeat():
    core = make_core(pool(lease_ttl=30))
    policy = RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    tid = core.submit(0, TaskSpec("x", retry=policy))[0]
    [d] = dispatches(drain(core))
    core.advance(30 * S - 1)
    core.check_invariants()
    assert aborts(drain(core)) == []
    core.advance(30 * S)
    core.check_invariants()
    [a] = aborts(drain(core))
    assert (a.lease, a.task_id) == (d.lease, tid)
    assert "lease" in a.reason
    assert core.status(tid) == "retrying"
    assert core.snapshot(30 * S).totals["lease_expiries"] == 1
    assert core.heartbeat(30 * S, d.lease) is False
    assert core.complete(30 * S, d.lease) is False
    core.advance(31 * S)
    [d2] = dispatches(drain(core))
    assert d2.attempt == 2
    core.check_invariants()


def test_heartbeats_keep_the_lease_alive():
    core = make_core(pool(lease_ttl=10))
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    for t in range(8, 100, 8):
        core.advance(t * S)
        assert core.heartbeat(t * S, d.lease) is True
        core.check_invariants()
        assert aborts(drain(core)) == []
    assert core.status(tid) == "running"
    # the last heartbeat was at 96 s: expiry at 106 s
    core.advance(105 * S)
    assert aborts(drain(core)) == []
    core.advance(106 * S)
    core.check_invariants()
    assert len(aborts(drain(core))) == 1
    assert core.snapshot(106 * S).totals["lease_expiries"] == 1


def test_pool_without_lease_ttl_never_expires():
    core = make_core(pool())
    tid = core.submit(0, TaskSpec("x"))[0]
    drain(core)
    assert core.next_wakeup() is None
    core.advance(10_000 * S)
    core.check_invariants()
    assert core.status(tid) == "running"


def test_lease_expiry_with_attempts_spent_dead_letters():
    core = make_core(pool(lease_ttl=5))
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy.none()))[0]
    drain(core)
    core.advance(5 * S)
    core.check_invariants()
    acts = drain(core)
    assert len(aborts(acts)) == 1
    [e] = events(acts)
    assert (e.id, e.status) == (tid, "dead_lettered")
    assert "lease" in e.message
