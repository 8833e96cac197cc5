"""The parts of ``cronoq`` that need no server: terminal escaping, JSON on a
terminal, connection settings and their checks, the exit code of each error,
the proto enum names, the subcommand protocol (plugins), and top's timeouts."""

from __future__ import annotations

import argparse
import asyncio
import io
import sys

import pytest

from cronoq import errors
from cronoq._proto import cronoq_pb2 as pb
from cronoq.cli import ExitCode, main, plugins
from cronoq.cli.app import _command_of
from cronoq.cli.connection import CliError, is_loopback, settings_from
from cronoq.cli.exits import exit_code_for
from cronoq.cli.output import (CLASS_NAMES, HEALTH_NAMES, OVERLAP_NAMES, PRIORITY_NAMES, STATUS_NAMES, Output,
                               columns, escape, escape_bytes)


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


# ---------------------------------------------------------------- what reaches a terminal


def test_escape_shows_control_characters_and_bidi_overrides_as_escapes():
    assert escape("a\x1b[31mb\x07\x00\x7f\x85\u202e\u2066c") == r"a\u{1b}[31mb\u{7}\u{0}\u{7f}\u{85}\u{202e}\u{2066}c"
    assert escape("line\nnext\ttab") == r"line\u{a}next\u{9}tab"
    assert escape("line\nnext\ttab\r", keep_lines=True) == "line\nnext\ttab\\u{d}"
    assert escape("ordinary text, ünïcödé ✓ 😀") == "ordinary text, ünïcödé ✓ 😀"
    assert escape_bytes(b"ok\n\xff\xfe\x1b") == "ok\n\\x{ff}\\x{fe}\\u{1b}"
    assert escape_bytes("é".encode()) == "é"


def test_json_on_a_terminal_escapes_what_json_leaves_literal_and_stays_the_same_document():
    value = {"key": "a\x1b\x7f\x9b\u202eb", "n": 1}
    terminal, pipe = Stream(True), Stream(False)
    Output(terminal, Stream(True)).json(value)
    Output(pipe, Stream(False)).json(value)
    import json
    assert "\x1b" not in terminal.getvalue() and "\x9b" not in terminal.getvalue()
    assert "\u202e" not in terminal.getvalue()
    assert json.loads(terminal.getvalue()) == json.loads(pipe.getvalue()) == value
    assert "\x7f" in pipe.getvalue()   # redirected: as JSON writes it


def test_fields_and_errors_are_escaped_only_on_a_terminal():
    out = Output(Stream(True), Stream(True))
    assert out.field("k\x1b") == r"k\u{1b}"
    out.error("failed: \x1b[2J")
    assert out.stderr.getvalue() == "failed: \\u{1b}[2J\n"
    piped = Output(Stream(False), Stream(False))
    assert piped.field("k\x1b") == "k\x1b"


def test_columns_align_by_terminal_cells():
    assert columns(("A", "B", "C"), [("日本", "x", "last"), ("a", "yy", "")]) == \
        ["A     B   C", "日本  x   last", "a     yy"]


# ---------------------------------------------------------------- connection settings


def settings(*flags: str, **env: str):
    parser = argparse.ArgumentParser()
    from cronoq.cli import add_connection_arguments
    add_connection_arguments(parser)
    return settings_from(parser.parse_args(list(flags)), env)


def test_server_addresses():
    assert settings().target == "127.0.0.1:7070" and not settings().tls
    assert settings("--server", "https://example.com").target == "example.com:7070"
    assert settings("--server", "https://example.com").tls
    assert settings("--server", "http://[::1]:9000/").target == "[::1]:9000"
    assert settings("--server", "localhost:1234").target == "localhost:1234"
    assert settings(CRONOQ_SERVER="http://10.0.0.1:1").target == "10.0.0.1:1"
    assert settings("--server", "127.0.0.1:2", CRONOQ_SERVER="127.0.0.1:1").target == "127.0.0.1:2"
    for bad in ("ftp://x:1", "http://", "http://x:1/path", "http://x:notaport", "http://user:pw@x:1", "x:1?q"):
        with pytest.raises(CliError) as info:
            settings("--server", bad)
        assert info.value.code == ExitCode.USAGE and "http://HOST:PORT" in info.value.message


