"""Fair sharing between tenants: weighted shares within a class, no banked credit,
priority first, deadlines outside the share."""

from collections import Counter

from cronoq.core import PoolConfig, RetryPolicy, TaskSpec
from enginekit import S, dispatches, drain, make_core


def fair_core(**fairness):
    return make_core(PoolConfig("default", min=1, max=1, initial=1, autoscale=False, **fairness))


def submit(core, now, tenant, n=1, **options):
    ids = []
    for _ in range(n):
        ids.append(core.submit(now, TaskSpec(tenant, tenant=tenant, **options))[0])
    core.check_invariants()
    return ids


def block(core, now=0):
    """Occupy the single slot so that everything submitted next queues."""
    core.submit(now, TaskSpec("blocker", priority="critical"))
    core.check_invariants()
    [d] = dispatches(drain(core))
    return d.lease


def run(core, lease, n, now=0, step=S):
    """Complete the running task n times in a row; returns the payloads dispatched."""
    order = []
    for _ in range(n):
        now += step
        assert core.complete(now, lease)
        core.check_invariants()
        ds = dispatches(drain(core))
        if not ds:
            break
        [d] = ds
        order.append(d.payload)
        lease = d.lease
    return order, lease, now


def test_weights_split_dispatches_even_if_the_lighter_tenant_queued_first():
    core = fair_core(tenant_weights={"acme": 3, "globex": 1})
    lease = block(core)
    submit(core, 0, "globex", 40)
    submit(core, 0, "acme", 40)
    order, _, _ = run(core, lease, 40)
    for k in range(0, 40, 4):      # every window of four: three acme, one globex
        assert Counter(order[k:k + 4]) == {"acme": 3, "globex": 1}, order
    assert order[:8] == ["globex", "acme", "acme", "acme", "globex", "acme", "acme", "acme"]


def test_fair_share_true_gives_equal_shares():
    core = fair_core(fair_share=True)
    lease = block(core)
    submit(core, 0, "a", 10)
    submit(core, 0, "b", 10)
    order, _, _ = run(core, lease, 20)
    assert order == ["a", "b"] * 10


def test_without_fair_share_the_pool_is_fifo():
    core = fair_core()
    lease = block(core)
    submit(core, 0, "a", 5)
    submit(core, 0, "b", 5)
    order, _, _ = run(core, lease, 10)
    assert order == ["a"] * 5 + ["b"] * 5


def test_tenants_not_listed_weigh_one():
    core = fair_core(tenant_weights={"acme": 2})
    lease = block(core)
    submit(core, 0, "other", 12)
    submit(core, 0, "acme", 12)
    order, _, _ = run(core, lease, 18)
    for k in range(0, 18, 3):
        assert Counter(order[k:k + 3]) == {"acme": 2, "other": 1}, order


def test_untenanted_tasks_share_as_one_more_tenant_with_the_default_weight():
    core = fair_core(tenant_weights={"acme": 1})
    lease = block(core)
    for _ in range(6):                  # many untenanted submitters, one share between them
        core.submit(0, TaskSpec(None))
    submit(core, 0, "acme", 6)
    order, _, _ = run(core, lease, 12)
    assert order == [None, "acme"] * 6


def test_no_banked_credit_for_a_tenant_that_had_nothing_waiting():
    core = fair_core(fair_share=True)
    lease = block(core)
    submit(core, 0, "busy", 30)
    order, lease, now = run(core, lease, 10)       # "busy" alone gets everything
    assert order == ["busy"] * 10
    submit(core, now, "idle", 10)                  # it shares from now on, no catching up
    order, lease, now = run(core, lease, 10, now)
    assert Counter(order[:2]) == {"busy": 1, "idle": 1}
    assert order in (["idle", "busy"] * 5, ["busy", "idle"] * 5)


def test_no_banked_credit_after_a_pause_between_two_active_tenants():
    core = fair_core(fair_share=True)
    lease = block(core)
    submit(core, 0, "a", 2)
    submit(core, 0, "b", 2)
    order, lease, now = run(core, lease, 4)
    assert sorted(order) == ["a", "a", "b", "b"]
    submit(core, now, "a", 20)                     # "a" works alone for a while
    order, lease, now = run(core, lease, 10, now)
    assert order == ["a"] * 10
    submit(core, now, "b", 10)
    order, lease, now = run(core, lease, 10, now)
    assert Counter(order) == {"a": 5, "b": 5}
    assert all(order[k] != order[k + 1] for k in range(9))


def test_priority_comes_before_the_fair_share():
    core = fair_core(tenant_weights={"acme": 10, "globex": 1})
    lease = block(core)
    submit(core, 0, "acme", 5)
    submit(core, 0, "globex", 2, priority="low")
    submit(core, 0, "globex", 1, priority="critical")
    order, _, _ = run(core, lease, 8)
    # The critical task first, then the normal class, then the low one.
    assert order == ["globex"] + ["acme"] * 5 + ["globex"] * 2


def test_shares_are_kept_per_class():
    core = fair_core(fair_share=True)
    lease = block(core)
    submit(core, 0, "a", 4, priority="high")
    submit(core, 0, "b", 4, priority="high")
    submit(core, 0, "a", 2, priority="low")
    submit(core, 0, "b", 2, priority="low")
    order, _, _ = run(core, lease, 12)
    assert order == ["a", "b"] * 4 + ["a", "b"] * 2


def test_deadline_tasks_are_ordered_by_urgency_and_are_not_part_of_the_fair_share():
    core = fair_core(fair_share=True)
    lease = block(core)
    submit(core, 0, "a", 4)
    submit(core, 0, "b", 4)
    # Three "a" tasks that are overdue the moment they are queued.
    for _ in range(3):
        core.submit(0, TaskSpec("a urgent", tenant="a", deadline_in=0, duration_hint=1))
    core.check_invariants()
    order, _, _ = run(core, lease, 11)
    assert order[:3] == ["a urgent"] * 3
    # They did not use up a's share: the rest still alternates, a first (queued first).
    assert order[3:] == ["a", "b"] * 4


def test_retried_tasks_keep_their_place_in_the_fair_share():
    core = fair_core(fair_share=True)
    lease = block(core)
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=False)
    core.submit(0, TaskSpec("a0", tenant="a", retry=retry))
    submit(core, 0, "a", 2)
    submit(core, 0, "b", 3)
    order, lease, now = run(core, lease, 1)
    assert order == ["a0"]
    assert core.complete(now + S, lease, "retryable")     # due again at once (no backoff)
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert d.payload == "b"
    # Back in the queue, the retry keeps its start tag (the lowest): it goes next.
    order, _, _ = run(core, d.lease, 5, now + S)
    assert order == ["a0", "a", "b", "a", "b"]
