"""What ``cronoq`` prints: terminal-safe text, columns, times, and JSON
shaped like the HTTP API (ids and nanosecond times as strings).

Keys, messages, names, labels and outputs come from other clients of the
server. On a terminal their control characters (C0, DEL, C1) and the Unicode
bidirectional overrides are shown as escapes (``\\u{1b}``) so that nothing
another client wrote can move the cursor, retitle the window or reorder
what is shown; redirected output is written unchanged.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import re
import sys
from typing import IO, TYPE_CHECKING, Any, Iterable, Sequence

from rich.cells import cell_len

from ..core.snapshot import TOTAL_FIELDS

if TYPE_CHECKING:
    from .._proto import cronoq_pb2 as pb

__all__ = ["escape", "escape_bytes", "Output", "columns", "iso_ns", "age", "STATUS_NAMES", "PRIORITY_NAMES",
           "OVERLAP_NAMES", "CLASS_NAMES", "task_json", "result_json", "event_json", "worker_json",
           "schedule_json", "snapshot_json", "ordered_totals"]

# Unicode's bidirectional embeddings, overrides and isolates: they reorder what follows on screen.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "]")
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]")
_UNPAIRED = re.compile("[\udc80-\udcff]")


def _hex(match: re.Match[str]) -> str:
    return "\\u{%x}" % ord(match.group())


def escape(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control character shown as ``\\u{hex}``
    (newlines and tabs kept with ``keep_lines``)."""
    return (_UNSAFE_KEEP_LINES if keep_lines else _UNSAFE).sub(_hex, text)


def escape_bytes(data: bytes) -> str:
    """Bytes for a terminal: UTF-8 text with control characters escaped
    (lines and tabs kept), and bytes that are not UTF-8 as ``\\x{hex}``."""
    text = escape(data.decode("utf-8", "surrogateescape"), keep_lines=True)
    return _UNPAIRED.sub(lambda m: "\\x{%02x}" % (ord(m.group()) - 0xDC00), text)


class Output:
    """Standard output and error of one command, knowing whether each is a terminal."""

    def __init__(self, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.out_tty = _isatty(self.stdout)
        self.err_tty = _isatty(self.stderr)

    def field(self, value: str) -> str:
        """A value from another client, for standard output."""
        return escape(value) if self.out_tty else value

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def flush(self) -> None:
        self.stdout.flush()

    def error(self, text: str) -> None:
        """A message on standard error (escaped on a terminal: messages quote other clients' text)."""
        self.stderr.write((escape(text, keep_lines=True) if self.err_tty else text) + "\n")
        self.stderr.flush()

    def data(self, payload: bytes) -> None:
        """A task's output: unchanged when redirected; on a terminal, escaped and ended by a newline."""
        if self.out_tty:
            text = escape_bytes(payload)
            self.stdout.write(text if not text or text.endswith("\n") else text + "\n")
            self.stdout.flush()
            return
        self.stdout.flush()
        buffer = getattr(self.stdout, "buffer", None)
        if buffer is not None:
            buffer.write(payload)
            buffer.flush()
        else:   # a text stream without bytes underneath (tests): the closest it can hold
            self.stdout.write(payload.decode("utf-8", "surrogateescape"))

    def json(self, value: Any) -> None:
        """One JSON document on a line. On a terminal, characters that JSON
        leaves literal but a terminal obeys (DEL, C1, bidi) become \\u escapes."""
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        if self.out_tty:
            text = _UNSAFE.sub(lambda m: "\\u%04x" % ord(m.group()), text)
        self.line(text)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        for text in columns(headers, [[self.field(cell) for cell in row] for row in rows]):
            self.line(text)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, sized by terminal cells; the last one is not padded."""
    widths = [cell_len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], cell_len(cell))
    out = []
    for row in [list(headers), *rows]:
        cells = [cell + " " * (widths[i] - cell_len(cell)) if i < len(row) - 1 else cell
                 for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


def iso_ns(ns: int) -> str:
    """Unix nanoseconds as RFC 3339 UTC with milliseconds."""
    moment = _dt.datetime.fromtimestamp(ns // 1_000_000_000, _dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + ".%03dZ" % (ns % 1_000_000_000 // 1_000_000)


def age(seconds: float) -> str:
    """A duration, short: 45s, 12m, 3h, 2d."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# ---------------------------------------------------------------- enum names (proto values, stable)

STATUS_NAMES = {0: "unspecified", 1: "blocked", 2: "scheduled", 3: "ready", 4: "running", 5: "retrying",
                6: "succeeded", 7: "failed", 8: "dead_lettered", 9: "cancelled", 10: "skipped", 11: "missed",
                12: "shed"}
PRIORITY_NAMES = {0: "normal", 1: "critical", 2: "high", 3: "normal", 4: "low"}
OVERLAP_NAMES = {0: "skip", 1: "skip", 2: "allow", 3: "queue", 4: "queue_on_success"}
CLASS_NAMES = ("critical", "high", "normal", "low")


# ---------------------------------------------------------------- JSON like the HTTP API


def _optional_ns(message: Any, field: str, out: dict[str, Any]) -> None:
    if message.HasField(field):
        out[field] = str(getattr(message, field))


_CONDITIONS = {1: "on_success", 2: "on_failure", 3: "on_complete"}


def task_json(m: pb.TaskInfo) -> dict[str, Any]:
    """The task as GET /v1/tasks/{id} answers it (tests/test_cli.py compares the two)."""
    out: dict[str, Any] = {"id": str(m.id), "status": STATUS_NAMES.get(m.status, str(m.status)), "pool": m.pool}
    if m.key:
        out["key"] = m.key
    if m.kind:
        out["kind"] = m.kind
    out["attempt"] = m.attempt
    if m.max_attempts:
        out["max_attempts"] = m.max_attempts
    if m.priority:
        out["priority"] = PRIORITY_NAMES.get(m.priority, "normal")
    if m.tenant:
        out["tenant"] = m.tenant
    if m.tags:
        out["tags"] = dict(sorted(m.tags.items()))
    out["output_available"] = m.output_available
    if m.message:
        out["message"] = m.message
    for field in ("created_unix_ns", "started_unix_ns", "finished_unix_ns"):
        _optional_ns(m, field, out)
    if m.deps:
        out["deps"] = [{"id": str(d.ref.id)} if d.ref.WhichOneof("ref") == "id" else {"key": d.ref.key}
                       for d in m.deps]
        for item, d in zip(out["deps"], m.deps):
            item["cond"] = _CONDITIONS.get(d.cond, "on_success")
    if m.attempts:
        attempts = []
        for a in m.attempts:
            attempt: dict[str, Any] = {"attempt": a.attempt}
            if a.status:
                attempt["status"] = STATUS_NAMES.get(a.status, str(a.status))
            if a.message:
                attempt["message"] = a.message
            attempt["started_unix_ns"] = str(a.started_unix_ns)
            _optional_ns(a, "ended_unix_ns", attempt)
            attempts.append(attempt)
        out["attempts"] = attempts
    if m.stages:
        out["stages"] = list(m.stages)
    if m.checkpoints:
        out["checkpoints"] = [_checkpoint_json(c) for c in m.checkpoints]
    return out


def _checkpoint_json(m: Any) -> dict[str, Any]:
    content_type = m.content_type or "application/octet-stream"
    out: dict[str, Any] = {"stage": m.stage, "content_type": content_type}
    decoded = _decoded(bytes(m.data), content_type)
    if decoded is not _NOTHING:
        out["data_text" if isinstance(decoded, str) and not _is_json(content_type) else "data"] = decoded
    out.update(data_b64=base64.b64encode(m.data).decode("ascii"), attempt=m.attempt,
               saved_unix_ns=str(m.saved_unix_ns))
    return out


def result_json(m: pb.TaskResult) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(m.id), "status": STATUS_NAMES.get(m.status, str(m.status)),
                           "output_available": m.output_available}
    if m.output_available:
        content_type = m.content_type or "application/octet-stream"
        out["content_type"] = content_type
        decoded = _decoded(bytes(m.output), content_type)
        if decoded is not _NOTHING:   # as GET /v1/tasks/{id}/result: JSON parsed, text as a string
            out["output_text" if isinstance(decoded, str) and not _is_json(content_type) else "output"] = decoded
        out["output_b64"] = base64.b64encode(m.output).decode("ascii")
    if m.message:
        out["message"] = m.message
    return out