def test_tls_settings_are_refused_with_plain_http_and_read_from_flags_or_the_environment(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"CA")
    with pytest.raises(CliError, match="--tls-ca given with the plain http:// server"):
        settings("--server", "http://x:1", "--tls-ca", str(ca))
    with pytest.raises(CliError, match=r"\$CRONOQ_TLS_CA given with the plain http://"):
        settings("--server", "http://x:1", CRONOQ_TLS_CA=str(ca))
    with pytest.raises(CliError, match="--tls-cert and --tls-key"):
        settings("--server", "https://x:1", "--tls-cert", str(ca))
    with pytest.raises(CliError, match="cannot read the CA certificate"):
        settings("--server", "https://x:1", "--tls-ca", str(tmp_path / "missing.pem"))
    bare = settings("--server", "x:1", "--tls-ca", str(ca))   # a TLS file makes host:port TLS
    assert bare.tls and bare.ca == b"CA"
    assert settings("--server", "https://x:1", CRONOQ_TLS_CA=str(ca)).ca == b"CA"
    mtls = settings("--server", "https://x:1", "--tls-cert", str(ca), "--tls-key", str(ca))
    assert mtls.cert == b"CA" and mtls.key == b"CA"


def test_the_token_and_the_plain_http_warning():
    assert settings().token is None
    assert settings(CRONOQ_TOKEN="  secret-token\n").token == "secret-token"
    with pytest.raises(CliError, match="printable ASCII"):
        settings(CRONOQ_TOKEN="tök")
    assert settings("--server", "http://10.1.2.3:1", CRONOQ_TOKEN="t").warnings()
    assert not settings("--server", "https://10.1.2.3:1", CRONOQ_TOKEN="t").warnings()
    assert not settings("--server", "http://10.1.2.3:1").warnings()       # no token, nothing to expose
    for host in ("http://127.0.0.1:1", "http://127.8.9.10:1", "http://localhost:1", "http://[::1]:1",
                 "http://api.localhost:1"):
        assert not settings("--server", host, CRONOQ_TOKEN="t").warnings(), host
    assert is_loopback("LOCALHOST") and not is_loopback("example.com") and not is_loopback("0.0.0.0")   # (a non-loopback address)
    with pytest.raises(CliError, match="--retry-for"):
        settings("--retry-for", "-1")


# ---------------------------------------------------------------- exit codes and names


def test_every_error_has_its_exit_code():
    cases = [(errors.AccessDenied("PERMISSION_DENIED", "role"), ExitCode.ACCESS_DENIED),
             (errors.AccessDenied("UNAUTHENTICATED", "token"), ExitCode.ACCESS_DENIED),
             (errors.UnknownTask(3), ExitCode.NOT_FOUND), (errors.UnknownPool("p"), ExitCode.NOT_FOUND),
             (errors.ServerError("NOT_FOUND", "x"), ExitCode.NOT_FOUND), (TimeoutError("t"), ExitCode.TIMEOUT),
             (errors.SchedulerError("not the leader"), ExitCode.UNAVAILABLE),
             (errors.InvalidTask("bad"), ExitCode.ERROR), (errors.QueueFull("full"), ExitCode.ERROR),
             (errors.ServerError("ALREADY_EXISTS", "key"), ExitCode.ERROR),
             (CliError(ExitCode.TASK_FAILED, "failed"), ExitCode.TASK_FAILED)]
    for exc, code in cases:
        assert exit_code_for(exc) == code, exc
    assert sorted({int(code) for code in ExitCode}) == [0, 1, 2, 3, 4, 5, 6, 7, 130]


