"""The queue-pressure autoscaler: each term of the formula, the step limits, the
stabilization window and cooldown, clamps, cost, idling, and one scenario under
virtual time whose desired-capacity curve is computed by hand."""

from math import ceil

import pytest

from cronoq.core import AutoscaleConfig, Core, CoreConfig, PoolConfig, RetryPolicy, TaskSpec
from cronoq.simulation import Run, Simulator
from enginekit import S, aborts, dispatches, drain

MS = S // 1000


def scaled_core(min=0, max=100, initial=0, default_duration=1.3, **autoscale):
    pool = PoolConfig("w", min=min, max=max, initial=initial, default_duration=default_duration,
                      autoscale=AutoscaleConfig(**autoscale))
    core = Core(CoreConfig(), [pool], now=0)
    return core


def at(core, now):
    core.advance(now)
    core.check_invariants()
    return drain(core)


def scales(actions):
    return [(a.pool, a.desired) for a in actions if type(a).__name__ == "Scale"]


def submit(core, now, n, **options):
    for _ in range(n):
        core.submit(now, TaskSpec("job", pool="w", **options))
    core.check_invariants()
    return drain(core)


def pool(core, now):
    snap = core.snapshot(now).pool("w")
    core.check_invariants()
    return snap


# ------------------------------------------------------------------ the formula

def test_first_evaluation_after_a_burst_is_base_plus_drain():
    core = scaled_core(max_step_up_abs=1000)
    assert scales(at(core, 0)) == []                 # the evaluation at start: nothing to do
    assert core.next_wakeup() is None                # settled: no timer
    submit(core, 0, 7)
    assert core.next_wakeup() == S                   # one interval after the last evaluation
    out = at(core, S)
    # rate = 0.3 x 7/s (EWMA from 0), S = 1.3 s (default_duration), backlog 7.
    base = ceil(0.3 * 7 * 1.3 / 0.75)                # ceil(3.64) = 4
    drain_term = ceil(7 * 1.3 / 30)                  # ceil(0.30) = 1
    assert (base, drain_term) == (4, 1)
    assert scales(out) == [("w", 5)]
    assert len(dispatches(out)) == 5                 # in-process slots follow at once
    snap = pool(core, S)
    assert (snap.desired, snap.capacity, snap.busy, snap.pending) == (5, 5, 5, 2)


def test_the_slo_term_uses_the_backlog_of_the_class_and_all_more_important_ones():
    core = scaled_core(max_step_up_abs=1000, slo={"high": 0.1, "normal": 0.5})
    at(core, 0)
    submit(core, 0, 3, priority="critical")
    submit(core, 0, 5, priority="normal")
    submit(core, 0, 10, priority="low")
    out = at(core, S)
    base_drain = ceil(0.3 * 18 * 1.3 / 0.75) + ceil(18 * 1.3 / 30)     # 10 + 1
    slo_normal = ceil((3 + 0 + 5) * 1.3 / 0.5)                         # B<=normal = 8: 21
    # "high" has an SLO but no backlog of its own: it does not count (it would be 39).
    assert (base_drain, slo_normal) == (11, 21)
    assert scales(out) == [("w", 21)]


def test_desired_is_never_below_the_busy_count():
    core = scaled_core(min=0, initial=0)
    at(core, 0)
    submit(core, 0, 5)                       # long tasks: none ends during the test
    out = at(core, S)
    # rate 1.5: base ceil(2.6) = 3, drain ceil(5 x 1.3 / 30) = 1: 4 slots.
    assert scales(out) == [("w", 4)] and len(dispatches(out)) == 4
    for t in range(2, 200):
        at(core, t * S)
        # base decays to 0 and drain stays ceil(1 x 1.3 / 30) = 1, but 4 slots are busy.
        snap = pool(core, t * S)
        assert (snap.desired, snap.busy, snap.pending) == (4, 4, 1)
    assert core.next_wakeup() == 200 * S     # running work keeps the evaluations going


