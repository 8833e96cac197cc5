"""Histograms and the sliding metrics window of a pool.

Values are integer nanoseconds. The log-linear histogram keeps eight
sub-buckets per power of two, so a bucket spans 6-12 % of its value (about
9 % on average) and a reported percentile (the bucket's midpoint) is within
about 6 % of the truth. Recording is O(1); reading a percentile sorts the
non-empty buckets, which are few.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["bucket_of", "bucket_mid", "Histogram", "DecayingHistogram", "RunStats", "WindowBucket",
           "PoolWindow"]


def bucket_of(value: int) -> int:
    if value < 16:
        return value if value > 0 else 0
    shift = value.bit_length() - 4
    return (shift << 3) + (value >> shift)


def bucket_mid(index: int) -> float:
    if index < 16:
        return float(index)
    shift = (index >> 3) - 1
    mantissa = (index & 7) + 8
    return ((mantissa << shift) + ((mantissa + 1) << shift)) / 2.0


def percentile_of(counts: Mapping[int, float], total: float, q: float) -> float | None:
    """The q-quantile (0 < q <= 1) of a bucket -> count mapping."""
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return bucket_mid(index)
    return bucket_mid(max(counts))


class Histogram:
    """Counts per bucket, but for bucket 0 (values <= 0), counted in ``zero``:
    the engine's most common wait, an int to add to rather than a dict entry
    (a native counter when compiled)."""

    __slots__ = ("counts", "zero")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.zero = 0

    def record(self, value: int) -> None:
        index = bucket_of(value)
        if not index:
            self.zero += 1
            return
        counts = self.counts
        counts[index] = counts.get(index, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values()) + self.zero

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for index, n in other.counts.items():
            counts[index] = counts.get(index, 0) + n
        self.zero += other.zero

    def percentile(self, q: float) -> float | None:
        counts = {0: self.zero, **self.counts} if self.zero else self.counts
        return percentile_of(counts, self.total, q)


class DecayingHistogram:
    """A histogram that halves its counts every ``half_life`` samples, so its
    percentiles follow a workload that changes (duration learning)."""

    __slots__ = ("counts", "total", "_since_decay", "half_life", "_cache")

    def __init__(self, half_life: int = 512) -> None:
        self.counts: dict[int, float] = {}
        self.total = 0.0
        self._since_decay = 0
        self.half_life = half_life
        self._cache: dict[float, float | None] = {}

    def record(self, value: int) -> None:
        index = bucket_of(value)
        counts = self.counts
        counts[index] = counts.get(index, 0.0) + 1.0
        self.total += 1.0
        n = self._since_decay + 1
        self._since_decay = n
        if n >= self.half_life:
            self._decay()
        if self._cache:
            self._cache = {}

    def _decay(self) -> None:
        self._since_decay = 0
        kept = {}
        for index, n in self.counts.items():
            n *= 0.5
            if n >= 0.01:
                kept[index] = n
        self.counts = kept
        self.total = sum(kept.values())

    def percentile(self, q: float) -> float | None:
        cache = self._cache
        if q in cache:
            return cache[q]
        value = percentile_of(self.counts, self.total, q)
        cache[q] = value
        return value


class RunStats:
    """Run times of one pool's successful attempts, per kind, for duration
    learning. Regular tasks and fixed starts are kept apart, because the hold
    lead must come from regular work only. Pool-wide percentiles merge the
    kinds and are cached for a while: estimates need not move on every run."""

    __slots__ = ("regular", "fixed", "_pool", "_pool_at", "records")

    REFRESH = 64   # records between recomputations of the pool-wide view

    def __init__(self) -> None:
        self.regular: dict[str, DecayingHistogram] = {}
        self.fixed: dict[str, DecayingHistogram] = {}
        self._pool: DecayingHistogram | None = None
        self._pool_at = -1
        self.records = 0

    def record(self, kind: str, value: int, regular: bool) -> None:
        """Add a run (the caller counts ``records``, sampled or not)."""
        table = self.regular if regular else self.fixed
        hist = table.get(kind)
        if hist is None:
            hist = table[kind] = DecayingHistogram()
        hist.record(value)

    def kind_median(self, kind: str) -> float | None:
        for table in (self.regular, self.fixed):
            hist = table.get(kind)
            if hist is not None and hist.total:
                return hist.percentile(0.5)
        return None

    def pool_percentile(self, q: float) -> float | None:
        """A percentile of the pool's regular work (None before any run)."""
        if self._pool is None or self.records - self._pool_at >= self.REFRESH or (
                self._pool_at < self.records and self._pool.total < 16):
            merged = DecayingHistogram()
            for hist in self.regular.values():
                for index, n in hist.counts.items():
                    merged.counts[index] = merged.counts.get(index, 0.0) + n
            merged.total = sum(merged.counts.values())
            self._pool = merged
            self._pool_at = self.records
        return self._pool.percentile(q)


