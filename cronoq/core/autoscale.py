"""The queue-pressure autoscaler of one pool.

Every ``interval`` the pool computes::

    base     = ceil(rate * S / target_utilization)     (0 when rate < 0.01)
    drain    = ceil(sum(B) * S / drain_time)
    slo      = max over classes c with backlog and an SLO of ceil(B<=c * S / slo[c])
    desired  = clamp(max(base + drain, slo, busy) + reserved, min, max)

where ``rate`` is the EWMA (alpha 0.3) of tasks becoming ready per second, S
the EWMA of run times, B the backlog per class and ``reserved`` the peak of
concurrent reservations in the next ``reservation_horizon``. The target then
moves up at once by at most max(ceil(current * ratio), abs) per evaluation,
and down only to the highest desired value of the stabilization window, by
``max_step_down`` per cooldown.
"""

from __future__ import annotations

import math
from collections import deque

from .types import NS, AutoscaleConfig

__all__ = ["Autoscaler", "ALPHA"]

ALPHA = 0.3
_RATE_FLOOR = 0.01


class Autoscaler:
    __slots__ = ("config", "interval", "min", "max", "rate", "service", "arrivals", "history",
                 "last_down", "last_tick", "target", "armed", "raw")

    def __init__(self, config: AutoscaleConfig, min_workers: int, max_workers: int, initial: int,
                 default_duration_ns: int) -> None:
        self.config = config
        self.interval = max(1, int(config.interval * NS))
        self.min = min_workers
        self.max = max_workers
        self.rate = 0.0                       # tasks per second
        self.service = default_duration_ns / NS   # seconds
        self.arrivals = 0                     # since the last evaluation
        self.history: deque[tuple[int, int]] = deque()         # (time, desired) inside the window
        self.last_down: int | None = None
        self.last_tick: int | None = None
        self.target = initial
        self.armed: int | None = None         # time of the pending evaluation
        self.raw = initial                    # the last undamped desired value

    def observe_run(self, run_ns: int) -> None:
        self.service = ALPHA * (run_ns / NS) + (1 - ALPHA) * self.service

    def evaluate(self, now: int, backlog: list[int], busy: int, reserved: int) -> int:
        """Update the rate, compute desired and apply the damping; returns the new target."""
        cfg = self.config
        if self.last_tick is None:
            elapsed_ticks = 1
        else:
            elapsed_ticks = max(1, (now - self.last_tick) // self.interval)
        sample = self.arrivals / (self.interval / NS)
        # Intervals skipped while idle had no arrivals: decay for each of them.
        self.rate = (1 - ALPHA) ** (elapsed_ticks - 1) * self.rate
        self.rate = ALPHA * sample + (1 - ALPHA) * self.rate
        self.arrivals = 0
        self.last_tick = now

        service = self.service
        base = 0 if self.rate < _RATE_FLOOR else math.ceil(self.rate * service / cfg.target_utilization)
        total = sum(backlog)
        drain = math.ceil(total * service / cfg.drain_time)
        slo_need = 0
        above = 0
        for c in range(4):
            above += backlog[c]
            limit = cfg.slo[c]
            if limit is not None and backlog[c]:
                slo_need = max(slo_need, math.ceil(above * service / limit))
        raw = max(base + drain, slo_need, busy) + reserved
        raw = min(max(raw, self.min), self.max)
        self.raw = raw

        window = int(cfg.stabilization_window * NS)
        history = self.history
        history.append((now, raw))
        while history and history[0][0] < now - window:
            history.popleft()
        window_max = max(d for _, d in history)

        current = self.target
        if raw > current:
            step = max(math.ceil(current * cfg.max_step_up_ratio), cfg.max_step_up_abs)
            target = min(raw, current + step)
        elif window_max < current and (
                self.last_down is None or now - self.last_down >= int(cfg.cooldown * NS)):
            target = max(window_max, current - cfg.max_step_down)
            self.last_down = now
        else:
            target = current
        self.target = target
        return target

    def settled(self, pending: int, busy: int, reserved: int) -> bool:
        """Nothing can change until something arrives: stop evaluating.

        Without work, the rate only decays, so desired can only fall; once it
        and the target sit at the floor (min, or 0 once the rate is below
        0.01), further evaluations are no-ops.
        """
        if pending or busy or reserved or self.target != self.raw:
            return False
        floor = self.min if self.min or self.rate < _RATE_FLOOR else None
        return floor is not None and self.target == floor and all(d == floor for _, d in self.history)