def test_enum_names_match_the_proto():
    for value, name in STATUS_NAMES.items():
        assert pb.TaskStatus.Name(value) == "TASK_STATUS_" + name.upper()
    for name in CLASS_NAMES:
        assert PRIORITY_NAMES[pb.Priority.Value("PRIORITY_" + name.upper())] == name
    for value, name in OVERLAP_NAMES.items():
        assert value == 0 or pb.Overlap.Name(value) == "OVERLAP_" + name.upper()
    assert set(HEALTH_NAMES) == set(pb.WorkerHealth.values())
    for value, name in HEALTH_NAMES.items():
        assert value == 0 or pb.WorkerHealth.Name(value) == "WORKER_HEALTH_" + name.upper()


def test_the_subcommand_is_found_past_global_options():
    assert _command_of(["--server", "x:1", "-o", "json", "tasks", "--all"]) == "tasks"
    assert _command_of(["--server=x:1", "mcp"]) == "mcp"
    assert _command_of(["--", "simulate"]) == "simulate"
    assert _command_of(["--retry-for", "3"]) is None


# ---------------------------------------------------------------- contributed subcommands


@pytest.fixture
def example_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    sys.modules.pop("cli_plugin_example", None)
    registry = plugins.PLUGINS + (plugins.Plugin("example", "cli_plugin_example", "an example", None),
                                  plugins.Plugin("ghost", "cronoq_ghost_package.cli", "not installed", "ghost"))
    monkeypatch.setattr(plugins, "PLUGINS", registry)
    yield
    sys.modules.pop("cli_plugin_example", None)


def test_a_contributed_subcommand_runs_and_returns_its_exit_code(example_plugin, capsys):
    assert main(["--server", "127.0.0.1:9", "example", "--code", "3"]) == 3
    assert capsys.readouterr().out == "example: code 3, server 127.0.0.1:9\n"
    assert main(["example", "--server", "h:5"]) == 0
    assert "server h:5" in capsys.readouterr().out


def test_contributed_modules_are_imported_only_for_their_own_subcommand(example_plugin, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    listing = capsys.readouterr().out
    assert "example" in listing and "an example" in listing and "ghost" in listing
    assert "cli_plugin_example" not in sys.modules
    assert main(["tasks", "--status", "nonsense"]) == ExitCode.USAGE   # another command: nothing imported
    assert "cli_plugin_example" not in sys.modules


def test_a_missing_subcommand_module_says_which_extra_to_install(example_plugin, capsys):
    assert main(["ghost", "--anything"]) == ExitCode.USAGE
    message = capsys.readouterr().err
    assert "`cronoq ghost` is not available" in message and "pip install 'cronoq[ghost]'" in message
    assert "cronoq_ghost_package" in message


def test_a_module_without_the_protocol_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "PLUGINS", (plugins.Plugin("broken", "json", "no add_parser", None),))
    assert main(["broken"]) == ExitCode.USAGE
    assert "json has no add_parser()" in capsys.readouterr().err


# ---------------------------------------------------------------- top's timeouts


def test_a_cancellation_that_races_with_completion_is_not_lost():
    from cronoq.cli.top import _within

    async def scenario() -> bool:
        event = asyncio.Event()

        async def refresher() -> None:   # the shape of top's refresh loop
            while True:
                try:
                    await _within(event.wait(), 10)
                except asyncio.TimeoutError:
                    pass
                event.clear()

        task = asyncio.create_task(refresher())
        await asyncio.sleep(0.01)
        event.set()     # "r": the wait completes...
        task.cancel()   # ..."q" in the same moment: the loop must still end
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
        return bool(done) and task.cancelled()

    assert asyncio.run(scenario())


def test_within_times_out_and_returns_results():
    from cronoq.cli.top import _within

    async def scenario() -> None:
        assert await _within(asyncio.sleep(0, "done"), 5) == "done"
        with pytest.raises(asyncio.TimeoutError):
            await _within(asyncio.Event().wait(), 0.01)

    asyncio.run(scenario())


