"""Cron expressions in IANA time zones, and the state of a recurring schedule.

Expressions have five fields (minute hour day month weekday) or six with
seconds first; names (MON, JAN) and nicknames (@hourly, @daily) work.
Occurrences are computed on the zone's wall clock, then placed on real time:

- a wall time skipped by a spring-forward gap runs at the first instant after
  the gap (several skipped occurrences collapse into that one);
- a wall time repeated by a fall-back runs once, at its first instance.
"""

from __future__ import annotations

import datetime as _dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


from .options import OVERLAP_POLICIES
from .types import NS, TaskSpec

__all__ = ["CronSchedule", "Recurring", "rfc3339", "OVERLAP_POLICIES"]

_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)


def _zone(tz: str) -> _dt.tzinfo:
    if not isinstance(tz, str) or not tz or "\x00" in tz:
        raise ValueError(f"tz must be an IANA time zone name, got {tz!r}")
    if tz.upper() == "UTC":
        return _UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"tz {tz!r} is not a known IANA time zone") from exc


def _seconds(moment: _dt.datetime) -> int:
    delta = moment - _EPOCH
    return delta.days * 86400 + delta.seconds


def rfc3339(ns: int) -> str:
    """Whole-second UTC time, e.g. 2026-03-29T01:00:00Z."""
    return (_EPOCH + _dt.timedelta(seconds=ns // NS)).strftime("%Y-%m-%dT%H:%M:%SZ")


class CronSchedule:
    """Occurrences of one cron expression in one zone."""

    __slots__ = ("expr", "tz", "_zone", "_six")

    def __init__(self, expr: str, tz: str = "UTC") -> None:
        if not isinstance(expr, str) or not expr.strip() or "\x00" in expr:
            raise ValueError(f"cron must be a cron expression, got {expr!r}")
        fields = expr.split()
        if fields[0].startswith("@"):
            if len(fields) != 1:
                raise ValueError(f"cron nickname {expr!r} takes no other fields")
            self._six = False
        elif len(fields) in (5, 6):
            self._six = len(fields) == 6
        else:
            raise ValueError(f"cron must have 5 or 6 fields (6 with seconds first), got {len(fields)} in {expr!r}")
        self.expr = " ".join(fields)
        self.tz = tz
        self._zone = _zone(tz)
        from croniter import croniter   # (loaded with the first schedule: it costs 0.1 s to import)

        try:
            croniter(self.expr, _dt.datetime(2000, 1, 1), second_at_beginning=self._six).get_next(_dt.datetime)
        except Exception as exc:  # croniter raises several types for bad input
            raise ValueError(f"cron {expr!r} is not a valid expression: {exc}") from exc

    def _wall(self, seconds: int) -> _dt.datetime:
        return (_EPOCH + _dt.timedelta(seconds=seconds)).astimezone(self._zone).replace(tzinfo=None)

    def _place(self, wall: _dt.datetime) -> int:
        """The Unix second at which a wall-clock time happens (see module notes)."""
        if self._zone is _UTC:
            return _seconds(wall.replace(tzinfo=_UTC))
        first = _seconds(wall.replace(tzinfo=self._zone, fold=0))
        if self._wall(first) == wall:
            return first  # exists (fold=0 is the first instance of a repeat)
        # Inside a gap: the first instant whose wall time is at or past it.
        lo = _seconds(wall.replace(tzinfo=self._zone, fold=1))
        hi = first
        if lo > hi:
            lo, hi = hi, lo
        while lo < hi:
            mid = (lo + hi) // 2
            if self._wall(mid) >= wall:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def next_after(self, after_ns: int) -> int | None:
        """The first occurrence strictly after ``after_ns`` (Unix ns), or None."""
        after = after_ns // NS
        start = self._wall(after) - _dt.timedelta(seconds=1)
        from croniter import croniter

        it = croniter(self.expr, start, second_at_beginning=self._six)
        for _ in range(10_000):
            try:
                wall = it.get_next(_dt.datetime)
            except Exception:  # no further match (croniter's search limit)
                return None
            moment = self._place(wall)
            if moment > after:
                return moment * NS
        return None


class Recurring:
    """A recurring schedule registered with the engine."""

    __slots__ = ("name", "cron", "template", "overlap", "tolerance_ns", "on_miss", "key",
                 "next_start", "last_task", "last_start", "timer_at")

    def __init__(self, name: str, cron: CronSchedule, template: TaskSpec, overlap: str, tolerance_ns: int,
                 on_miss: str, key: str | None) -> None:
        self.name = name
        self.cron = cron
        self.template = template
        self.overlap = overlap
        self.tolerance_ns = tolerance_ns
        self.on_miss = on_miss
        self.key = key
        self.next_start: int | None = None    # the next occurrence not yet created
        self.last_task: int | None = None     # id of the last occurrence created
        self.last_start: int | None = None    # its start
        self.timer_at: int | None = None
