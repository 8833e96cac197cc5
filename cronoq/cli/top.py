"""``cronoq top``: a full-screen live view of a cronoq-server, on Rich's ``Live``.

Four concurrent loops share one asyncio loop: the refresher (Snapshot,
ListWorkers, ListRecurring and two ListTasks pages every ``--interval``, or
at once after ``r``), the event follower (a Watch stream that reconnects
with backoff), the key reader (``q``, ``r``; stdin in cbreak mode) and the
painter, which redraws when something changed, at most ten times a second.
The view only ever holds what it shows: at most ``--tasks`` tasks and the
last 200 events, so its cost does not grow with the server's live tasks.

Every pane keeps its own error: a role the token lacks says which role the
pane needs; a standby or restarting server shows the error and the next
refresh recovers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, NamedTuple, Sequence, TypeVar

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.layout import Layout
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .._proto import cronoq_pb2 as pb
from ..errors import AccessDenied, SchedulerError, UnknownPool
from .commands import split_list
from .exits import CliError, ExitCode
from .output import Output, STATUS_NAMES, age, attempt_text, escape, window_text
from .remote import Connection

__all__ = ["run_top", "TopView", "EVENTS_KEPT", "pause_after_frame"]

T = TypeVar("T")
EVENTS_KEPT = 200
_WAITING = [pb.TASK_STATUS_RETRYING, pb.TASK_STATUS_READY, pb.TASK_STATUS_SCHEDULED, pb.TASK_STATUS_BLOCKED]
_STATUS_STYLE = {"running": "bold green", "succeeded": "green", "failed": "red", "dead_lettered": "bold red",
                 "cancelled": "yellow", "retrying": "yellow", "shed": "magenta", "missed": "magenta",
                 "skipped": "dim"}
_FRAME_SECONDS = 0.1
_DRAWING_SHARE = 1 / 3   # of the loop's time, at most, when frames are slow (a big screen, a slow machine)


async def run_top(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    if not out.out_tty:
        raise CliError(ExitCode.USAGE, "cronoq top needs a terminal; for redirected output use "
                                       "`cronoq snapshot`, `cronoq tasks` or `cronoq watch`")
    view = TopView(conn, pools=split_list(args.pool), interval=args.interval, task_limit=args.tasks)
    return await view.run()


@dataclass
class Pane:
    """What one pane shows: its data, or why it has none."""

    data: Any = None
    error: str | None = None
    loaded: bool = False

    def fail(self, exc: BaseException, role: str) -> None:
        self.error = _explain(exc, role)

    def set(self, data: Any) -> None:
        self.data, self.error, self.loaded = data, None, True


def _explain(exc: BaseException, role: str) -> str:
    if isinstance(exc, AccessDenied):
        if exc.code == "PERMISSION_DENIED":
            return f"needs the {role} role: {exc.message}"
        return f"the token was not accepted ({exc.message}); set $CRONOQ_TOKEN"
    if isinstance(exc, SchedulerError):
        return f"unavailable: {exc} (retrying)"
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time (retrying)"
    return str(exc) or type(exc).__name__


@dataclass
class EventsPane:
    events: collections.deque[pb.StatusEvent] = field(
        default_factory=lambda: collections.deque(maxlen=EVENTS_KEPT))
    state: str = "connecting"
    error: str | None = None
    missing_shards: list[str] = field(default_factory=list)   # what the open stream leaves out


class TopView:
    def __init__(self, conn: Connection, *, pools: list[str], interval: float, task_limit: int,
                 console: Console | None = None) -> None:
        self.conn = conn
        self.pools = pools
        self.interval = interval
        self.task_limit = task_limit
        self.console = console or Console(highlight=False)
        self.snapshot = Pane()
        self.workers = Pane()
        self.schedules = Pane()
        self.tasks = Pane()
        self.events = EventsPane()
        self.refreshed_at: float | None = None
        self.keys = False
        self._dirty = asyncio.Event()
        self._refresh_now = asyncio.Event()
        self._quit = asyncio.Event()
        self.ended_by: BaseException | None = None   # an error that ends top, raised once the screen is restored

    # -- the loops

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        restore = self._read_keys(loop)
        try:
            loop.add_signal_handler(signal.SIGWINCH, self._dirty.set)
        except (NotImplementedError, RuntimeError, AttributeError):
            pass
        workers = [asyncio.create_task(self._refresher()), asyncio.create_task(self._follow_events())]
        try:
            with Live(console=self.console, screen=True, auto_refresh=False, redirect_stdout=False,
                      redirect_stderr=False) as live:
                live.update(self.render(), refresh=True)
                painter = asyncio.create_task(self._painter(live))
                workers.append(painter)
                await self._quit.wait()
        finally:
            pending = set(workers)
            while pending:   # cancel until they are gone: a cancellation can be lost in a race (see _within)
                for task in pending:
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=1.0)
            try:
                loop.remove_signal_handler(signal.SIGWINCH)
            except (NotImplementedError, RuntimeError, AttributeError):
                pass
            restore()
        if self.ended_by is not None:
            raise self.ended_by
        return ExitCode.OK

    def _end(self, exc: BaseException) -> None:
        """End top with ``exc``: an unknown pool (--pool) never becomes known by
        retrying, and ends top as it ends ``cronoq watch`` (exit 3, the same message)."""
        if self.ended_by is None:
            self.ended_by = exc
        self._quit.set()

    def _read_keys(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """cbreak mode on a terminal's stdin: keys arrive one by one, Ctrl-C still interrupts."""
        try:
            import termios
            import tty
            fd = sys.stdin.fileno()
            if not os.isatty(fd):
                return lambda: None
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
        except (ImportError, OSError, ValueError, AttributeError):
            return lambda: None

        def on_input() -> None:
            try:
                data = os.read(fd, 1024)
            except OSError:
                data = b""
            if not data:   # end of input: keys are over, the view goes on
                loop.remove_reader(fd)
                return
            self.key(data.decode("latin-1"))

        loop.add_reader(fd, on_input)
        self.keys = True

        def restore() -> None:
            loop.remove_reader(fd)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

        return restore

    def key(self, keys: str) -> None:
        for char in keys.lower():
            if char == "q":
                self._quit.set()
            elif char == "r":
                self._refresh_now.set()

    async def _painter(self, live: Live) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            began = time.perf_counter()
            live.update(self.render(), refresh=True)
            await asyncio.sleep(pause_after_frame(time.perf_counter() - began))

    async def _refresher(self) -> None:
        while True:
            self._refresh_now.clear()
            await self.refresh()
            try:
                await _within(self._refresh_now.wait(), self.interval)
            except asyncio.TimeoutError:
                pass

    async def refresh(self) -> None:
        """One round of calls; each pane takes its answer or its error."""
        limit = max(5.0, 3 * self.interval)

        async def load(pane: Pane, role: str, call: Callable[[], Awaitable[Any]]) -> None:
            try:
                pane.set(await _within(call(), limit))
            except UnknownPool as exc:
                self._end(exc)
            except Exception as exc:   # whatever a call raises (a channel torn down mid-restart too) is the pane's
                pane.fail(exc, role)   # to show: it must not end the refresher, which retries next round

        await asyncio.gather(
            load(self.snapshot, "metrics", lambda: self.conn.snapshot(retry_for=0)),
            load(self.workers, "metrics", lambda: self.conn.workers([], retry_for=0)),
            load(self.schedules, "metrics", lambda: self.conn.recurring(retry_for=0)),
            load(self.tasks, "client", self._live_tasks))
        self.refreshed_at = time.time()
        self._dirty.set()

    async def _live_tasks(self) -> list[pb.TaskInfo]:
        if self.task_limit == 0:
            return []
        running = await self.conn.list_tasks(self.pools, [pb.TASK_STATUS_RUNNING], 0, self.task_limit,
                                             retry_for=0)
        found = list(running.tasks)
        if len(found) < self.task_limit:
            waiting = await self.conn.list_tasks(self.pools, list(_WAITING), 0, self.task_limit - len(found),
                                                 retry_for=0)
            found.extend(waiting.tasks)
        return found

    def _events_opened(self, missing: list[str]) -> None:
        self.events.missing_shards = missing
        self._dirty.set()

    def missing_shards(self) -> list[str]:
        """The shards a sharded server could not ask, by the last snapshot and the events stream."""
        named = list(self.snapshot.data.unavailable_shards) if self.snapshot.data is not None else []
        return sorted(set(named) | set(self.events.missing_shards))

    async def _follow_events(self) -> None:
        backoff = 0.2
        while True:
            self.events.state = "connecting"
            try:
                # The server sends nothing until the first event: an ordinary call
                # first tells a live stream from one still connecting, and fails
                # the same way (role, pools, availability).
                await _within(self.conn.list_tasks(self.pools, [], 0, 1, retry_for=0), max(5.0, self.interval))
                self.events.state, self.events.error = "live", None
                self._dirty.set()
                # The stream starts with the latest events the leader kept, so the pane
                # does not start empty; after a reconnection, those it shows already are skipped.
                shown = {_event_key(e) for e in self.events.events}
                async for event in self.conn.watch(self.pools, terminal_only=False, recent=EVENTS_KEPT,
                                                   opened=self._events_opened):
                    backoff = 0.2
                    if shown and _event_key(event) in shown:
                        continue
                    self.events.events.appendleft(event)
                    self._dirty.set()
                reason = "the stream ended"
            except UnknownPool as exc:
                self._end(exc)
                return
            except AccessDenied as exc:
                self.events.state, self.events.error = "denied", _explain(exc, "client")
                self._dirty.set()
                await asyncio.sleep(10)   # a token's role does not change; a restarted server may differ
                continue
            except Exception as exc:   # as in refresh(): shown, then retried, never the end of the stream
                reason = _explain(exc, "client")
            self.events.state = "reconnecting"
            self.events.error = f"{reason}; reconnecting in {backoff:.1f} s"
            self._dirty.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    # -- drawing

    def render(self) -> Layout:
        width, height = self.console.size
        now = time.time()
        layout = Layout(name="top")
        pools = self.snapshot.data.pools if self.snapshot.data is not None else []
        workers = self.workers.data.workers if self.workers.data is not None else []
        schedules = self.schedules.data.schedules if self.schedules.data is not None else []
        pools_height = min(2 + max(1, len(pools)), max(3, height // 4))
        middle_height = min(2 + max(1, len(workers), len(schedules)), max(3, height // 4))
        rest = max(4, height - 1 - (pools_height + 1) - (middle_height + 1))
        middle = Layout(name="middle", size=middle_height)
        workers_width, schedules_width = self._split_middle(workers, schedules, now, width - _GUTTER)
        middle.split_row(
            Layout(self._workers(workers, middle_height - 2, now, workers_width), name="workers", size=workers_width),
            Layout(Text(" "), name="gutter", size=_GUTTER),
            Layout(self._schedules(schedules, middle_height - 2, now, schedules_width), name="schedules"))
        bottom = Layout(name="bottom")
        if width >= 160:
            left = (width - _GUTTER) // 2
            bottom.split_row(Layout(self._tasks(rest - 2, now, left), name="tasks", size=left),
                             Layout(Text(" "), name="gutter", size=_GUTTER),
                             Layout(self._events(rest - 2, width - _GUTTER - left), name="events"))
        else:
            tasks_height = rest // 2
            bottom.split_column(Layout(self._tasks(tasks_height - 3, now, width), name="tasks", size=tasks_height),
                                Layout(self._events(rest - tasks_height - 2, width), name="events"))
        layout.split_column(Layout(self._header(now, width), name="header", size=1),
                            Layout(self._pools(pools, pools_height - 2, width), name="pools", size=pools_height + 1),
                            Layout(middle, size=middle_height + 1),
                            bottom)
        return layout

    def _split_middle(self, workers: Sequence[pb.WorkerInfo], schedules: Sequence[pb.RecurringInfo], now: float,
                      room: int) -> tuple[int, int]:
        """The widths of the workers and the schedules panes. Each side gets
        room in proportion to what it would fill, not half each (a schedule's
        cron expression and time zone need more than a worker's row); when
        both do not fit, a side that needs less than half keeps all it needs."""
        wanted = [max(10, self._natural(self._workers(workers, len(workers) + 1, now, None))),
                  max(10, self._natural(self._schedules(schedules, len(schedules) + 1, now, None)))]
        if sum(wanted) > room and min(wanted) <= room // 2:
            small = wanted.index(min(wanted))
            sizes = [0, 0]
            sizes[small] = wanted[small]
            sizes[1 - small] = room - wanted[small]
            return sizes[0], sizes[1]
        left = max(1, min(room - 1, round(room * wanted[0] / sum(wanted))))
        return left, room - left

    def _natural(self, renderable: RenderableType) -> int:
        return Measurement.get(self.console, self.console.options, renderable).maximum

    def _header(self, now: float, width: int) -> Text:
        """One line; what does not fit is left out, least needed first: the
        address, then the clock (the keys and the counts stay)."""
        snap = self.snapshot.data
        parts: list[tuple[int, str, str]] = [   # (rank: the highest goes first, text, style)
            (0, "cronoq top", "bold"),
            (0, "  q quit  r refresh" if self.keys else "  Ctrl-C quits", "dim"),
            (3, f"  {escape(self.conn.settings.url)}", ""),
            (2, f"  {time.strftime('%H:%M:%S', time.gmtime(now))} UTC", "")]
        missing = self.missing_shards()
        if missing:   # (before the counts, which leave those shards out: the counts go first)
            parts.append((1, f"  unavailable: shard{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                          "bold red"))
        if snap is not None:
            parts.append((1, f"  live {snap.live_tasks}  running {snap.running}  pending {snap.pending}  "
                             f"workers {snap.workers_connected}", ""))
        if self.refreshed_at is None:
            parts.append((1, "  loading…", "dim"))
        while len(parts) > 2 and sum(cell_len(text) for _, text, _ in parts) > width:
            parts.remove(max(reversed(parts), key=lambda part: part[0]))
        text = Text(no_wrap=True, overflow="crop")
        for _, part, style in parts:
            text.append(part, style=style)
        return text

    @staticmethod
    def _problem(title: str, pane: Pane | EventsPane) -> RenderableType | None:
        if pane.error is None and (not isinstance(pane, Pane) or pane.loaded):
            return None
        table = Table(title=_title(title), title_justify="left", box=None, show_header=False, show_edge=False,
                      expand=True, pad_edge=False)
        table.add_column(overflow="fold")
        table.add_row(Text(escape(pane.error), style="yellow") if pane.error else Text("loading…", style="dim"))
        return table

    @staticmethod
    def _pane(title: Sequence[str], columns: Sequence[Column], rows: Sequence[Sequence[Text | str]], room: int,
              width: int | None, *, stretch: bool = False) -> RenderableType:
        """A pane: its title, then the columns that fit in ``width`` (None:
        all of them), and as many rows as fit in ``room`` lines; the last line
        says how many did not. ``title``: its first part, then notes that are
        left out when the width is short."""
        room = max(1, room)
        shown = rows if len(rows) <= room else rows[:room - 1]
        chosen = choose_columns(columns, shown, width, stretch=stretch)
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, _GAP, 0, 0))
        for index, column_width in chosen:
            column = columns[index]
            table.add_column(column.header, justify="right" if column.justify == "r" else "left", no_wrap=True,
                             overflow="ellipsis", width=column_width)
        for row in shown:
            table.add_row(*(row[index] for index, _ in chosen))
        heading = _title(title[0])
        for note in title[1:]:
            if width is None or heading.cell_len + cell_len(note) <= width:
                heading.append(note, style="dim")
        parts: list[RenderableType] = [heading, table]
        if len(shown) < len(rows):
            parts.append(Text(f"… {len(rows) - len(shown)} more", style="dim"))
        return Group(*parts)

    def _pools(self, pools: Iterable[pb.PoolSnapshot], room: int, width: int) -> RenderableType:
        problem = self._problem("Pools", self.snapshot)
        if problem is not None:
            return problem
        window = window_text(self.snapshot.data.metrics_window_s)
        rows = [(_cell(p.name), str(p.capacity), str(p.desired), str(p.busy), str(p.pending), _seconds(p.wait_p50_s),
                 _seconds(p.wait_p90_s), f"{p.utilization * 100:.0f}%", str(p.succeeded),
                 Text(str(p.failed), style="red" if p.failed else ""), str(p.workers_connected)) for p in pools]
        # The window's counts are attempts (a retried task counts once per attempt), unlike the totals.
        return self._pane(("Pools", f"  SUCCEEDED, FAILED: attempts in {window}", "; waits, UTIL: the same"),
                          _POOL_COLUMNS, rows, room, width)

    def _workers(self, workers: Sequence[pb.WorkerInfo], room: int, now: float, width: int | None
                 ) -> RenderableType:
        problem = self._problem("Workers", self.workers)
        if problem is not None:
            return problem
        rows = [(_worker_name(w), _cell(w.pool), f"{w.busy}/{w.slots}",
                 _cell(",".join(f"{k}={v}" for k, v in sorted(w.labels.items())) or "-"),
                 age(now - w.connected_unix_ns / 1e9) + " ago") for w in workers]
        return self._pane((f"Workers ({len(workers)})",), _WORKER_COLUMNS, rows, room, width)

    def _schedules(self, schedules: Sequence[pb.RecurringInfo], room: int, now: float, width: int | None
                   ) -> RenderableType:
        problem = self._problem("Schedules", self.schedules)
        if problem is not None:
            return problem
        rows = [(_cell(s.name), _cell(s.cron + (f" {s.tz}" if s.tz else "")), _cell(s.pool),
                 "in " + age(s.next_unix_ns / 1e9 - now) if s.HasField("next_unix_ns") else "-")
                for s in schedules]
        return self._pane((f"Schedules ({len(schedules)})",), _SCHEDULE_COLUMNS, rows, room, width)

    def _tasks(self, room: int, now: float, width: int) -> RenderableType:
        pools = f" in {', '.join(self.pools)}" if self.pools else ""
        problem = self._problem(f"Live tasks{pools}", self.tasks)
        if problem is not None:
            return problem
        tasks: list[pb.TaskInfo] = self.tasks.data
        more = "+" if len(tasks) >= self.task_limit > 0 else ""
        rows: list[tuple[str | Text, ...]] = []
        for t in tasks:
            status = STATUS_NAMES.get(t.status, "?")
            since = t.started_unix_ns if t.status == pb.TASK_STATUS_RUNNING and t.HasField("started_unix_ns") \
                else t.created_unix_ns if t.HasField("created_unix_ns") else None
            rows.append((str(t.id), Text(status, style=_STATUS_STYLE.get(status, "")), _cell(t.pool),
                         _cell(t.key or "-"), attempt_text(t.attempt, t.max_attempts),
                         age(now - since / 1e9) if since else "-", _cell(t.message)))
        return self._pane((f"Live tasks{pools} ({len(tasks)}{more}, running first)",), _TASK_COLUMNS, rows, room,
                          width, stretch=True)

    def _events(self, room: int, width: int) -> RenderableType:
        pools = f" in {', '.join(self.pools)}" if self.pools else ""
        title = f"Recent events{pools}"
        if self.events.error is not None and not self.events.events:
            return self._problem(title, self.events) or Text("")
        notes = [f"  [{self.events.error}]"] if self.events.error is not None else []
        rows: list[tuple[str | Text, ...]] = []
        for e in list(self.events.events)[:max(1, room)]:
            status = STATUS_NAMES.get(e.status, "?")
            rows.append((time.strftime("%H:%M:%S", time.gmtime(e.at_unix_ns // 1_000_000_000)), str(e.id),
                         _cell(e.pool), Text(status, style=_STATUS_STYLE.get(status, "")),
                         attempt_text(e.attempt, e.max_attempts), _cell(e.key or "-"), _cell(e.message)))
        if not rows:
            waiting = "waiting for events…" if self.events.state == "live" else self.events.state + "…"
            rows.append(("", "", "", Text(waiting, style="dim"), "", "", ""))
        return self._pane((title, *notes), _EVENT_COLUMNS, rows, room, width, stretch=True)


class Column(NamedTuple):
    """A column of a pane. When the width is short, the columns of the highest
    ``rank`` go first; a column with ``shrink_to`` may be cut (with an
    ellipsis) down to that width, any other is shown whole or not at all."""

    header: str
    justify: str = "l"
    rank: int = 0
    shrink_to: int = 0


_GAP = 2      # cells between two columns
_GUTTER = 2   # cells between two panes side by side
_POOL_COLUMNS = (Column("POOL"), Column("CAPACITY", "r", 3), Column("DESIRED", "r", 6), Column("BUSY", "r", 2),
                 Column("PENDING", "r", 1), Column("WAIT P50", "r", 7), Column("WAIT P90", "r", 9),
                 Column("UTIL", "r", 8), Column("SUCCEEDED", "r", 5), Column("FAILED", "r", 4),
                 Column("WORKERS", "r", 10))
_WORKER_COLUMNS = (Column("NAME"), Column("POOL", rank=2), Column("BUSY", "r", 1),
                   Column("LABELS", rank=3, shrink_to=8), Column("CONNECTED", "r", 4))
_SCHEDULE_COLUMNS = (Column("NAME"), Column("CRON", rank=2), Column("POOL", rank=3), Column("NEXT", "r", 1))
_TASK_COLUMNS = (Column("ID", "r"), Column("STATUS", rank=1), Column("POOL", rank=2),
                 Column("KEY", rank=3, shrink_to=8), Column("ATTEMPT", "r", 4), Column("FOR", "r", 5),
                 Column("MESSAGE", rank=6, shrink_to=10))
_EVENT_COLUMNS = (Column("TIME", rank=2), Column("ID", "r"), Column("POOL", rank=3), Column("STATUS", rank=1),
                  Column("ATTEMPT", "r", 5), Column("KEY", rank=4, shrink_to=8),
                  Column("MESSAGE", rank=6, shrink_to=10))


def choose_columns(columns: Sequence[Column], rows: Sequence[Sequence[Text | str]], width: int | None, *,
                   stretch: bool = False) -> list[tuple[int, int]]:
    """(index, width) of the columns shown in ``width`` cells (None: all, at
    their natural width). A header is never cut; with ``stretch``, the last
    column shown takes the cells left over."""
    natural = [max([cell_len(column.header), *(_cells(row[i]) for row in rows)])
               for i, column in enumerate(columns)]

    def least(i: int) -> int:
        column = columns[i]
        return min(natural[i], max(column.shrink_to, cell_len(column.header))) if column.shrink_to else natural[i]

    kept = list(range(len(columns)))
    if width is None:
        return [(i, natural[i]) for i in kept]

    def needed(indexes: list[int]) -> int:
        return sum(least(i) for i in indexes) + _GAP * (len(indexes) - 1)

    while len(kept) > 1 and needed(kept) > width:
        kept.remove(max(reversed(kept), key=lambda i: columns[i].rank))
    widths = {i: least(i) for i in kept}
    spare = width - needed(kept)
    for i in sorted(kept, key=lambda i: columns[i].rank):   # cut columns get their cells back, most needed first
        grow = max(0, min(spare, natural[i] - widths[i]))
        widths[i] += grow
        spare -= grow
    if stretch and spare > 0:
        widths[kept[-1]] += spare
    if len(kept) == 1:
        widths[kept[0]] = min(widths[kept[0]], width)
    return [(i, widths[i]) for i in kept]


def _cells(cell: Text | str) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def pause_after_frame(drawing_seconds: float) -> float:
    """How long the painter waits before the next frame: at most ten frames a
    second, and drawing (which holds the loop) takes at most a third of the
    time, so that keys, the refresher and the event stream keep their share."""
    return max(_FRAME_SECONDS, drawing_seconds * (1 - _DRAWING_SHARE) / _DRAWING_SHARE)


async def _within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``'s result, or asyncio.TimeoutError after ``seconds``. Not
    asyncio.wait_for: on Python 3.11 it loses a cancellation that arrives as
    the awaitable completes (the task then never ends: ``r`` then ``q`` did that)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()


def _event_key(e: pb.StatusEvent) -> tuple[int, int, int, int, str]:
    return (e.id, e.status, e.attempt, e.at_unix_ns, e.stage)


def _title(title: str) -> Text:
    return Text(escape(title), style="bold cyan")


def _cell(value: str) -> Text:
    """Text from the server, never markup, never a control character."""
    return Text(escape(value))


def _worker_name(w: pb.WorkerInfo) -> Text:
    name = _cell(w.name or f"#{w.id}")
    if w.health == pb.WORKER_HEALTH_SUSPECT:   # silent while a lease expired: it gets no new leases
        name.append(" suspect", style="red")
    return name


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f}ms"
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"
