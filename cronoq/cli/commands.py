"""The built-in subcommands that talk to the server (all but ``top``).

Each takes the connection, the parsed arguments and the output, and returns
the exit code; what a call raises is mapped to one by the caller (app.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Sequence, cast

from rich.cells import cell_len

from .._proto import cronoq_pb2 as pb
from ..client import wire
from ..errors import SchedulerError, ServerError
from .exits import CliError, ExitCode
from .._proto.json_view import dependents_json, explanation_json, info_json as task_json, result_json, snapshot_json
from .output import (PRIORITY_NAMES, STATUS_NAMES, Output, age, attempt_text, event_json, iso_ns, schedule_json,
                     shards_missing_text, totals_text, window_text, worker_health, worker_json)
from .remote import Connection

__all__ = ["submit", "get", "explain", "dependents", "wait", "cancel", "tasks", "workers", "schedules", "schedule", "snapshot", "watch",
           "wait_for", "split_list", "status_values"]

_STATUS_VALUES = {name: cast("pb.TaskStatus", pb.TaskStatus.Value("TASK_STATUS_" + name.upper()))
                  for name in STATUS_NAMES.values() if name != "unspecified"}
_OVERLAP = {"skip": pb.OVERLAP_SKIP, "allow": pb.OVERLAP_ALLOW, "queue": pb.OVERLAP_QUEUE,
            "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS}


def _json_wanted(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "text") == "json"


def split_list(values: list[str]) -> list[str]:
    """Repeated options that may also be comma-separated: ``--pool a,b --pool c``."""
    return [item for value in values for item in value.split(",") if item]


def status_values(names: list[str]) -> list[pb.TaskStatus]:
    wanted: list[pb.TaskStatus] = []
    for name in split_list(names):
        if name.lower() not in _STATUS_VALUES:
            raise CliError(ExitCode.USAGE, f"--status: unknown status {name!r}; statuses are "
                                           f"{', '.join(_STATUS_VALUES)}")
        wanted.append(_STATUS_VALUES[name.lower()])
    return wanted


def _ref(args: argparse.Namespace) -> int | str:
    return args.id if args.id is not None else args.key


def _ref_text(ref: int | str) -> str:
    return f"task {ref}" if isinstance(ref, int) else f"the task with key {ref!r}"


# ---------------------------------------------------------------- payloads and task options


_FOUND_ELSEWHERE = "the answer comes from the shards that could"


def _missing(out: Output, shards: Sequence[str], left_out: str, document: dict[str, Any] | None = None) -> None:
    """Say which shards a sharded server could not ask: on stderr (stdout
    keeps the answer), and in the JSON document as ``unavailable_shards``."""
    if not shards:
        return
    if document is not None:
        document["unavailable_shards"] = list(shards)
    else:
        out.error("cronoq: " + shards_missing_text(shards, left_out))


def _payload(args: argparse.Namespace) -> tuple[bytes | None, str | None]:
    """(payload bytes, content type) from PAYLOAD, --file and --json."""
    if args.payload is not None and args.file is not None:
        raise CliError(ExitCode.USAGE, "give the payload either as an argument or with --file, not both")
    data: bytes | None
    if args.file is not None:
        data = _read_file(args.file)
        content_type = wire.OCTETS
    elif args.payload is not None:
        data = args.payload.encode("utf-8", "surrogateescape")   # the argument's bytes, as given
        content_type = wire.TEXT
    else:
        data, content_type = None, None
    if args.json:
        if data is None:
            raise CliError(ExitCode.USAGE, "--json needs a payload (an argument or --file)")
        try:
            json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CliError(ExitCode.USAGE, f"--json: the payload is not JSON: {exc}") from None
        content_type = wire.JSON
    if args.content_type is not None:
        content_type = args.content_type
    return data, content_type


def _read_file(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"--file: cannot read {path!r}: {exc.strerror or exc}") from None


def _spec(args: argparse.Namespace, **extra: Any) -> pb.TaskSpec:
    data, content_type = _payload(args)
    options: dict[str, Any] = {name: getattr(args, name) for name in ("pool", "kind", "priority", "tenant", "key")
                               if getattr(args, name) is not None}
    if args.deadline_in is not None:
        options["deadline_in"] = args.deadline_in
    if args.label:
        options["labels"] = dict(args.label)
    if args.tag:
        options["tags"] = dict(args.tag)
    options.update(extra)
    try:
        return wire.task_message(data, content_type=content_type, **options)
    except (TypeError, ValueError) as exc:
        raise CliError(ExitCode.USAGE, str(exc)) from None


def _after(refs: list[str]) -> list[int | str]:
    return [int(ref) if ref.isascii() and ref.isdigit() else ref for ref in refs]


# ---------------------------------------------------------------- tasks


async def submit(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    if args.wait_timeout is not None and not args.wait:
        raise CliError(ExitCode.USAGE, "--wait-timeout needs --wait")
    spec = _spec(args, **({"after": _after(args.after)} if args.after else {}))
    response = await conn.submit(spec)
    if response.duplicate and not _json_wanted(args):
        out.error(f"cronoq: the key {args.key!r} already names task {response.id}: nothing new was submitted")
    if not args.wait:
        if _json_wanted(args):
            out.json({"id": str(response.id), "duplicate": response.duplicate})
        else:
            out.line(str(response.id))
        return ExitCode.OK
    result = await wait_for(conn, response.id, args.wait_timeout, out)
    if _json_wanted(args):
        out.json({"id": str(response.id), "duplicate": response.duplicate, "result": result_json(result)})
        return ExitCode.OK if result.status == pb.TASK_STATUS_SUCCEEDED else ExitCode.TASK_FAILED
    return _show_result(result, out)


async def wait_for(conn: Connection, ref: int | str, timeout: float | None, out: Output) -> pb.TaskResult:
    """Wait until the task finished, however long the server's own limit on one Wait
    is (limits.max_wait_s): at most ``timeout`` seconds, or without end."""
    loop = asyncio.get_running_loop()
    give_up = None if timeout is None else loop.time() + timeout
    while True:
        left = None if give_up is None else max(0.0, give_up - loop.time())
        try:
            return await conn.wait_once(ref, left)
        except TimeoutError:
            if give_up is not None and loop.time() >= give_up - 0.001:
                raise CliError(ExitCode.TIMEOUT,
                               f"{_ref_text(ref)} has not finished after {timeout:g} s; it keeps running "
                               f"(cronoq wait {ref if isinstance(ref, int) else '--key ' + ref} "
                               f"to wait again)") from None


def _show_result(result: pb.TaskResult, out: Output) -> int:
    status = STATUS_NAMES.get(result.status, str(result.status))
    if result.status == pb.TASK_STATUS_SUCCEEDED:
        if result.output_available:
            out.data(bytes(result.output))
        else:
            out.error(f"cronoq: task {result.id} succeeded; its output is no longer kept")
        return ExitCode.OK
    out.error(f"cronoq: task {result.id} {status.replace('_', ' ')}" +
              (f": {result.message}" if result.message else ""))
    return ExitCode.TASK_FAILED


async def get(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    info = await conn.get(_ref(args))
    if _json_wanted(args):
        document = task_json(info)
        _missing(out, conn.missing_shards, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, conn.missing_shards, _FOUND_ELSEWHERE)
    rows = [("id", str(info.id)), ("status", STATUS_NAMES.get(info.status, str(info.status))),
            ("pool", out.field(info.pool)), ("key", out.field(info.key) if info.key else "-"),
            ("kind", out.field(info.kind)), ("priority", PRIORITY_NAMES.get(info.priority, "normal")),
            ("tenant", out.field(info.tenant) if info.tenant else "-"),
            ("tags", out.field(", ".join(f"{k}={v}" for k, v in sorted(info.tags.items()))) or "-"),
            ("attempt", f"{info.attempt} of {info.max_attempts}" if info.max_attempts else str(info.attempt))]
    for label, field in (("created", "created_unix_ns"), ("started", "started_unix_ns"),
                         ("finished", "finished_unix_ns")):
        rows.append((label, iso_ns(getattr(info, field)) if info.HasField(field) else "-"))
    rows.append(("output", "available" if info.output_available else "-"))
    rows.append(("message", out.field(info.message) if info.message else "-"))
    for name, value in rows:
        out.line(f"{name.ljust(9)}{value}")
    return ExitCode.OK


async def explain(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    explanation = await conn.explain(_ref(args))
    document = explanation_json(explanation)
    if _json_wanted(args):
        _missing(out, conn.missing_shards, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, conn.missing_shards, _FOUND_ELSEWHERE)
    out.line(out.field(explanation.summary))
    rows = [("id", document["id"]), ("status", document["status"]), ("pool", out.field(explanation.pool)),
            ("priority", document.get("priority", "-"))]
    if "score" in document:
        rows.append(("score", f"{explanation.score:.1f}"))
    if "position" in document:
        rows.append(("position", f"{explanation.position} of {explanation.queued} queued"))
    for name, value in rows:
        out.line(f"{name.ljust(9)}{value}")
    for reason in document["reasons"]:
        out.line(f"- {reason['code']}: {out.field(reason['message'])}")
    return ExitCode.OK


async def dependents(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    response = await conn.dependents(_ref(args), args.depth, args.limit)
    missing = list(dict.fromkeys([*response.unavailable_shards, *conn.missing_shards]))
    if _json_wanted(args):
        document = dependents_json(response)
        _missing(out, missing, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, missing, _FOUND_ELSEWHERE)
    out.table(("ID", "STATUS", "POOL", "KEY", "DEPTH", "DEPENDS ON"),
              [(str(d.id), STATUS_NAMES.get(d.status, "?"), d.pool, d.key or "-", str(d.depth),
                ",".join(str(parent) for parent in d.depends_on)) for d in response.dependents])
    if not response.dependents:
        out.error(f"cronoq: no task depends on task {response.id}")
    if response.truncated:
        out.error(f"cronoq: more dependents exist: raise --limit (it was {args.limit})")
    return ExitCode.OK


async def wait(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    result = await wait_for(conn, _ref(args), args.timeout, out)
    if _json_wanted(args):
        document = result_json(result)
        _missing(out, conn.missing_shards, "", document)
        out.json(document)
        return ExitCode.OK if result.status == pb.TASK_STATUS_SUCCEEDED else ExitCode.TASK_FAILED
    _missing(out, conn.missing_shards, _FOUND_ELSEWHERE)
    return _show_result(result, out)


async def cancel(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    ref = _ref(args)
    cancelled = await conn.cancel(ref)
    if _json_wanted(args):
        out.json({"cancelled": cancelled})
    elif cancelled:
        out.line(f"cancelled {_ref_text(ref)}")
    else:
        out.line(f"{_ref_text(ref)} had already finished: not cancelled")
    return ExitCode.OK


async def tasks(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    pools, statuses = split_list(args.pool), status_values(args.status)
    found: list[pb.TaskInfo] = []
    missing: list[str] = []
    after = args.after
    while True:
        page = await conn.list_tasks(pools, statuses, after, args.limit)
        found.extend(page.tasks)
        missing.extend(name for name in page.unavailable_shards if name not in missing)
        after = page.next_after
        if not after or not args.all:
            break
    if _json_wanted(args):
        document: dict[str, Any] = {"tasks": [task_json(t) for t in found]}
        if after:
            document["next_after"] = str(after)
        _missing(out, missing, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, missing, "their tasks are not listed")
    now = time.time()
    out.table(("ID", "STATUS", "POOL", "KEY", "KIND", "PRIORITY", "ATTEMPT", "AGE", "MESSAGE"),
              [(str(t.id), STATUS_NAMES.get(t.status, "?"), t.pool, t.key or "-", t.kind,
                PRIORITY_NAMES.get(t.priority, "normal"), attempt_text(t.attempt, t.max_attempts),
                age(now - t.created_unix_ns / 1e9) if t.HasField("created_unix_ns") else "-", t.message)
               for t in found])
    if after:
        out.error(f"cronoq: more tasks follow: --after {after} for the next page, --all for every page")
    return ExitCode.OK


# ---------------------------------------------------------------- admin


async def workers(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    response = await conn.workers(split_list(args.pool))
    if _json_wanted(args):
        document = {"workers": [worker_json(w) for w in response.workers]}
        _missing(out, response.unavailable_shards, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, response.unavailable_shards, "their workers are not listed")
    now = time.time()
    out.table(("ID", "NAME", "POOL", "BUSY", "SLOTS", "HEALTH", "EXPIRED", "LABELS", "CONNECTED"),
              [(str(w.id), w.name, w.pool, str(w.busy), str(w.slots), worker_health(w), str(w.lease_expiries),
                ",".join(f"{k}={v}" for k, v in sorted(w.labels.items())) or "-",
                age(now - w.connected_unix_ns / 1e9) + " ago") for w in response.workers])
    return ExitCode.OK


async def schedules(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    response = await conn.recurring()
    if _json_wanted(args):
        document = {"schedules": [schedule_json(s) for s in response.schedules]}
        _missing(out, response.unavailable_shards, "", document)
        out.json(document)
        return ExitCode.OK
    _missing(out, response.unavailable_shards, "their schedules are not listed")
    out.table(("NAME", "CRON", "TZ", "POOL", "KIND", "OVERLAP", "NEXT", "LAST TASK"),
              [(s.name, s.cron, s.tz or "UTC", s.pool, s.kind, schedule_json(s)["overlap"],
                iso_ns(s.next_unix_ns) if s.HasField("next_unix_ns") else "-",
                str(s.last_task_id) if s.HasField("last_task_id") else "-") for s in response.schedules])
    return ExitCode.OK


async def schedule(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    if args.schedule_action == "remove":
        removed = await conn.remove_recurring(args.name)
        if _json_wanted(args):
            out.json({"removed": removed})
        elif removed:
            out.line(f"removed {out.field(args.name)}")
        if not removed:
            out.error(f"cronoq: there is no schedule named {args.name!r}")
            return ExitCode.NOT_FOUND
        return ExitCode.OK
    request = pb.AddRecurringRequest(name=args.name, cron=args.cron, tz=args.tz, template=_spec(args),
                                     overlap=_OVERLAP[args.overlap])
    response = await conn.add_recurring(request)
    if _json_wanted(args):
        document: dict[str, Any] = {"name": args.name}
        if response.HasField("next_unix_ns"):
            document["next_unix_ns"] = str(response.next_unix_ns)
        out.json(document)
    elif response.HasField("next_unix_ns"):
        out.line(f"{out.field(args.name)}: next at {iso_ns(response.next_unix_ns)}")
    else:
        out.line(f"{out.field(args.name)}: no occurrence is due")
    return ExitCode.OK


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s" if seconds < 100 else f"{seconds:.0f}s"


async def snapshot(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    snap = await conn.snapshot()
    if _json_wanted(args):
        out.json(snapshot_json(snap))   # (which always has unavailable_shards, like the HTTP snapshot)
        return ExitCode.OK
    _missing(out, snap.unavailable_shards, "their pools are not shown and the counts leave them out")
    if snap.environment or snap.region:
        out.line(f"environment {snap.environment or '-'}   region {snap.region or '-'}")
    out.line(f"live tasks {snap.live_tasks}   running {snap.running}   pending {snap.pending}   "
             f"workers {snap.workers_connected}   at {iso_ns(snap.at_unix_ns)}")
    out.line()
    out.line(f"pools: capacity, desired, busy, pending and workers now; waits, utilization and the SUCCEEDED "
             f"and FAILED attempts over {window_text(snap.metrics_window_s)}")
    out.table(("POOL", "CAPACITY", "DESIRED", "BUSY", "PENDING", "WAIT P50", "WAIT P90", "UTILIZATION",
               "SUCCEEDED", "FAILED", "WORKERS"),
              [(p.name, str(p.capacity), str(p.desired), str(p.busy), str(p.pending), _duration(p.wait_p50_s),
                _duration(p.wait_p90_s), _percent(p.utilization), str(p.succeeded), str(p.failed),
                str(p.workers_connected)) for p in snap.pools])
    out.line()
    out.line("totals " + totals_text(dict(snap.totals)))
    return ExitCode.OK


# ---------------------------------------------------------------- watch


class EventLine:
    """``watch``'s lines, in columns: time, id, pool, status, attempt, key and
    message. A stream has no end to measure, so each column is as wide as the
    widest value seen so far (from widths that fit the usual values), and
    keys no wider than ``KEY_WIDTH``: a longer one moves only its own message."""

    KEY_WIDTH = 32

    def __init__(self, pools: list[str]) -> None:
        self.widths = [24, 4, max([7, *(cell_len(p) for p in pools)]), max(map(len, STATUS_NAMES.values())),
                       len("attempt 10/10"), 1]

    def text(self, event: pb.StatusEvent, out: Output) -> str:
        cells = [iso_ns(event.at_unix_ns), str(event.id), out.field(event.pool),
                 STATUS_NAMES.get(event.status, "?"), f"attempt {attempt_text(event.attempt, event.max_attempts)}",
                 out.field(event.key) if event.key else "-"]
        for i, cell in enumerate(cells):
            if i < len(cells) - 1 or cell_len(cell) <= self.KEY_WIDTH:
                self.widths[i] = max(self.widths[i], cell_len(cell))
        padded = [cell.rjust(self.widths[i]) if i == 1 else cell + " " * (self.widths[i] - cell_len(cell))
                  for i, cell in enumerate(cells)]
        return "  ".join([*padded, out.field(event.message)]).rstrip()


async def watch(conn: Connection, args: argparse.Namespace, out: Output) -> int:
    pools = split_list(args.pool)
    # One ordinary call first: an unreachable server, a token without the
    # client role or an unknown pool ends the command with its exit code;
    # after that, the stream reconnects for as long as it runs.
    await conn.list_tasks(pools, [], 0, 1)
    line = EventLine(pools)
    backoff = 0.2
    while True:
        try:
            async for event in conn.watch(pools, terminal_only=not args.all,
                                          opened=lambda missing: _missing(out, missing, "their events are not shown")):
                backoff = 0.2
                if _json_wanted(args):
                    out.json(event_json(event))
                else:
                    out.line(line.text(event, out))
                out.flush()
            reason = "the stream ended"
        except SchedulerError as exc:
            reason = str(exc)
        except ServerError as exc:
            if exc.code not in ("DATA_LOSS", "CANCELLED", "INTERNAL", "RESOURCE_EXHAUSTED"):
                raise
            reason = str(exc)
        out.error(f"cronoq: watch: {reason}; reconnecting in {backoff:.1f} s")
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)
