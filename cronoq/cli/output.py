"""What ``cronoq`` prints: terminal-safe text, columns, times, and JSON
shaped like the HTTP API (ids and nanosecond times as strings).

Keys, messages, names, labels and outputs come from other clients of the
server. On a terminal their control characters (C0, DEL, C1) and the Unicode
bidirectional overrides are shown as escapes (``\\u{1b}``) so that nothing
another client wrote can move the cursor, retitle the window or reorder
what is shown; redirected output is written unchanged.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
from typing import IO, TYPE_CHECKING, Any, Iterable, Sequence

from rich.cells import cell_len

from ..core.options import CLASSES

if TYPE_CHECKING:
    from .._proto import cronoq_pb2 as pb

__all__ = ["escape", "escape_bytes", "Output", "columns", "iso_ns", "age", "STATUS_NAMES", "PRIORITY_NAMES",
           "OVERLAP_NAMES", "CLASS_NAMES", "HEALTH_NAMES", "event_json", "worker_health", "worker_json",
           "schedule_json", "window_text", "totals_text", "attempt_text"]

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


def window_text(seconds: float) -> str:
    """The span a snapshot's pool counts cover, for a label: "the last 60 s"
    (0 from a server that does not say: "the metrics window")."""
    return f"the last {seconds:g} s" if seconds > 0 else "the metrics window"


# What each of a snapshot's totals counts: a pool's window counts are attempts,
# while most totals are tasks; shown side by side, the unit tells them apart.
_TOTAL_UNITS = (("tasks", ("submitted", "succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed",
                           "shed")),
                ("attempts", ("dispatched", "retries", "timeouts", "lease_expiries", "stale_completions")),
                ("schedule occurrences", ("recurring_conflicts", "recurring_invalid")))


def totals_text(totals: dict[str, int]) -> str:
    """A snapshot's totals on one line, grouped by what they count."""
    groups = []
    shown: set[str] = set()
    for unit, names in _TOTAL_UNITS:
        present = [name for name in names if name in totals]
        shown.update(present)
        if present:
            groups.append(f"{unit}: " + ", ".join(f"{name} {totals[name]}" for name in present))
    others = sorted(set(totals) - shown)   # a newer server's: named, without a unit we do not know
    if others:
        groups.append("other: " + ", ".join(f"{name} {totals[name]}" for name in others))
    return "since start, " + "; ".join(groups)


def shards_missing_text(shards: Sequence[str], left_out: str) -> str:
    """The note for an answer that leaves shards out ("shards b, c could not be asked: ...")."""
    names = ", ".join(shards)
    return (f"shard {names} could not be asked" if len(shards) == 1 else f"shards {names} could not be asked") + \
        (f": {left_out}" if left_out else "")


def attempt_text(attempt: int, max_attempts: int) -> str:
    """"2/3": the attempt of those allowed ("2" when the allowance is unknown)."""
    return f"{attempt}/{max_attempts}" if max_attempts else str(attempt)


# ---------------------------------------------------------------- enum names (proto values, stable)

# Literal tables (checked against the proto by tests/test_cli_units.py): parsing
# the command line must not import protobuf.
STATUS_NAMES = {0: "unspecified", 1: "blocked", 2: "scheduled", 3: "ready", 4: "running", 5: "retrying",
                6: "succeeded", 7: "failed", 8: "dead_lettered", 9: "cancelled", 10: "skipped", 11: "missed",
                12: "shed"}
PRIORITY_NAMES = {0: "normal", 1: "critical", 2: "high", 3: "normal", 4: "low"}
OVERLAP_NAMES = {0: "skip", 1: "skip", 2: "allow", 3: "queue", 4: "queue_on_success"}
HEALTH_NAMES = {0: "healthy", 1: "healthy", 2: "suspect"}   # WorkerHealth (unspecified: an older server)
CLASS_NAMES = CLASSES


# ---------------------------------------------------------------- JSON like the HTTP API
# Tasks, results and snapshots: cronoq._proto.json_view, shared with the gateway.


def _optional_ns(message: Any, field: str, out: dict[str, Any]) -> None:
    if message.HasField(field):
        out[field] = str(getattr(message, field))


def event_json(m: pb.StatusEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(m.id), "pool": m.pool}
    if m.key:
        out["key"] = m.key
    out.update(status=STATUS_NAMES.get(m.status, str(m.status)), attempt=m.attempt, at_unix_ns=str(m.at_unix_ns))
    if m.message:
        out["message"] = m.message
    if m.stage:   # a stage completed
        out["stage"] = m.stage
    if m.max_attempts:
        out["max_attempts"] = m.max_attempts
    return out


def worker_health(m: pb.WorkerInfo) -> str:
    return HEALTH_NAMES.get(m.health, "healthy")


def worker_json(m: pb.WorkerInfo) -> dict[str, Any]:
    return {"id": str(m.id), "name": m.name, "pool": m.pool, "labels": dict(sorted(m.labels.items())),
            "slots": m.slots, "busy": m.busy, "connected_unix_ns": str(m.connected_unix_ns),
            "health": worker_health(m), "lease_expiries": m.lease_expiries,
            "last_seen_unix_ns": str(m.last_seen_unix_ns)}


def schedule_json(m: pb.RecurringInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": m.name, "cron": m.cron}
    if m.tz:
        out["tz"] = m.tz
    out.update(pool=m.pool, kind=m.kind, overlap=OVERLAP_NAMES.get(m.overlap, "skip"))
    _optional_ns(m, "next_unix_ns", out)
    if m.HasField("last_task_id"):
        out["last_task_id"] = str(m.last_task_id)
    return out