# ---------------------------------------------------------------- top's layout, drawn without a server


def _drawn(width: int, height: int) -> str:
    import time
    from types import SimpleNamespace

    from rich.console import Console

    from cronoq.cli.top import TopView

    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, highlight=False)
    view = TopView(SimpleNamespace(settings=SimpleNamespace(url="https://cronoq.example.internal:7070")),  # type: ignore[arg-type]
                   pools=[], interval=1.0, task_limit=200, console=console)
    view.keys = True
    now_ns = time.time_ns()
    view.snapshot.set(pb.SnapshotResponse(live_tasks=12345, running=8, pending=12337, workers_connected=2,
                                  pools=[pb.PoolSnapshot(name="default", capacity=8, busy=8, pending=12337)]))
    view.workers.set(pb.ListWorkersResponse(workers=[
        pb.WorkerInfo(id=1, name="gpu-1", pool="llm", slots=4, busy=2, labels={"gpu": "a100"},
                      connected_unix_ns=now_ns)]))
    view.schedules.set(pb.ListRecurringResponse(schedules=[
        pb.RecurringInfo(name="nightly-report", cron="0 3 * * *", tz="Europe/Berlin", pool="reports",
                         next_unix_ns=now_ns + 7_300_000_000_000)]))
    view.tasks.set([])
    view.refreshed_at = time.time()
    console.print(view.render())
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_top_gives_the_schedules_the_room_they_need_on_a_100_column_terminal():
    screen = _drawn(100, 30)
    row = next(line for line in screen.splitlines() if "gpu-1" in line)
    # Half the width each cut the schedule's name, time zone, pool and next time short.
    for shown in ("gpu=a100", "nightly-report", "0 3 * * * Europe/Berlin", "reports", "in 2h"):
        assert shown in row, (shown, row)


def test_a_narrow_terminal_still_shows_how_to_quit():
    header = _drawn(80, 30).splitlines()[0]
    assert header.startswith("cronoq top") and "q quit" in header and "r refresh" in header


def test_slow_frames_are_drawn_less_often():
    from cronoq.cli.top import pause_after_frame

    assert pause_after_frame(0.005) == pytest.approx(0.1)   # ten frames a second at most
    # A frame of 90 ms (160 x 50 cells on a busy machine): the loop keeps two thirds of its time.
    assert pause_after_frame(0.09) == pytest.approx(0.18)
    assert 0.09 / (0.09 + pause_after_frame(0.09)) == pytest.approx(1 / 3)


class _FlakyConnection:
    """A stand-in for top's Connection whose calls fail once with an exception no
    cronoq error maps to (as a channel torn down during a server restart can), then answer."""

    def __init__(self) -> None:
        from types import SimpleNamespace
        self.settings = SimpleNamespace(url="127.0.0.1:7070")
        self.failures = {"snapshot": 1, "list_tasks": 1}

    def _maybe_fail(self, name: str) -> None:
        if self.failures.get(name):
            self.failures[name] -= 1
            raise RuntimeError(f"{name}: the channel went away")

    async def snapshot(self, *, retry_for: float | None = None) -> pb.SnapshotResponse:
        self._maybe_fail("snapshot")
        return pb.SnapshotResponse(live_tasks=1, pools=[pb.PoolSnapshot(name="default")])

    async def workers(self, pools, *, retry_for=None) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse()

    async def recurring(self, *, retry_for=None) -> pb.ListRecurringResponse:
        return pb.ListRecurringResponse()

    async def list_tasks(self, pools, statuses, after, limit, *, retry_for=None) -> pb.ListTasksResponse:
        self._maybe_fail("list_tasks")
        return pb.ListTasksResponse()

    async def watch(self, pools, terminal_only, recent=0, *, opened=None):
        if opened is not None:
            opened([])
        yield pb.StatusEvent(id=7, pool="default", status=pb.TASK_STATUS_SUCCEEDED)
        await asyncio.Event().wait()   # then a quiet, open stream


