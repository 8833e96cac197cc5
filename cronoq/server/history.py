"""The serving leader's recent history of its pools (``[history]``).

Once per ``interval_s`` the leader takes the engine's snapshot (the one the
event stream's snapshots come from) and appends one sample per pool to a
ring that keeps ``kept_s`` of them: the pool's capacity, desired, busy, held
and pending (and pending by class), its throughput (tasks succeeded per
second) and failure rate (attempts failed per second), counted from the
status events between two samples, its waits p50 and p99 over the metrics
window (overall and by class), and its cost. Each series is an ``array('d')``
of fixed size, allocated once: ``BYTES_PER_SAMPLE`` bytes per sample per
pool. ``GET /v1/history`` and ``Admin.History`` read it, downsampled to at
most ``points`` points per series by fixed buckets of samples (``downsample``).

A server that becomes the leader starts an empty history: nothing is stored,
nothing is handed over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .._proto import cronoq_pb2 as pb
from ..core.types import CLASSES
from .config import HistorySection, PoolSection

if TYPE_CHECKING:
    from ..core.snapshot import Snapshot
    from ..runtime.scheduler import Scheduler

__all__ = ["History", "PoolRing", "SERIES", "BYTES_PER_SAMPLE", "DEFAULT_POINTS", "MAX_POINTS", "downsample",
           "buckets"]

log = logging.getLogger("cronoq.server")

DEFAULT_POINTS = 720
MAX_POINTS = 100_000

# Every series of a sample, in the order a sample holds them, and how a bucket of samples
# becomes one point: "mean", "max" (a peak must not vanish: busy, held, pending) or
# "last" (cost accumulates since start).
SERIES: tuple[tuple[str, str], ...] = (
    ("capacity", "mean"), ("desired", "mean"), ("busy", "max"), ("held", "max"), ("pending", "max"),
    *((f"pending_{c}", "max") for c in CLASSES),
    ("throughput_per_s", "mean"), ("failures_per_s", "mean"),
    ("wait_p50_s", "mean"), ("wait_p99_s", "mean"),
    *((f"wait_p50_s_{c}", "mean") for c in CLASSES),
    *((f"wait_p99_s_{c}", "mean") for c in CLASSES),
    ("cost", "last"),
)
_INDEX = {name: i for i, (name, _) in enumerate(SERIES)}
# A sample: its time (Unix ms, as a double) and every series, 8 bytes each.
BYTES_PER_SAMPLE = 8 * (1 + len(SERIES))

# The statuses that end an attempt in failure (one event per failed attempt).
_FAILED = frozenset(("retrying", "failed", "dead_lettered"))


class PoolRing:
    """One pool's last ``size`` samples: an ``array('d')`` per series, a
    ring; ``seq`` counts every sample appended since the ring began."""

    __slots__ = ("size", "seq", "t", "series")

    def __init__(self, size: int) -> None:
        self.size = size
        self.seq = 0
        self.t = array("d", bytes(8 * size))
        self.series = [array("d", bytes(8 * size)) for _ in SERIES]

    def __len__(self) -> int:
        return min(self.seq, self.size)

    def append(self, t_ms: float, values: Sequence[float]) -> None:
        i = self.seq % self.size
        self.t[i] = t_ms
        for column, value in zip(self.series, values):
            column[i] = value
        self.seq += 1

    def ordered(self, column: array) -> list[float]:   # type: ignore[type-arg]
        """``column``'s kept samples, oldest first."""
        if self.seq <= self.size:
            return column[:self.seq].tolist()
        head = self.seq % self.size
        return column[head:].tolist() + column[:head].tolist()

    def first_seq(self) -> int:
        """The sequence number of the oldest sample kept."""
        return self.seq - len(self)


def buckets(first_seq: int, n: int, points: int) -> list[tuple[int, int]]:
    """How ``n`` consecutive samples (the first numbered ``first_seq``) fall
    into at most ``points`` buckets: (start, end) index pairs. A bucket
    holds ``width`` samples aligned on their sequence numbers, so a point
    stands for the same samples from one request to the next (the first and
    last buckets may be partial)."""
    if n <= 0:
        return []
    if n <= points:
        return [(i, i + 1) for i in range(n)]
    if points == 1:
        return [(0, n)]
    width = math.ceil(n / (points - 1))
    out = []
    start = 0
    while start < n:
        end = min(n, start + width - (first_seq + start) % width)
        out.append((start, end))
        start = end
    return out


def downsample(values: Sequence[float], spans: Iterable[tuple[int, int]], how: str) -> list[float]:
    """One point per bucket of ``values``: their mean, max or last."""
    if how == "max":
        return [max(values[a:b]) for a, b in spans]
    if how == "last":
        return [values[b - 1] for a, b in spans]
    return [math.fsum(values[a:b]) / (b - a) for a, b in spans]