class WindowBucket:
    """Counters of one slice of the metrics window."""

    __slots__ = ("epoch", "dispatched", "succeeded", "failed", "inversions", "fixed_hits",
                 "fixed_total", "busy_time", "capacity_time", "good_time", "attempt_time", "waits")

    def __init__(self) -> None:
        self.epoch = -1
        self.reset(-1)

    def reset(self, epoch: int) -> None:
        self.epoch = epoch
        self.dispatched = 0
        self.succeeded = 0
        self.failed = 0
        self.inversions = 0
        self.fixed_hits = 0
        self.fixed_total = 0
        self.busy_time = 0          # integral of busy slots over time (slot-ns)
        self.capacity_time = 0      # integral of capacity over time (slot-ns)
        self.good_time = 0          # run time of attempts that succeeded
        self.attempt_time = 0       # run time of all attempts that ended
        self.waits = [Histogram() for _ in range(4)]   # by class, in CLASSES order


class PoolWindow:
    """A ring of ``n`` buckets covering the last ``window`` nanoseconds.

    Busy and capacity are integrated exactly: every change first credits the
    time since the previous change to the buckets it spans.
    """

    __slots__ = ("span", "buckets", "current", "current_start", "current_end", "last_t", "busy",
                 "capacity", "worker_time")

    def __init__(self, window_ns: int, n: int, now: int, capacity: int) -> None:
        self.span = max(1, window_ns // n)
        self.buckets = [WindowBucket() for _ in range(n)]
        self.current = self.buckets[0]   # (not current until current_end says so)
        self.current_start = 0
        self.current_end = -1
        self.last_t = now
        self.busy = 0
        self.capacity = capacity
        self.worker_time = 0        # integral of capacity since start (slot-ns)

    def bucket(self, now: int) -> WindowBucket:
        if self.current_start <= now < self.current_end:
            return self.current
        epoch = now // self.span
        bucket = self.buckets[epoch % len(self.buckets)]
        if bucket.epoch != epoch:
            bucket.reset(epoch)
        self.current = bucket
        self.current_start = epoch * self.span
        self.current_end = (epoch + 1) * self.span
        return bucket

    def integrate(self, now: int) -> None:
        """Credit busy and capacity time up to ``now``."""
        last = self.last_t
        if now <= last:
            return
        self.last_t = now
        busy = self.busy
        capacity = self.capacity
        self.worker_time += capacity * (now - last)
        if not busy and not capacity:
            return
        if last >= self.current_start and now <= self.current_end:
            bucket = self.current   # the common case: both ends in the current bucket
            dt = now - last
            bucket.busy_time += busy * dt
            bucket.capacity_time += capacity * dt
            return
        span = self.span
        oldest = (now // span - len(self.buckets) + 1) * span  # start of the oldest live bucket
        if last < oldest:
            last = oldest
        while last < now:
            end = min(now, (last // span + 1) * span)
            bucket = self.bucket(last)
            dt = end - last
            bucket.busy_time += busy * dt
            bucket.capacity_time += capacity * dt
            last = end

    def live(self, now: int) -> list[WindowBucket]:
        """The buckets that belong to the window ending at ``now``."""
        first = now // self.span - len(self.buckets) + 1
        return [b for b in self.buckets if b.epoch >= first]