def test_an_unexpected_error_is_shown_in_its_pane_and_the_next_refresh_recovers():
    from cronoq.cli.top import TopView

    async def scenario() -> None:
        view = TopView(_FlakyConnection(), pools=[], interval=1.0, task_limit=10)  # type: ignore[arg-type]
        await view.refresh()   # raised RuntimeError, which ended top's refresher: the view froze
        assert view.snapshot.error is not None and "the channel went away" in view.snapshot.error
        assert view.workers.loaded and view.tasks.error is not None
        await view.refresh()
        assert view.snapshot.error is None and view.snapshot.data.live_tasks == 1 and view.tasks.error is None

    asyncio.run(scenario())


def test_the_event_stream_survives_an_unexpected_error():
    from cronoq.cli.top import TopView

    async def scenario() -> bool:
        conn = _FlakyConnection()
        conn.failures["list_tasks"] = 1
        view = TopView(conn, pools=[], interval=1.0, task_limit=10)  # type: ignore[arg-type]
        follower = asyncio.create_task(view._follow_events())
        try:
            for _ in range(200):   # waits for the event, up to 20 s: only a failing run waits that long
                if view.events.events or follower.done():
                    break
                await asyncio.sleep(0.1)
            return not follower.done() and [e.id for e in view.events.events] == [7] and view.events.error is None
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)

    assert asyncio.run(scenario())


# ---------------------------------------------------------------- top at 80 x 24 and 200 x 50; counts labeled

_HEADERS = {"POOL", "CAPACITY", "DESIRED", "BUSY", "PENDING", "WAIT P50", "WAIT P90", "UTIL", "SUCCEEDED", "FAILED", "WORKERS",
            "NAME", "LABELS", "CONNECTED", "CRON", "NEXT", "ID", "STATUS", "KEY", "ATTEMPT", "FOR", "MESSAGE", "TIME"}


def _crowded(width: int, height: int, window: float = 60.0, missing: tuple[str, ...] = (),
             events_missing: tuple[str, ...] = ()) -> list[str]:
    """top drawn with long pool, worker, schedule and key names, as a list of lines."""
    import time
    from types import SimpleNamespace

    from rich.console import Console

    from cronoq.cli.top import TopView

    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, highlight=False)
    view = TopView(SimpleNamespace(settings=SimpleNamespace(url="https://cronoq.example.internal:7070")),  # type: ignore[arg-type]
                   pools=[], interval=1.0, task_limit=200, console=console)
    view.keys = True
    now_ns = time.time_ns()
    view.snapshot.set(pb.SnapshotResponse(
        live_tasks=12345, running=8, pending=12337, workers_connected=2, metrics_window_s=window,
        unavailable_shards=missing,
        pools=[pb.PoolSnapshot(name="default", capacity=8, busy=8, pending=12337, wait_p50_s=1.5,
                               wait_p90_s=12.25, utilization=0.93, succeeded=1234, failed=6, workers_connected=2),
               pb.PoolSnapshot(name="reports-nightly-eu", capacity=10, pending=3)]))
    view.workers.set(pb.ListWorkersResponse(workers=[
        pb.WorkerInfo(id=1, name="gpu-1", pool="llm", slots=4, busy=2, labels={"gpu": "a100"}, connected_unix_ns=now_ns),
        pb.WorkerInfo(id=2, name="worker-host-17.example", pool="default", slots=8, busy=8,
                      labels={"zone": "eu-1", "disk": "ssd"}, connected_unix_ns=now_ns)]))
    view.schedules.set(pb.ListRecurringResponse(schedules=[
        pb.RecurringInfo(name="nightly-report", cron="0 3 * * *", tz="Europe/Berlin", pool="reports-nightly-eu",
                         next_unix_ns=now_ns + 7_300_000_000_000)]))
    view.tasks.set([pb.TaskInfo(id=1_000_000 + i, status=pb.TASK_STATUS_RUNNING, pool="reports-nightly-eu",
                                key=f"order-{i}-checkout", attempt=1, max_attempts=3, started_unix_ns=now_ns,
                                created_unix_ns=now_ns, message="charging the card, then mailing the receipt")
                    for i in range(8)])
    for i in range(8):
        view.events.events.appendleft(pb.StatusEvent(id=1_000_000 + i, pool="reports-nightly-eu",
                                                     key=f"order-{i}-checkout", status=pb.TASK_STATUS_RETRYING,
                                                     attempt=2, max_attempts=3, at_unix_ns=now_ns,
                                                     message="card declined"))
    view.events.state = "live"
    view.events.missing_shards = list(events_missing)
    view.refreshed_at = time.time()
    console.print(view.render())
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def _header_rows(lines: list[str]) -> list[str]:
    """The column-header lines of the panes (the line after each pane's title)."""
    return [line for line in lines if any(word in _HEADERS for word in line.split()) and
            all(word in _HEADERS or word in ("P50", "P90", "WAIT") for word in line.split())]


