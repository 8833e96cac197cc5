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
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from rich import box
from rich.console import Console, RenderableType
from rich.layout import Layout
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .._proto import cronoq_pb2 as pb
from ..errors import AccessDenied, SchedulerError
from .commands import split_list
from .exits import CliError, ExitCode
from .output import Output, STATUS_NAMES, age, escape
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
        return ExitCode.OK

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
                async for event in self.conn.watch(self.pools, terminal_only=False):
                    backoff = 0.2
                    self.events.events.appendleft(event)
                    self._dirty.set()
                reason = "the stream ended"
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
        workers_pane = self._workers(workers, middle_height - 2, now)
        schedules_pane = self._schedules(schedules, middle_height - 2, now)
        # Each side gets room in proportion to what it would fill, not half each:
        # a schedule's cron expression and time zone need more than a worker's row.
        middle.split_row(Layout(workers_pane, name="workers", ratio=self._natural_width(workers_pane)),
                         Layout(Text(" "), name="gutter", size=2),
                         Layout(schedules_pane, name="schedules", ratio=self._natural_width(schedules_pane)))
        bottom = Layout(name="bottom")
        if width >= 160:
            bottom.split_row(Layout(self._tasks(rest - 2, now), name="tasks"),
                             Layout(self._events(rest - 2), name="events"))
        else:
            tasks_height = rest // 2
            bottom.split_column(Layout(self._tasks(tasks_height - 3, now), name="tasks", size=tasks_height),
                                Layout(self._events(rest - tasks_height - 2), name="events"))
        layout.split_column(Layout(self._header(now), name="header", size=1),
                            Layout(self._pools(pools, pools_height - 2), name="pools", size=pools_height + 1),
                            Layout(middle, size=middle_height + 1),
                            bottom)
        return layout

    def _natural_width(self, renderable: RenderableType) -> int:
        return max(10, Measurement.get(self.console, self.console.options, renderable).maximum)

    def _header(self, now: float) -> Text:
        text = Text()
        text.append("cronoq top", style="bold")
        # The keys come first, so that a narrow terminal, which cuts the line, still shows them.
        text.append("  q quit  r refresh" if self.keys else "  Ctrl-C quits", style="dim")
        text.append(f"  {escape(self.conn.settings.url)}  {time.strftime('%H:%M:%S', time.gmtime(now))} UTC")
        snap = self.snapshot.data
        if snap is not None:
            text.append(f"  live {snap.live_tasks}  running {snap.running}  pending {snap.pending}  "
                        f"workers {snap.workers_connected}")
        if self.refreshed_at is None:
            text.append("  loading…", style="dim")
        return text

    @staticmethod
    def _table(title: str, columns: Sequence[tuple[str, str]], *, stretch_last: bool = False) -> Table:
        """A pane's table; with ``stretch_last`` the last column takes the width left over."""
        table = Table(title=_title(title), title_justify="left", box=None, pad_edge=False, show_edge=False,
                      expand=stretch_last, header_style="bold", padding=(0, 2, 0, 0))
        for i, (name, justify) in enumerate(columns):
            table.add_column(name, justify="right" if justify == "r" else "left", no_wrap=True,
                             overflow="ellipsis", ratio=1 if stretch_last and i == len(columns) - 1 else None)
        return table

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
    def _fit(table: Table, rows: Sequence[Sequence[Text | str]], room: int) -> Table:
        """Add as many rows as fit in ``room`` lines; the last says how many did not."""
        room = max(1, room)
        shown = rows if len(rows) <= room else rows[:room - 1]
        for row in shown:
            table.add_row(*row)
        if len(shown) < len(rows):
            table.add_row(Text(f"… {len(rows) - len(shown)} more", style="dim"))
        return table

    def _pools(self, pools: Iterable[pb.PoolSnapshot], room: int) -> RenderableType:
        problem = self._problem("Pools", self.snapshot)
        if problem is not None:
            return problem
        table = self._table("Pools", [("POOL", "l"), ("CAPACITY", "r"), ("BUSY", "r"), ("PENDING", "r"),
                                      ("WAIT P50", "r"), ("WAIT P90", "r"), ("UTIL", "r"), ("SUCCEEDED", "r"),
                                      ("FAILED", "r"), ("WORKERS", "r")])
        rows = [(_cell(p.name), str(p.capacity), str(p.busy), str(p.pending), _seconds(p.wait_p50_s),
                 _seconds(p.wait_p90_s), f"{p.utilization * 100:.0f}%", str(p.succeeded),
                 Text(str(p.failed), style="red" if p.failed else ""), str(p.workers_connected)) for p in pools]
        return self._fit(table, rows, room)

    def _workers(self, workers: Sequence[pb.WorkerInfo], room: int, now: float) -> RenderableType:
        problem = self._problem("Workers", self.workers)
        if problem is not None:
            return problem
        table = self._table(f"Workers ({len(workers)})", [("NAME", "l"), ("POOL", "l"), ("BUSY", "r"),
                                                           ("LABELS", "l"), ("CONNECTED", "r")])
        rows = [(_worker_name(w), _cell(w.pool), f"{w.busy}/{w.slots}",
                 _cell(",".join(f"{k}={v}" for k, v in sorted(w.labels.items())) or "-"),
                 age(now - w.connected_unix_ns / 1e9) + " ago") for w in workers]
        return self._fit(table, rows, room)

    def _schedules(self, schedules: Sequence[pb.RecurringInfo], room: int, now: float) -> RenderableType:
        problem = self._problem("Schedules", self.schedules)
        if problem is not None:
            return problem
        table = self._table(f"Schedules ({len(schedules)})", [("NAME", "l"), ("CRON", "l"), ("POOL", "l"),
                                                               ("NEXT", "r")])
        rows = [(_cell(s.name), _cell(s.cron + (f" {s.tz}" if s.tz else "")), _cell(s.pool),
                 "in " + age(s.next_unix_ns / 1e9 - now) if s.HasField("next_unix_ns") else "-")
                for s in schedules]
        return self._fit(table, rows, room)

    def _tasks(self, room: int, now: float) -> RenderableType:
        pools = f" in {', '.join(self.pools)}" if self.pools else ""
        problem = self._problem(f"Live tasks{pools}", self.tasks)
        if problem is not None:
            return problem
        tasks: list[pb.TaskInfo] = self.tasks.data
        more = "+" if len(tasks) >= self.task_limit > 0 else ""
        table = self._table(f"Live tasks{pools} ({len(tasks)}{more}, running first)",
                            [("ID", "r"), ("STATUS", "l"), ("POOL", "l"), ("KEY", "l"), ("ATTEMPT", "r"),
                             ("FOR", "r"), ("MESSAGE", "l")], stretch_last=True)
        rows: list[tuple[str | Text, ...]] = []
        for t in tasks:
            status = STATUS_NAMES.get(t.status, "?")
            since = t.started_unix_ns if t.status == pb.TASK_STATUS_RUNNING and t.HasField("started_unix_ns") \
                else t.created_unix_ns if t.HasField("created_unix_ns") else None
            rows.append((str(t.id), Text(status, style=_STATUS_STYLE.get(status, "")), _cell(t.pool),
                         _cell(t.key or "-"), str(t.attempt), age(now - since / 1e9) if since else "-",
                         _cell(t.message)))
        return self._fit(table, rows, room)

    def _events(self, room: int) -> RenderableType:
        pools = f" in {', '.join(self.pools)}" if self.pools else ""
        title = f"Recent events{pools}"
        if self.events.error is not None and not self.events.events:
            return self._problem(title, self.events) or Text("")
        if self.events.error is not None:
            title += f"  [{self.events.error}]"
        table = self._table(title, [("TIME", "l"), ("ID", "r"), ("POOL", "l"), ("STATUS", "l"), ("KEY", "l"),
                                    ("MESSAGE", "l")], stretch_last=True)
        rows: list[tuple[str | Text, ...]] = []
        for e in list(self.events.events)[:max(1, room)]:
            status = STATUS_NAMES.get(e.status, "?")
            rows.append((time.strftime("%H:%M:%S", time.gmtime(e.at_unix_ns // 1_000_000_000)), str(e.id),
                         _cell(e.pool), Text(status, style=_STATUS_STYLE.get(status, "")), _cell(e.key or "-"),
                         _cell(e.message)))
        if not rows:
            rows.append(("", "", "", Text("waiting for events…" if self.events.state == "live" else
                                          self.events.state + "…", style="dim"), "", ""))
        return self._fit(table, rows, room)


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