def test_the_first_evaluation_of_an_idle_pool_steps_initial_down_by_one():
    core = scaled_core(min=0, initial=5)
    assert scales(at(core, 0)) == [("w", 4)]  # nothing in the window above 0, no cooldown yet
    assert core.next_wakeup() == S           # not settled: desired 4 is above the raw 0
    assert scales(at(core, S)) == []         # the cooldown (30 s) holds the next step
    assert core.next_wakeup() == 2 * S


def test_reservations_within_the_horizon_pre_warm_an_idle_pool():
    core = scaled_core(min=0, initial=0)
    at(core, 0)
    # [100 - 1, 100 + 10 + 1): counted once now + 60 s passes 99 s.
    core.submit(0, TaskSpec("fixed", pool="w", start_at=100, duration_hint=10))
    core.submit(0, TaskSpec("far", pool="w", start_at=1000, duration_hint=10))
    core.check_invariants()
    out = []
    while core.next_wakeup() is not None and core.next_wakeup() < 40 * S:
        out += at(core, core.next_wakeup())
    assert scales(out) == [] and pool(core, 40 * S - 1).desired == 0
    assert scales(at(core, 40 * S)) == [("w", 1)]
    assert pool(core, 40 * S).capacity == 1
    ds = []
    while core.next_wakeup() < 100 * S:
        ds += dispatches(at(core, core.next_wakeup()))
        assert pool(core, core.now).desired == 1       # the far one is outside the horizon
    assert ds == [] and pool(core, core.now).held == 1
    [d] = dispatches(at(core, 100 * S))
    assert (d.payload, core.now) == ("fixed", 100 * S)
    assert pool(core, 100 * S).fixed_start_hit_rate == 1.0