@pytest.mark.parametrize("width, height", [(80, 24), (200, 50)])
def test_top_fits_its_terminal_by_leaving_columns_out_never_by_cutting_them(width, height):
    lines = _crowded(width, height)
    assert len(lines) <= height and all(len(line) <= width for line in lines)
    headers = _header_rows(lines)
    # Pools; workers and schedules side by side; tasks and events (stacked below 160 columns).
    assert len(headers) == (4 if width < 160 else 3), lines
    for row in headers:
        assert "…" not in row, row
        # Each header is whole: no word of it is cut into a prefix of a header ("CAPACI…", "P…").
        assert all(word in _HEADERS or word in ("WAIT", "P50", "P90") for word in row.split()), row
    pools = [line.split()[0] for line in lines if line.startswith(("default ", "reports"))]
    assert pools == ["default", "reports-nightly-eu"], lines   # never "defau…" or "reports-night…"
    assert lines[0].startswith("cronoq top  q quit  r refresh") and "pending 12337" in lines[0]
    assert "1/3" in "\n".join(lines) and "2/3" in "\n".join(lines)   # attempts of the allowed, in both panes


def test_top_at_200_columns_shows_every_column_and_at_80_the_important_ones():
    wide = "\n".join(_crowded(200, 50))
    for header in ("WAIT P90", "WORKERS", "LABELS", "CONNECTED", "CRON", "MESSAGE", "ATTEMPT"):
        assert header in wide, header
    narrow = _header_rows(_crowded(80, 24))
    pools, tasks = narrow[0].split(), narrow[2].split()
    for header in ("POOL", "BUSY", "PENDING", "SUCCEEDED", "FAILED"):
        assert header in pools, narrow
    for header in ("ID", "STATUS", "POOL", "ATTEMPT"):
        assert header in tasks, narrow


def test_top_names_the_shards_a_sharded_server_could_not_ask_before_its_counts():
    assert "unavailable" not in _crowded(120, 30)[0]
    header = _crowded(120, 30, missing=("far",), events_missing=("b", "far"))[0]
    assert "unavailable: shards b, far" in header and header.index("unavailable") < header.index("live 12345")
    # At 80 columns the address and the clock go first, then the counts; the missing shards stay.
    narrow = _crowded(80, 24, missing=("b",))[0]
    assert "unavailable: shard b" in narrow and len(narrow) <= 80


def test_top_says_that_the_pools_counts_are_attempts_over_the_snapshots_window():
    lines = _crowded(120, 30, window=30.0)
    title = next(line for line in lines if line.startswith("Pools"))
    assert "SUCCEEDED, FAILED: attempts in the last 30 s" in title
    old_server = next(line for line in _crowded(120, 30, window=0.0) if line.startswith("Pools"))
    assert "attempts in the metrics window" in old_server