class History:
    """The rings of a leader's pools, the sampler that fills them, and a
    sink of the scheduler's status events that counts successes and failed
    attempts per pool between two samples."""

    def __init__(self, section: HistorySection, pools: Iterable[PoolSection]) -> None:
        self.interval_s = section.interval_s
        self.kept_s = section.kept_s
        self.size = section.samples
        self.minimum = {p.name: p.min for p in pools}
        self.rings = {name: PoolRing(self.size) for name in self.minimum}
        self.counted: dict[str, list[int]] = {name: [0, 0] for name in self.minimum}   # succeeded, failed
        self._last: dict[str, tuple[float, int, int]] = {}   # pool -> (t_ms, succeeded, failed) at its last sample
        self._started_ms = time.time() * 1e3
        self._task: asyncio.Task[None] | None = None

    # -- the scheduler's sink (runs on its loop)

    def deliver(self, event: Any) -> None:
        counts = self.counted.get(event.pool)
        if counts is None or event.stage is not None:
            return
        if event.status == "succeeded":
            counts[0] += 1
        elif event.status in _FAILED:
            counts[1] += 1

    def end(self) -> None:
        pass

    # -- sampling

    def start(self, sched: Scheduler) -> None:
        self._started_ms = time.time() * 1e3
        sched.subscribe(self)
        self._task = asyncio.get_running_loop().create_task(self._run(sched))

    def stop(self, sched: Scheduler | None) -> None:
        if sched is not None:
            sched.unsubscribe(self)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, sched: Scheduler) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.interval_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not sched.running:
                return
            try:
                snap = await sched.snapshot()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # (stopping meanwhile: the next round, or the cancel, decides)
                log.debug("history: no snapshot this round: %s", exc)
                continue
            self.sample(snap)
            now = loop.time()
            if now - due > self.interval_s:   # fell behind (a paused process): no catching up in a burst
                due = now

    def sample(self, snap: Snapshot, t_ms: float | None = None) -> None:
        """Append one sample per pool of ``snap`` (taken at ``t_ms``, default its own time)."""
        at = snap.at * 1e3 if t_ms is None else t_ms
        for pool in snap.pools:
            ring = self.rings.get(pool.name)
            if ring is None:
                continue
            succeeded, failed = self.counted[pool.name]
            last_t, last_ok, last_failed = self._last.get(pool.name, (self._started_ms, 0, 0))
            span = max(1e-3, (at - last_t) / 1e3)
            self._last[pool.name] = (at, succeeded, failed)
            by_class = pool.pending_by_class
            ring.append(at, (
                pool.capacity, max(self.minimum[pool.name], pool.desired), pool.busy, pool.held, pool.pending,
                *(by_class[c] for c in CLASSES),
                (succeeded - last_ok) / span, (failed - last_failed) / span,
                pool.wait_p50, pool.wait_p99, *pool.wait_p50_s_by_class, *pool.wait_p99_s_by_class,
                pool.cost))

    # -- reading

    def pool_history(self, name: str, range_s: float, points: int, now_ms: float) -> pb.PoolHistory:
        """``name``'s samples of the last ``range_s`` seconds (0: all kept), at most ``points`` a series."""
        ring = self.rings[name]
        t = ring.ordered(ring.t)
        skip = 0
        if range_s > 0:
            since = now_ms - range_s * 1e3
            while skip < len(t) and t[skip] < since:
                skip += 1
        spans = buckets(ring.first_seq() + skip, len(t) - skip, points)
        spans = [(a + skip, b + skip) for a, b in spans]
        out = pb.PoolHistory(name=name, t_unix_ms=[int(round(t[b - 1])) for _, b in spans])
        for (series, how), column in zip(SERIES, ring.series):
            values = downsample(ring.ordered(column), spans, how)
            if series.startswith("pending_"):
                getattr(out.pending_by_class, series[len("pending_"):]).extend(values)
            elif series.startswith(("wait_p50_s_", "wait_p99_s_")):
                getattr(getattr(out, series[:len("wait_p50_s")] + "_by_class"),
                        series[len("wait_p50_s_"):]).extend(values)
            else:
                getattr(out, series).extend(values)
        return out

    def answer(self, pools: Iterable[str], range_s: float, points: int) -> pb.HistoryResponse:
        now_ns = time.time_ns()
        response = pb.HistoryResponse(interval_s=self.interval_s, kept_s=self.kept_s, at_unix_ns=now_ns)
        for name in pools:
            if name in self.rings:
                response.pools.append(self.pool_history(name, range_s, points, now_ns / 1e6))
        return response


def history_json(response: pb.HistoryResponse) -> dict[str, Any]:
    """``GET /v1/history``'s answer (answers.HISTORY)."""
    def by_class(series: pb.PoolHistory.ByClass) -> dict[str, list[float]]:
        return {c: list(getattr(series, c)) for c in CLASSES}

    return {
        "interval_s": response.interval_s, "kept_s": response.kept_s, "at_unix_ns": str(response.at_unix_ns),
        "pools": [{
            "name": p.name, "t_unix_ms": list(p.t_unix_ms), "capacity": list(p.capacity),
            "desired": list(p.desired), "busy": list(p.busy), "held": list(p.held), "pending": list(p.pending),
            "pending_by_class": by_class(p.pending_by_class), "throughput_per_s": list(p.throughput_per_s),
            "failures_per_s": list(p.failures_per_s), "wait_p50_s": list(p.wait_p50_s),
            "wait_p99_s": list(p.wait_p99_s), "wait_p50_s_by_class": by_class(p.wait_p50_s_by_class),
            "wait_p99_s_by_class": by_class(p.wait_p99_s_by_class), "cost": list(p.cost),
        } for p in response.pools],
        "unavailable_shards": list(response.unavailable_shards),
    }
