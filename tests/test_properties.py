"""Property tests (hypothesis) for the engine's data structures.

Each structure is checked against a brute-force model: the ready queues
against a scan of every live entry scored with the book's formula, the timer
heap against a sort, the histograms against exact percentiles, the
reservation calendar against a count of overlapping half-open intervals and
the metrics window against a direct integral.
"""

from __future__ import annotations

import math

import pytest

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule,
)

from cronoq.core.metrics import (
    DecayingHistogram, Histogram, PoolWindow, bucket_mid, bucket_of, percentile_of,
)
from cronoq.core.queues import Queued, ReadyQueues
from cronoq.core.reservations import Calendar
from cronoq.core.timers import TimerHeap
from cronoq.core.types import NS, READY, PriorityConfig, UrgencyConfig

SETTINGS = settings(deadline=None, max_examples=150,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
STATEFUL = settings(deadline=None, max_examples=60, stateful_step_count=60,
                    suppress_health_check=[HealthCheck.too_slow])

ENDED = "cancelled"


# ====================================================================== ready queues

class FakeSpec:
    __slots__ = ("tenant",)

    def __init__(self, tenant):
        self.tenant = tenant


class FakeEntry(Queued):
    """The attributes of an engine Entry that queues.py reads and writes
    (declared by Queued; a compiled Queued keeps them in its own layout)."""

    __slots__ = ("deadline",)

    def __init__(self, task_id, cls, submitted, deadline=None, est=0, tenant=None):
        self.id = task_id
        self.cls = cls
        self.submitted = submitted
        self.deadline = deadline
        self.est = est
        self.lst = None if deadline is None else deadline - est
        self.tag = None
        self.spec = FakeSpec(tenant) if tenant is not None else None
        self.status = READY

    def __repr__(self):
        return (f"E(id={self.id}, cls={self.cls}, sub={self.submitted}, lst={self.lst}, "
                f"est={self.est}, tag={self.tag})")


def book_score(e, now, priority: PriorityConfig, urgency: UrgencyConfig) -> float:
    """The book's effective score:

    base[class] + min(aging_rate[class] * wait_seconds, age_cap[class]) + urgency

    with urgency 0 for slack >= H, U * (1 - slack / H) for 0 <= slack < H and
    U + min(overdue_rate * -slack, cap) when overdue; H = max(d, window).
    Written in nanoseconds with per-ns rates, the engine's units, so that
    exact ties come out exact here too.
    """
    age = (now - e.submitted) * (priority.aging_rate[e.cls] / 1e9)
    cap = priority.age_cap[e.cls]
    score = priority.base[e.cls] + (age if age < cap else cap)
    if e.lst is not None:
        slack = e.lst - now
        window = int(urgency.window * 1e9)
        horizon = e.est if e.est > window else window
        if slack >= horizon:
            extra = 0.0
        elif slack >= 0:
            extra = urgency.peak * (1.0 - slack / horizon)
        else:
            overdue = -slack * (urgency.overdue_rate / 1e9)
            extra = urgency.peak + (overdue if overdue < urgency.overdue_cap else urgency.overdue_cap)
        score += extra
    return score


def brute_best(entries, now, priority, urgency, edf_heads_only: bool, fair: bool):
    """The task dispatch must choose, found by scanning every live entry.

    Deadline tasks compete through their class's earliest-latest-start head
    (the book: "tasks with deadlines are kept in a queue ordered by latest
    start time ... and the head competes with the class's FIFO lane by full
    score"); in a fair pool the non-deadline tasks of a class compete through
    their lowest start tag.
    """
    candidates = []
    for c in range(4):
        mine = [e for e in entries if e.cls == c]
        plain = [e for e in mine if e.lst is None]
        timed = [e for e in mine if e.lst is not None]
        if fair and plain:
            plain = [min(plain, key=lambda e: (e.tag, e.id))]
        if edf_heads_only and timed:
            timed = [min(timed, key=lambda e: (e.lst, e.id))]
        candidates += plain + timed
    if not candidates:
        return None
    scored = [(book_score(e, now, priority, urgency), e) for e in candidates]
    top = max(s for s, _ in scored)
    return min((e for s, e in scored if s == top), key=lambda e: (e.cls, e.id))


class QueueMachine(RuleBasedStateMachine):
    """Random pushes, takes, discards, reinsertions and clock moves on one
    ReadyQueues, compared with a brute-force scan after every take."""

    FAIR = False
    DEADLINES = True

    taken = Bundle("taken")

    def __init__(self):
        super().__init__()
        self.q = None
        self.now = 0
        self.next_id = 1
        self.live: dict[int, FakeEntry] = {}

    @initialize(base=st.sampled_from([(10000, 1000, 100, 10), (10, 10, 10, 10), (400, 300, 200, 100)]),
                rate=st.sampled_from([(2.0,) * 4, (0.0,) * 4, (50.0, 20.0, 10.0, 5.0)]),
                cap=st.sampled_from([(800,) * 4, (0,) * 4, (5000, 4000, 3000, 2000)]),
                peak=st.sampled_from([5000.0, 100.0]),
                window=st.sampled_from([5.0, 0.5]),
                weights=st.sampled_from([{}, {"a": 3.0, "b": 1.0}, {"a": 0.5, "c": 2.0}]))
    def setup(self, base, rate, cap, peak, window, weights):
        self.priority = PriorityConfig(base, rate, cap)
        self.urgency = UrgencyConfig(peak=peak, window=window)
        self.q = ReadyQueues(self.priority, self.urgency, self.FAIR, weights)

    @rule(dt=st.integers(0, 20 * NS) | st.sampled_from([0, 1, NS // 2, 400 * NS]))
    def tick(self, dt):
        self.now += dt

    @rule(cls=st.integers(0, 3),
          deadline=st.none() | st.integers(-30 * NS, 120 * NS),
          est=st.sampled_from([0, NS // 10, NS, 7 * NS, 60 * NS]),
          tenant=st.sampled_from([None, "a", "b", "c"]),
          n=st.integers(1, 4))
    def push(self, cls, deadline, est, tenant, n):
        if not self.DEADLINES:
            deadline = None
        for _ in range(n):
            e = FakeEntry(self.next_id, cls, self.now,
                          None if deadline is None else self.now + deadline, est, tenant)
            self.next_id += 1
            self.q.push(e)
            self.live[e.id] = e

    @rule(target=taken)
    def take(self):
        q = self.q
        peeked = q.peek(self.now)
        expected = brute_best(list(self.live.values()), self.now, self.priority, self.urgency,
                              edf_heads_only=True, fair=self.FAIR)
        e = q.take(self.now)
        assert peeked is e
        assert e is expected, (e, expected)
        if e is None:
            return None
        assert e.id in self.live
        # FIFO within a class: no older task of the class's lane is left behind.
        if e.lst is None and not self.FAIR:
            assert all(o.id > e.id for o in self.live.values()
                       if o.cls == e.cls and o.lst is None and o is not e)
        if e.lst is not None:
            assert all((o.lst, o.id) > (e.lst, e.id) for o in self.live.values()
                       if o.cls == e.cls and o.lst is not None and o is not e)
        del self.live[e.id]
        e.status = "running"
        return e

    @rule(e=consumes(taken))
    def reinsert(self, e):
        """A retried (or re-offered) task returns to its place by id."""
        if e is None:
            return
        e.status = READY
        self.q.push(e)
        self.live[e.id] = e

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def discard(self, data):
        e = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.q.discard(e)
        e.status = ENDED

    @invariant()
    def counts_match(self):
        if self.q is None:
            return
        counts = [0, 0, 0, 0]
        for e in self.live.values():
            counts[e.cls] += 1
        assert self.q.count == counts
        assert self.q.total == len(self.live)
        assert sorted(e.id for e in self.q.live_entries()) == sorted(self.live)


class NoDeadlineQueueMachine(QueueMachine):
    """Without deadlines every live entry competes: take is the plain argmax."""

    DEADLINES = False

    @rule()
    def take_full_scan(self):
        expected = None
        best = None
        for e in sorted(self.live.values(), key=lambda e: (e.cls, e.id)):
            s = book_score(e, self.now, self.priority, self.urgency)
            if best is None or s > best:
                best, expected = s, e
        e = self.q.take(self.now)
        assert e is expected
        if e is not None:
            del self.live[e.id]
            e.status = "running"


class FairQueueMachine(QueueMachine):
    FAIR = True


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = STATEFUL
TestNoDeadlineQueueMachine = NoDeadlineQueueMachine.TestCase
TestNoDeadlineQueueMachine.settings = STATEFUL
TestFairQueueMachine = FairQueueMachine.TestCase
TestFairQueueMachine.settings = STATEFUL


@SETTINGS
@given(tasks=st.lists(st.tuples(st.integers(0, 3), st.none() | st.integers(-20 * NS, 90 * NS)),
                      min_size=1, max_size=40),
       est=st.sampled_from([0, NS, 8 * NS]),
       times=st.lists(st.integers(0, 30 * NS), min_size=1, max_size=40))
def test_take_has_the_highest_score_over_every_entry(tasks, est, times):
    """With one submission time and one estimate, urgency never rises with the
    latest start time, so the deadline queue's head is its class's best
    deadline task and take() must return a task of the highest score over all
    live entries, of the most important class among those. The book's final
    tie-break (submission order) holds except between deadline tasks of equal
    urgency (see test_deadline_tasks_of_a_class_leave_in_latest_start_order), so the exact choice is compared with
    the scan that lets deadline tasks compete through their class's head."""
    priority, urgency = PriorityConfig(), UrgencyConfig()
    q = ReadyQueues(priority, urgency, False, {})
    live = {}
    for i, (cls, deadline) in enumerate(tasks, 1):
        e = FakeEntry(i, cls, 0, deadline, est)
        q.push(e)
        live[i] = e
    now = 0
    for dt in times:
        now += dt
        everything = list(live.values())
        e = q.take(now)
        if e is None:
            assert not live
            break
        top = max(book_score(o, now, priority, urgency) for o in everything)
        assert book_score(e, now, priority, urgency) == top
        assert e.cls == min(o.cls for o in everything if book_score(o, now, priority, urgency) == top)
        assert e is brute_best(everything, now, priority, urgency, edf_heads_only=True, fair=False)
        del live[e.id]
        e.status = "running"


@pytest.mark.parametrize("now", [0, 60 * NS], ids=["not-yet-urgent", "capped-overdue"])
def test_deadline_tasks_of_a_class_leave_in_latest_start_order(now):
    """Within a class, deadline tasks are ordered by latest start time (the
    book's earliest-deadline-first queue), even when their scores tie: while
    the deadline is beyond the horizon (urgency 0) or once it is capped."""
    priority, urgency = PriorityConfig(), UrgencyConfig()
    q = ReadyQueues(priority, urgency, False, {})
    older = FakeEntry(1, 1, 0, deadline=20 * NS + NS, est=0)   # latest start 21 s
    newer = FakeEntry(2, 1, 0, deadline=20 * NS, est=0)        # latest start 20 s
    q.push(older)
    q.push(newer)
    assert book_score(older, now, priority, urgency) == book_score(newer, now, priority, urgency)
    assert q.take(now) is newer
    assert q.take(now) is older


@pytest.mark.parametrize("case", ["older-later-deadline", "longer-estimate"])
def test_only_queue_heads_compete(case):
    """Dispatch compares the heads of at most eight queues, never the whole
    backlog: a deadline task behind its class's earliest-latest-start head
    waits for that head, even when its own score is higher."""
    priority, urgency = PriorityConfig(), UrgencyConfig()
    q = ReadyQueues(priority, urgency, False, {})
    if case == "older-later-deadline":
        behind = FakeEntry(1, 2, 0, deadline=100 * NS)          # 40 points of age at 20 s
        lane = FakeEntry(2, 2, 5 * NS)                          # 30 points
        head = FakeEntry(3, 2, 10 * NS, deadline=50 * NS)       # 20 points, earlier deadline
        now = 20 * NS
        expected = [lane, head, behind]
    else:
        behind = FakeEntry(1, 2, 0, deadline=70 * NS, est=60 * NS)   # slack 10 s of H 60 s: 4167
        lane = FakeEntry(2, 2, 0)
        head = FakeEntry(3, 2, 0, deadline=5 * NS, est=NS)         # slack 4 s of H 5 s: 1000
        now = 0
        expected = [head, behind, lane]
    for e in (behind, lane, head):
        q.push(e)
    scores = {e.id: book_score(e, now, priority, urgency) for e in (behind, lane, head)}
    assert scores[behind.id] == max(scores.values())
    order = []
    while (e := q.take(now)) is not None:
        order.append(e)
        e.status = "running"
    assert order == expected


@SETTINGS
@given(weights=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                               st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0, 10.0]), min_size=1),
       backlog=st.dictionaries(st.sampled_from(["a", "b", "c", "d", None]), st.integers(1, 40),
                               min_size=2))
def test_fair_share_splits_dispatches_by_weight(weights, backlog):
    """Start-time fair queuing: while two tenants both have work waiting, their
    dispatch counts divided by their weights stay within one task of each other."""
    q = ReadyQueues(PriorityConfig(), UrgencyConfig(), True, weights)
    next_id = 1
    order = sorted(backlog, key=lambda t: (t is None, t or ""))
    for tenant in order:
        for _ in range(backlog[tenant]):
            q.push(FakeEntry(next_id, 2, 0, tenant=tenant))
            next_id += 1
    left = dict(backlog)
    done = dict.fromkeys(backlog, 0)
    last_id = {}
    while True:
        e = q.take(0)
        if e is None:
            break
        tenant = e.spec.tenant if e.spec else None
        assert e.id > last_id.get(tenant, 0)   # FIFO within a tenant
        last_id[tenant] = e.id
        done[tenant] += 1
        left[tenant] -= 1
        waiting = [t for t in backlog if left[t] > 0]
        for a in waiting:
            for b in waiting:
                wa, wb = weights.get(a, 1.0), weights.get(b, 1.0)
                assert abs(done[a] / wa - done[b] / wb) <= 1 / wa + 1 / wb + 1e-9, (a, b, done)
    assert all(n == 0 for n in left.values())


@SETTINGS
@given(first=st.integers(1, 30), second=st.integers(1, 30), head_start=st.integers(0, 29),
       wa=st.sampled_from([1.0, 2.0, 0.5]), wb=st.sampled_from([1.0, 3.0, 0.5]))
def test_fair_share_banks_no_credit_for_a_late_tenant(first, second, head_start, wa, wb):
    """A tenant that arrives late shares from then on; it does not catch up."""
    assume(head_start < first)
    q = ReadyQueues(PriorityConfig(), UrgencyConfig(), True, {"a": wa, "b": wb})
    next_id = 1
    for _ in range(first):
        q.push(FakeEntry(next_id, 2, 0, tenant="a"))
        next_id += 1
    for _ in range(head_start):
        assert q.take(0).spec.tenant == "a"
    for _ in range(second):
        q.push(FakeEntry(next_id, 2, 0, tenant="b"))
        next_id += 1
    na = nb = 0
    left_a, left_b = first - head_start, second
    while left_a and left_b:
        e = q.take(0)
        if e.spec.tenant == "a":
            na += 1
            left_a -= 1
        else:
            nb += 1
            left_b -= 1
        assert abs(na / wa - nb / wb) <= 2 / wa + 2 / wb + 1e-9, (na, nb)


@SETTINGS
@given(ids=st.lists(st.integers(1, 10_000), unique=True, min_size=1, max_size=60), data=st.data())
def test_lane_reinsertion_by_id_keeps_submission_order(ids, data):
    """Tasks pushed back in any order (retries, wake-ups) come out by id."""
    q = ReadyQueues(PriorityConfig(), UrgencyConfig(), False, {})
    entries = {i: FakeEntry(i, 1, 0) for i in ids}
    for i in ids:            # arbitrary order: the lane keeps itself sorted
        q.push(entries[i])
    out = []
    pending = set(ids)
    while pending:
        e = q.take(0)
        out.append(e.id)
        pending.discard(e.id)
        e.status = "running"
        if data.draw(st.booleans()):   # retried: back to its place
            e.status = READY
            q.push(e)
            pending.add(e.id)
            out.pop()
    assert out == sorted(ids)


# ====================================================================== timer heap

@SETTINGS
@given(ops=st.lists(st.one_of(st.tuples(st.just("push"), st.integers(0, 50)),
                              st.tuples(st.just("pop"), st.integers(0, 60))), max_size=120))
def test_timer_heap_pops_in_time_then_insertion_order(ops):
    heap = TimerHeap()
    model = []   # (when, insertion)
    seq = 0
    popped = []
    for op, value in ops:
        if op == "push":
            seq += 1
            heap.push(value, 1, object(), seq)
            model.append((value, seq))
        else:
            model.sort()
            due = heap.pop_due(value)
            if model and model[0][0] <= value:
                assert due is not None
                expected = model.pop(0)
                assert (due[0], due[4]) == expected
                popped.append(expected)
            else:
                assert due is None
        assert len(heap) == len(model)
        assert heap.next_time() == (min(model)[0] if model else None)
    while True:
        due = heap.pop_due(10 ** 9)
        if due is None:
            break
        popped.append((due[0], due[4]))
    assert len(popped) == seq
    # Whatever the interleaving, the timers with one due time fire in insertion order.
    by_time = {}
    for when, s in popped:
        by_time.setdefault(when, []).append(s)
    assert all(v == sorted(v) for v in by_time.values())


# ====================================================================== histograms

VALUES = (st.integers(0, 2 ** 62) | st.integers(0, 5000)
          | st.sampled_from([0, 1, 15, 16, 17, 31, 32, 255, 256]))


@SETTINGS
@given(a=VALUES, b=VALUES)
def test_bucket_of_is_monotonic(a, b):
    if a <= b:
        assert bucket_of(a) <= bucket_of(b)
        assert bucket_mid(bucket_of(a)) <= bucket_mid(bucket_of(b))


@SETTINGS
@given(v=VALUES)
def test_bucket_mid_is_within_the_bucket_error(v):
    mid = bucket_mid(bucket_of(v))
    if v < 16:
        assert mid == v
    else:
        assert abs(mid - v) / v <= 0.0625 + 1e-12
    # The bucket's neighbours are ordered too.
    index = bucket_of(v)
    if index > 0:
        assert bucket_mid(index - 1) < mid


@SETTINGS
@given(index=st.integers(0, 500))
def test_bucket_mid_increases_and_round_trips(index):
    """Every index is reached by some value, midpoints increase with the
    index, and a bucket's midpoint falls back into that bucket."""
    mid = bucket_mid(index)
    if index >= 1:
        assert bucket_mid(index - 1) < mid
    assert bucket_of(int(mid)) == index


def exact_percentile(values, q):
    ordered = sorted(values)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


QS = st.sampled_from([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]) | st.floats(0.001, 1.0)


@SETTINGS
@given(values=st.lists(st.integers(0, 10 ** 12) | st.integers(0, 300), min_size=1, max_size=300), q=QS)
def test_histogram_percentile_is_close_to_the_exact_one(values, q):
    h = Histogram()
    for v in values:
        h.record(v)
    assert h.total == len(values)
    got = h.percentile(q)
    exact = exact_percentile(values, q)
    if exact < 16:
        assert got == exact
    else:
        assert abs(got - exact) / exact <= 0.065
    assert abs(got - exact) <= max(0.10 * exact, 0.5)
    # Merging two halves gives the same histogram.
    a, b = Histogram(), Histogram()
    for i, v in enumerate(values):
        (a if i % 2 else b).record(v)
    a.merge(b)
    assert a.counts == h.counts


def test_percentile_of_empty_is_none():
    assert percentile_of({}, 0, 0.5) is None
    assert Histogram().percentile(0.9) is None
    assert DecayingHistogram().percentile(0.9) is None


@SETTINGS
@given(values=st.lists(st.integers(0, 10 ** 9) | st.integers(0, 40), min_size=1, max_size=400),
       half_life=st.integers(1, 64), qs=st.lists(QS, min_size=1, max_size=4))
def test_decaying_histogram_matches_a_weighted_model(values, half_life, qs):
    """Each sample weighs 1/2 per decay since it was recorded; a bucket whose
    weight falls under 0.01 at a decay is dropped. Percentiles are weighted
    nearest-rank percentiles of that model, to within the bucket error."""
    h = DecayingHistogram(half_life)
    samples: list[list] = []   # [value, weight]
    for n, v in enumerate(values, 1):
        h.record(v)
        samples.append([v, 1.0])
        if n % half_life == 0:
            for s in samples:
                s[1] *= 0.5
            weight = {}
            for value, w in samples:
                weight[bucket_of(value)] = weight.get(bucket_of(value), 0.0) + w
            samples = [s for s in samples if weight[bucket_of(s[0])] >= 0.01]
        if n % 7 == 0 or n == len(values):
            h.percentile(qs[0])   # caches must follow new records
    total = sum(w for _, w in samples)
    assert math.isclose(h.total, total, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(sum(h.counts.values()), h.total, rel_tol=1e-9, abs_tol=1e-12)
    model_counts = {}
    for value, w in samples:
        model_counts[bucket_of(value)] = model_counts.get(bucket_of(value), 0.0) + w
    assert set(model_counts) == set(h.counts)
    for index, w in model_counts.items():
        assert math.isclose(h.counts[index], w, rel_tol=1e-9)
    for q in qs:
        got = h.percentile(q)
        if not samples:
            assert got is None
            continue
        rank = q * total
        seen = 0.0
        exact = None
        for value, w in sorted(samples):
            seen += w
            if seen >= rank - 1e-9 * total:
                exact = value
                break
        if exact is None:
            exact = max(v for v, _ in samples)
        if exact < 16:
            assert abs(got - exact) <= 1
        else:
            assert abs(got - exact) / exact <= 0.10


def test_decaying_histogram_follows_a_changing_workload():
    h = DecayingHistogram(half_life=512)
    for _ in range(3000):
        h.record(10 * NS)
    assert abs(h.percentile(0.5) - 10 * NS) / (10 * NS) <= 0.0625
    for _ in range(3000):
        h.record(NS // 10)
    assert abs(h.percentile(0.5) - NS / 10) / (NS / 10) <= 0.0625
    assert abs(h.percentile(0.95) - NS / 10) / (NS / 10) <= 0.0625
    assert h.total < 1100   # decayed: bounded by about two half-lives


# ====================================================================== reservation calendar

def brute_peak(intervals, lo, hi):
    """The most half-open intervals [a, b) covering one instant of [lo, hi)."""
    instants = {lo} | {a for a, b in intervals if lo <= a < hi}
    best = 0
    for t in instants:
        if lo <= t < hi:
            best = max(best, sum(1 for a, b in intervals if a <= t < b))
    return best


INTERVAL = st.tuples(st.integers(0, 60), st.integers(0, 25)).map(lambda t: (t[0], t[0] + t[1]))


@SETTINGS
@given(ops=st.lists(st.one_of(st.tuples(st.just("add"), INTERVAL),
                              st.tuples(st.just("remove"), st.integers(0, 40))), max_size=40),
       queries=st.lists(st.tuples(INTERVAL.filter(lambda i: i[1] > i[0]), st.lists(INTERVAL, max_size=4),
                                  st.sets(st.integers(0, 40), max_size=4)), min_size=1, max_size=8))
def test_calendar_peak_matches_a_brute_force_count(ops, queries):
    cal = Calendar()
    model: dict[int, tuple[int, int]] = {}
    next_id = 0
    for op, value in ops:
        if op == "add":
            cal.add(value[0], value[1], next_id)
            model[next_id] = value
            next_id += 1
        else:
            cal.remove(value)
            model.pop(value, None)
        assert len(cal) == len(model)
        assert all((i in cal) == (i in model) for i in range(next_id + 1))
    for (lo, hi), extra, exclude in queries:
        intervals = [iv for i, iv in model.items() if i not in exclude] + list(extra)
        expected = brute_peak(intervals, lo, hi)
        assert cal.peak(lo, hi, extra, exclude) == expected
        everything = list(model.values()) + list(extra)
        for limit in (1, 2, 3):
            assert cal.fits(lo, hi, limit, extra) == (brute_peak(everything, lo, hi) + 1 <= limit)
    for now in range(-1, 90, 7):
        later = [a for a, _ in model.values() if a > now]
        assert cal.next_start_after(now) == (min(later) if later else None)


def test_back_to_back_bookings_do_not_collide():
    cal = Calendar()
    cal.add(0, 10, 1)
    assert cal.fits(10, 20, 1)
    assert not cal.fits(9, 20, 1)
    assert cal.peak(0, 20, [(10, 20)]) == 1


# ====================================================================== metrics window

def brute_integral(segments, lo, hi):
    """Integral over [lo, hi) of a step function given as (start, end, value)."""
    total = 0
    for a, b, v in segments:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            total += (b - a) * v
    return total


@SETTINGS
@given(span=st.integers(1, 40), n=st.integers(1, 12), start=st.integers(0, 500),
       initial=st.integers(0, 4),
       changes=st.lists(st.tuples(st.integers(0, 90) | st.just(0),
                                  st.sampled_from(["busy", "capacity", "bucket", "read"]),
                                  st.integers(0, 6)), max_size=60))
def test_pool_window_integrates_busy_and_capacity_exactly(span, n, start, initial, changes):
    w = PoolWindow(span * n, n, start, initial)
    t = start
    busy_segments, cap_segments = [], []
    busy, capacity = 0, initial
    since = start

    def close(now):
        nonlocal since
        if now > since:
            busy_segments.append((since, now, busy))
            cap_segments.append((since, now, capacity))
            since = now

    def check(now):
        w.integrate(now)
        close(now)
        assert w.worker_time == brute_integral(cap_segments, start, now)
        for b in w.live(now):
            lo, hi = b.epoch * span, (b.epoch + 1) * span
            assert b.busy_time == brute_integral(busy_segments, lo, hi), (b.epoch, lo, hi)
            assert b.capacity_time == brute_integral(cap_segments, lo, hi)
        first = now // span - n + 1
        assert sum(b.busy_time for b in w.live(now)) == brute_integral(busy_segments, first * span, now)
        assert sum(b.capacity_time for b in w.live(now)) == brute_integral(cap_segments, first * span, now)
        assert all(b.epoch >= first for b in w.live(now))
        used = [b.epoch for b in w.live(now) if b.epoch >= 0]
        assert len(set(used)) == len(used)
        # Slices never used (epoch -1, counted as live before time (n - 1) * span) are empty.
        assert all(b.busy_time == b.capacity_time == b.dispatched == 0
                   for b in w.live(now) if b.epoch < 0)

    for dt, what, value in changes:
        t += dt
        if what == "busy":
            w.integrate(t)
            close(t)
            busy = value
            w.busy = value
        elif what == "capacity":
            w.integrate(t)
            close(t)
            capacity = value
            w.capacity = value
        elif what == "bucket":
            w.bucket(t).dispatched += 1   # the engine touches the current bucket on dispatch
        else:
            check(t)
    check(t)
    check(t + span * n + 1)   # everything ages out of the window but the last slice