def test_snapshot_totals_say_what_they_count():
    from cronoq.cli.output import totals_text, window_text

    text = totals_text({"submitted": 5, "dispatched": 9, "succeeded": 3, "failed": 0, "dead_lettered": 2,
                        "retries": 4, "recurring_invalid": 0, "a_newer_total": 1})
    assert text == ("since start, tasks: submitted 5, succeeded 3, failed 0, dead_lettered 2; "
                    "attempts: dispatched 9, retries 4; schedule occurrences: recurring_invalid 0; "
                    "other: a_newer_total 1")
    assert window_text(60.0) == "the last 60 s" and window_text(0.5) == "the last 0.5 s"


class _WatchedConnection:
    """A stand-in for watch's Connection: one stream of events, then an unknown pool (which ends watch)."""

    def __init__(self, events: list[pb.StatusEvent], missing: list[str] | None = None) -> None:
        self.events = events
        self.missing = missing or []

    async def list_tasks(self, pools, statuses, after, limit, **_: object) -> pb.ListTasksResponse:
        return pb.ListTasksResponse()

    async def watch(self, pools, terminal_only, recent=0, *, opened=None):
        opened(self.missing)
        for event in self.events:
            yield event
        raise errors.UnknownPool("no pool named 'gone'")


def test_watch_lines_are_columns_and_attempts_say_of_how_many():
    from cronoq.cli import commands

    events = [pb.StatusEvent(id=7, pool="default", status=pb.TASK_STATUS_SUCCEEDED, attempt=1, max_attempts=3,
                             key="a", at_unix_ns=1_796_000_000_000_000_000),
              pb.StatusEvent(id=123456, pool="llm", status=pb.TASK_STATUS_DEAD_LETTERED, attempt=3, max_attempts=3,
                             key="summarize-42", message="gave up", at_unix_ns=1_796_000_001_000_000_000),
              pb.StatusEvent(id=8, pool="default", status=pb.TASK_STATUS_FAILED, attempt=10, max_attempts=10,
                             at_unix_ns=1_796_000_002_000_000_000),
              pb.StatusEvent(id=9, pool="default", status=pb.TASK_STATUS_CANCELLED, attempt=0,
                             at_unix_ns=1_796_000_003_000_000_000)]
    stdout = Stream(False)
    args = argparse.Namespace(pool=[], all=False, output="text")
    with pytest.raises(errors.UnknownPool):
        asyncio.run(commands.watch(_WatchedConnection(events), args, Output(stdout, Stream(False))))  # type: ignore[arg-type]
    lines = stdout.getvalue().splitlines()
    assert [line.split()[4:6] for line in lines] == [["attempt", "1/3"], ["attempt", "3/3"], ["attempt", "10/10"],
                                                     ["attempt", "0"]]
    # From the second line on (the widest id came then), every column starts where the one above does:
    # the pool, the status, the attempt and the key.
    import re
    starts = [[m.start() for m in re.finditer(r"\S+", line)] for line in lines[1:]]
    for column in (2, 3, 4, 6):
        assert len({row[column] for row in starts}) == 1, (column, lines)


def test_watch_says_on_stderr_which_shards_the_stream_leaves_out():
    from cronoq.cli import commands

    event = pb.StatusEvent(id=7, pool="default", status=pb.TASK_STATUS_SUCCEEDED, attempt=1, max_attempts=3,
                           at_unix_ns=1_796_000_000_000_000_000)
    for output in ("text", "json"):
        stdout, stderr = Stream(False), Stream(False)
        args = argparse.Namespace(pool=[], all=False, output=output)
        with pytest.raises(errors.UnknownPool):
            asyncio.run(commands.watch(_WatchedConnection([event], ["b", "far"]), args,  # type: ignore[arg-type]
                                       Output(stdout, stderr)))
        assert "shards b, far could not be asked: their events are not shown" in stderr.getvalue()
        assert "could not be asked" not in stdout.getvalue() and len(stdout.getvalue().splitlines()) == 1