_NOTHING = object()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _decoded(data: bytes, content_type: str) -> Any:
    """The output as JSON holds it: parsed when it is JSON, a string when it is text."""
    media = content_type.split(";", 1)[0].strip().lower()
    try:
        if media == "application/json" or media.endswith("+json"):
            return json.loads(data)
        if media.startswith("text/"):
            return data.decode("utf-8")
    except ValueError:
        pass
    return _NOTHING


def event_json(m: pb.StatusEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(m.id), "pool": m.pool}
    if m.key:
        out["key"] = m.key
    out.update(status=STATUS_NAMES.get(m.status, str(m.status)), attempt=m.attempt, at_unix_ns=str(m.at_unix_ns))
    if m.message:
        out["message"] = m.message
    if m.stage:   # a stage completed
        out["stage"] = m.stage
    return out


def worker_json(m: pb.WorkerInfo) -> dict[str, Any]:
    return {"id": str(m.id), "name": m.name, "pool": m.pool, "labels": dict(sorted(m.labels.items())),
            "slots": m.slots, "busy": m.busy, "connected_unix_ns": str(m.connected_unix_ns)}


def schedule_json(m: pb.RecurringInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": m.name, "cron": m.cron}
    if m.tz:
        out["tz"] = m.tz
    out.update(pool=m.pool, kind=m.kind, overlap=OVERLAP_NAMES.get(m.overlap, "skip"))
    _optional_ns(m, "next_unix_ns", out)
    if m.HasField("last_task_id"):
        out["last_task_id"] = str(m.last_task_id)
    return out


_POOL_FIELDS = ("name", "capacity", "busy", "held", "desired", "pending", "pending_by_class", "reservations",
                "dispatched", "succeeded", "failed", "priority_adherence", "fixed_start_hit_rate", "utilization",
                "schedule_efficiency", "wait_p50_s", "wait_p90_s", "wait_p99_s", "cost", "workers_connected")


def ordered_totals(totals: Any) -> dict[str, int]:
    """The snapshot's totals in the documented order (a map on the wire has none)."""
    known = {name: i for i, name in enumerate(TOTAL_FIELDS)}
    return {name: totals[name] for name in sorted(totals, key=lambda n: (known.get(n, len(known)), n))}


def snapshot_json(m: pb.SnapshotResponse) -> dict[str, Any]:
    pools = []
    for p in m.pools:
        pool = {name: getattr(p, name) for name in _POOL_FIELDS}
        pool["pending_by_class"] = list(p.pending_by_class)
        pool["groups"] = [{"labels": dict(sorted(g.labels.items())), "capacity": g.capacity, "busy": g.busy}
                          for g in p.groups]
        pools.append(pool)
    return {"live_tasks": m.live_tasks, "running": m.running, "pending": m.pending,
            "workers_connected": m.workers_connected, "unavailable_shards": list(m.unavailable_shards),
            "pools": pools, "totals": ordered_totals(m.totals), "at_unix_ns": str(m.at_unix_ns)}