def test_an_idle_pool_with_only_distant_scheduled_work_does_not_tick():
    core = scaled_core(min=0, initial=0)
    at(core, 0)
    core.submit(0, TaskSpec("fixed", pool="w", start_at=3600, duration_hint=5))
    core.submit(0, TaskSpec("child", pool="w", after=1))    # blocked for an hour
    core.check_invariants()
    wakes = []
    while core.next_wakeup() is not None and core.next_wakeup() < 3600 * S:
        wakes.append(core.next_wakeup() // S)
        at(core, core.next_wakeup())
    # One evaluation, the hold check, then evaluations only from the horizon's edge on.
    assert wakes[:3] == [1, 3300, 3539]
    assert all(w >= 3539 for w in wakes[2:])


def test_due_fixed_starts_count_as_critical_backlog():
    # Steps of zero freeze the capacity at 0, so the task stays due; the undamped
    # desired value shows the terms.
    core = scaled_core(min=0, initial=0, max_step_up_abs=0, max_step_up_ratio=0.0,
                       slo={"critical": 0.2})
    at(core, 0)
    core.submit(0, TaskSpec("fixed", pool="w", start_at=5, tolerance=10))
    for t in range(1, 6):
        at(core, t * S)
    scaler = core.pools["w"].scaler
    # At 5 s: it became ready (one arrival), is due, and still reserved.
    base_drain = ceil(0.3 * 1 * 1.3 / 0.75) + ceil(1 * 1.3 / 30)      # 1 + 1
    slo = ceil(1 * 1.3 / 0.2)                                           # 7 (critical)
    assert scaler.raw == max(base_drain, slo, 0) + 1 == 8
    assert pool(core, 5 * S).desired == 0


def test_tasks_waiting_for_a_retry_are_backlog():
    core = scaled_core(min=1, initial=1, max_step_up_abs=0, max_step_up_ratio=0.0)
    at(core, 0)
    core.submit(0, TaskSpec("flaky", pool="w", retry=RetryPolicy(initial_backoff=100, jitter=False)))
    [d] = dispatches(drain(core))
    assert core.complete(S // 2, d.lease, "retryable")
    core.check_invariants()
    at(core, S)
    service = 0.3 * 0.5 + 0.7 * 1.3            # the EWMA saw one 0.5 s attempt
    expected = ceil(0.3 * 1 * service / 0.75) + ceil(1 * service / 30)     # 1 + 1
    assert core.pools["w"].scaler.raw == expected == 2
    at(core, 2 * S)
    assert core.pools["w"].scaler.raw == ceil(0.21 * service / 0.75) + 1 == 2


# ------------------------------------------------------------------ damping and clamps

def test_scale_up_is_limited_per_evaluation_and_clamped_to_max():
    core = scaled_core(min=1, max=40, initial=1, default_duration=1.0)
    at(core, 0)
    submit(core, 0, 101)                     # long tasks: none finishes during the test
    desired = []
    for t in range(1, 5):
        at(core, t * S)
        desired.append(pool(core, t * S).desired)
    # t=1: rate 30.3 -> base ceil(40.4) = 41, backlog 100 -> drain 4: 45, clamp 40;
    #      step max(ceil(1 x 1.0), 4) = 4: 1 -> 5
    # t=2: rate 21.21 -> base 29, backlog 96 -> drain 4: 33; step max(5, 4): 5 -> 10
    # t=3: rate 14.847 -> base 20, backlog 91 -> drain 4: 24; step 10: 10 -> 20
    # t=4: rate 10.3929 -> base 14, backlog 81 -> drain 3: 17 < busy 20: stays 20
    assert desired == [5, 10, 20, 20]


def test_min_bounds_desired_but_initial_is_not_raised_at_start():
    core = scaled_core(min=3, max=10, initial=1)
    assert core.pools["w"].capacity == 1      # before any evaluation
    out = at(core, 0)
    assert scales(out) == [("w", 3)]           # the first evaluation: desired >= min
    snap = pool(core, 0)
    assert (snap.desired, snap.capacity) == (3, 3)
    assert core.next_wakeup() is None


def test_scale_down_follows_the_window_maximum_by_max_step_down_per_cooldown():
    """Window 10 s, cooldown 5 s, max_step_down 2; 11 tasks of 1 s (S stays 1.0) at 0.5 s.

    t=1  rate 3.3: base ceil(4.4) = 5, drain ceil(11/30) = 1: raw 6; step 4: 0 -> 4
    t=2  rate 2.31: base ceil(3.08) = 4, drain ceil(7/30) = 1, busy 4: raw 5; 4 -> 5
    t=3  rate 1.617: base 3, drain ceil(2/30) = 1, busy 5: raw 5
    t=4  rate 1.1319: base 2, busy 2: raw 2;   t=5 rate 0.79233: base 2: raw 2
    t=6..17  rate 0.55 .. 0.011: base 1: raw 1;  t>=18 rate < 0.01: base 0: raw 0
    Down steps need the window max below the target and 5 s since the last step:
    t=12 the 6 (t=1) has left, but the 5s of t=2, t=3 remain; t=14 max 2: 5 -> 3;
    t=19 (cooldown) max 1: 3 -> 1; t=28 the last 1 (t=17) has left: 1 -> 0, settled.
    """
    core = scaled_core(min=0, max=20, initial=0, default_duration=1.0, stabilization_window=10,
                       cooldown=5, max_step_down=2)
    sim = Simulator(core, lambda d: Run(1.0), check=True)
    curve = {}
    for k in range(0, 41):
        sim.advance_to(k * S)
        curve[k] = pool(core, k * S).desired
        if k == 0:
            for _ in range(11):
                sim.submit(TaskSpec("job", pool="w"), at=0.5)
    expected = {k: 0 if k < 1 else 4 if k < 2 else 5 if k < 14 else 3 if k < 19 else 1 if k < 28
                else 0 for k in range(41)}
    assert curve == expected
    assert sim.scales == [(1.0, "w", 4), (2.0, "w", 5), (14.0, "w", 3), (19.0, "w", 1),
                          (28.0, "w", 0)]
    assert core.next_wakeup() is None
    assert core.snapshot(40 * S).totals["succeeded"] == 11


def test_running_tasks_are_never_interrupted_when_capacity_shrinks():
    core = Core(CoreConfig(), [PoolConfig("w", min=1, max=5, initial=3, autoscale=False)], now=0)
    for _ in range(4):
        core.submit(0, TaskSpec("job", pool="w"))
    ds = dispatches(drain(core))
    assert len(ds) == 3
    core.set_capacity(S, "w", 1)
    core.check_invariants()
    assert aborts(drain(core)) == []
    snap = core.snapshot(S).pool("w")
    assert (snap.capacity, snap.busy, snap.pending) == (1, 3, 1)
    assert dispatches(drain(core)) == []
    core.complete(2 * S, ds[0].lease)
    core.check_invariants()
    assert dispatches(drain(core)) == []      # 2 busy of 1: the slot retires
    core.complete(3 * S, ds[1].lease)
    core.check_invariants()
    assert dispatches(drain(core)) == []
    core.complete(4 * S, ds[2].lease)
    core.check_invariants()
    assert len(dispatches(drain(core))) == 1  # 0 busy of 1: the waiting task runs


def test_worker_seconds_and_cost_accumulate_capacity_over_time():
    core = scaled_core(min=2, max=2, initial=2, cost_per_worker_second=0.25)
    at(core, 0)
    snap = pool(core, 100 * S)
    assert snap.worker_seconds == pytest.approx(200.0)
    assert snap.cost == pytest.approx(50.0)
    plain = Core(CoreConfig(), [PoolConfig("w", min=1, max=3, initial=3, autoscale=False)], now=0)
    plain.set_capacity(10 * S, "w", 1)
    snap = plain.snapshot(20 * S).pool("w")
    assert snap.worker_seconds == pytest.approx(40.0) and snap.cost == 0.0


def test_an_idle_settled_pool_arms_no_timer():
    core = scaled_core(min=1, max=10, initial=1, default_duration=0.5)
    assert core.next_wakeup() == 0
    at(core, 0)
    assert core.next_wakeup() is None
    sim = Simulator(core, lambda d: Run(0.5), check=True)
    for i in range(20):
        sim.submit(TaskSpec("job", pool="w"), at=1.0 + i * 0.1)
    sim.run()                                  # runs until nothing is timed any more
    assert core.next_wakeup() is None
    assert core.snapshot(sim.now).totals["succeeded"] == 20
    assert pool(core, sim.now).desired == 1
    assert sim.now < 200 * S                   # it settled, it did not tick for ever


# ------------------------------------------------------------------ a scenario

def test_scenario_burst_steady_state_and_idle_tail():
    """A pool (min 1, max 10, default autoscaling, $0.50 per worker-second) whose tasks
    all run exactly 1 s (= default_duration, so the EWMA service time S stays 1.0):

    - burst: 41 tasks at t = 0.5 s;
    - steady state: one task at k + 0.5 s for k = 6 .. 280;
    - idle tail: nothing after 280.5 s.

    Evaluations run at whole seconds. When an evaluation and completions fall on the
    same instant, the evaluation comes first (timers fire before a call's effect).

    Burst (capacity follows the target at once):
      0.5  1 slot: #1 runs (ends 1.5), backlog 40
      t=1  rate 0.3*41 = 12.3: base ceil(12.3/0.75 = 16.4) = 17, drain ceil(40/30) = 2,
           busy 1: raw 19 -> clamp 10; step max(ceil(1), 4) = 4  -> desired 5
           #2-#5 start (end 2.0), backlog 36; at 1.5 #6 starts, backlog 35
      t=2  rate 8.61: base ceil(11.48) = 12, drain ceil(35/30) = 2, busy 5: 14 -> 10;
           step max(5, 4) = 5                                    -> desired 10
           #2-#5 end, 9 start (end 3.0), backlog 26; 2.5: #6 ends, #16 starts, backlog 25
      t=3  rate 6.027: base 9, drain ceil(25/30) = 1, busy 10: raw 10 -> 10
      t=4  rate 4.2189: base 6, drain 1 (backlog 15), busy 10: raw 10
      t=5  rate 2.95323: base 4, drain 1 (backlog 5), busy 10: raw 10
           the last 5 start at 5.0 (end 6.0); #36 ends 5.5
      t=6  rate 2.067261: base 3, drain 0, busy 5: raw 5; window max 10: stays 10
    Steady state (1 arrival per interval, each runs alone for 1 s, busy 1 at ticks):
      t=7  rate 1.7470827: base ceil(2.33) = 3      raw 3
      t=8  rate 1.52295789: base ceil(2.03) = 3     raw 3
      t>=9 rate 1.366..., then -> 1 from above: base ceil(rate/0.75) = 2    raw 2
      Stabilization (60 s): the last raw 10 is t=5, so at t=66 the window max is 5
      (t=6): 10 -> 9 (one step). Then one step per 30 s cooldown, window max 2:
      96: 8, 126: 7, 156: 6, 186: 5, 216: 4, 246: 3, 276: 2.
    Idle tail:
      t=281 still one arrival (280.5) and busy 1: raw 2
      t=282 rate ~0.7: base ceil(0.93) = 1, busy 0: raw 1 (= min)
      The last raw 2 (t=281) leaves the window when now - 60 > 281: at 342, 2 -> 1.
      At 342 everything is settled (rate 0.7^61, history all 1): no more timers.
    Worker-seconds to t=400: 1*1 + 5*1 + 10*64 + (9+8+7+6+5+4+3)*30 + 2*66 + 1*58 = 2096.
    """
    pool_config = PoolConfig("w", min=1, max=10, initial=1, default_duration=1.0,
                             autoscale=AutoscaleConfig(cost_per_worker_second=0.5))
    core = Core(CoreConfig(), [pool_config], now=0)
    sim = Simulator(core, lambda d: Run(1.0), check=True)

    def expected(t):
        steps = [(0, 1), (1, 5), (2, 10), (66, 9), (96, 8), (126, 7), (156, 6), (186, 5),
                 (216, 4), (246, 3), (276, 2), (342, 1)]
        return [d for start, d in steps if start <= t][-1]

    curve = {}
    for k in range(0, 401):
        sim.advance_to(k * S)
        curve[k] = core.snapshot(k * S).pool("w").desired
        core.check_invariants()
        if k == 0:
            for _ in range(41):
                sim.submit(TaskSpec("burst", pool="w"), at=0.5)
        elif 6 <= k <= 280:
            sim.submit(TaskSpec("steady", pool="w"), at=k + 0.5)
    mismatches = {k: (curve[k], expected(k)) for k in curve if curve[k] != expected(k)}
    assert mismatches == {}
    assert sim.scales == [(1.0, "w", 5), (2.0, "w", 10), (66.0, "w", 9), (96.0, "w", 8),
                          (126.0, "w", 7), (156.0, "w", 6), (186.0, "w", 5), (216.0, "w", 4),
                          (246.0, "w", 3), (276.0, "w", 2), (342.0, "w", 1)]
    assert core.next_wakeup() is None
    snap = core.snapshot(400 * S)
    core.check_invariants()
    assert snap.totals["succeeded"] == 41 + 275
    p = snap.pool("w")
    assert (p.capacity, p.desired, p.busy, p.pending) == (1, 1, 0, 0)
    assert p.worker_seconds == pytest.approx(2096.0)
    assert p.cost == pytest.approx(1048.0)
    # Every burst task waited for a slot, none of the steady ones did.
    waits = [sim.records[t].dispatches[0] - 0.5 for t in sorted(sim.records)[:41]]
    assert max(waits) == pytest.approx(4.5) and min(waits) == 0.0


# ------------------------------------------------------------------ capacity from outside (server pools)

def external_core(min=0, max=100, **autoscale):
    pool = PoolConfig("w", min=min, max=max, initial=0, default_duration=1.3, external_capacity=True,
                      autoscale=AutoscaleConfig(**autoscale))
    return Core(CoreConfig(), [pool], now=0)


def test_an_external_capacity_pool_asks_for_capacity_but_never_sets_it():
    core = external_core(max_step_up_abs=1000)
    at(core, 0)
    submit(core, 0, 7)
    out = at(core, S)
    assert scales(out) == [("w", 5)]                 # the same formula as an in-process pool: base 4 + drain 1
    assert dispatches(out) == []                     # but no slot came of it: no worker is connected
    snap = pool(core, S)
    assert (snap.capacity, snap.desired) == (0, 5)
    core.set_capacity(S, "w", 2)                     # two workers' slots connect
    assert len(dispatches(drain(core))) == 2
    out = at(core, 2 * S)                            # a new evaluation keeps asking; capacity stays as reported
    assert pool(core, 2 * S).capacity == 2 and pool(core, 2 * S).desired >= 5
    assert all(desired >= 5 for _, desired in scales(out))


def test_an_external_capacity_pool_falls_back_to_min_per_the_stabilization_rules():
    core = external_core(min=1, max_step_up_abs=1000, stabilization_window=2.0, cooldown=1.0, max_step_down=2)
    at(core, 0)
    assert pool(core, 0).desired == 1                # the evaluation at start asks for min at least
    ids = [core.submit(0, TaskSpec("job", pool="w"))[0] for _ in range(20)]
    drain(core)
    at(core, S)
    high = pool(core, S).desired
    assert high > 4
    for task_id in ids:                              # the work goes away before any worker came
        core.cancel(S, task_id)
    drain(core)
    seen = []
    for second in range(2, 12):
        at(core, second * S)
        seen.append(pool(core, second * S).desired)
    assert seen[0] == high                           # inside the window: the window's maximum holds
    steps = [a - b for a, b in zip(seen, seen[1:])]
    assert all(0 <= step <= 2 for step in steps)     # down by at most max_step_down per cooldown
    assert seen[-1] == 1 and pool(core, 11 * S).capacity == 0   # min bounds desired; capacity untouched


def test_a_server_pool_follows_a_tenfold_burst_at_the_next_evaluation_and_falls_back_per_the_window():
    # A server pool (capacity from workers) whose work is taken as it comes: only the arrival rate
    # moves desired. 4 tasks/s for a minute, then 40 in one second, then 4/s again; the operator's
    # decision (replicas = ceil(desired / slots)) follows desired.
    from cronoq.operator.decide import replicas_for

    core = external_core(max_step_up_abs=1000)   # (no step limit: desired may follow at once)
    at(core, 0)

    def second(t: int, arrivals: int) -> int:
        for _ in range(arrivals):
            task_id, _ = core.submit(t * S, TaskSpec("job", pool="w"))
            core.cancel(t * S, task_id)   # taken at once: no backlog, nothing busy
        drain(core)
        at(core, (t + 1) * S)
        return pool(core, (t + 1) * S).desired

    for t in range(60):
        steady = second(t, 4)
    assert steady == ceil(4 * 1.3 / 0.75)                    # rate 4/s x S 1.3 s / utilization 0.75 = 7
    burst = second(60, 40)
    rate = 0.3 * 40 + 0.7 * 4                                 # the EWMA one evaluation after the burst
    assert burst == ceil(rate * 1.3 / 0.75) == 26             # followed at the next evaluation
    assert (replicas_for(steady, 4, 0, 100), replicas_for(burst, 4, 0, 100)) == (2, 7)
    after = [second(t, 4) for t in range(61, 200)]
    window = after[:59]                                       # the stabilization window (60 s) holds the peak
    assert set(window) == {burst}
    falling = after[59:]
    assert all(0 <= a - b <= 1 for a, b in zip(falling, falling[1:]))   # max_step_down per step at most
    downs = [i for i, (a, b) in enumerate(zip(falling, falling[1:])) if a > b]
    assert all(b - a >= 30 for a, b in zip(downs, downs[1:]))           # one step per cooldown (30 s)
    assert falling[-1] < burst and min(falling) >= steady
