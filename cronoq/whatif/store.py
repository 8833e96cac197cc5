"""Build a trace from a durable store's history.

A store keeps, per task, its options (deadline and start as absolute
times), when it was submitted and finished, its final status and how many
attempts it used (the ``cronoq_tasks`` table, docs/operations.md). It keeps
no run times: the trace's attempts carry their outcome (from the status and
the attempt count) without one, and the trace's header gets an estimate per
kind, the median time from submission to end of the tasks of that kind that
succeeded at their first attempt (close to the run time when queues were
short). Give better figures in the policy file's ``[durations]`` table when
you have them.

A store keeps finished tasks for ``keep_finished`` (7 days by default) and
does not keep the pools' configuration: give it as ``policy=`` (the
scheduler, or policy data), or in the policy file's ``[base]`` table.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import statistics
from typing import Any, Mapping

from ..core.persist import spec_from_record
from ..core.types import NS
from ..store.schema import tables
from .policy import policy_of
from .trace import Trace, TracedAttempt, TracedTask, TraceError

__all__ = ["trace_from_store"]

_SUCCESS, _RETRYABLE, _PERMANENT = "success", "retryable", "permanent"


def trace_from_store(store: Any, *, schema: str | None = None, since: float | None = None,
                     until: float | None = None, policy: Any = None) -> Trace:
    """A trace of the tasks a store holds, submitted between ``since`` and
    ``until`` (Unix seconds; default all). ``store`` is a ``SqliteStore`` or
    ``PostgresStore`` (its database is read with a connection of its own),
    the path of a SQLite file, or a database URL (``sqlite:///...``,
    ``postgresql://...``; ``schema`` names the PostgreSQL schema, default
    ``public``). ``policy`` is the scheduler that used the store (its pools
    and resources) or policy data; without it the policy file must give them."""
    engine, schema = _engine(store, schema)
    t = tables(schema).tasks
    from sqlalchemy import select

    query = select(t.c.id, t.c.pool, t.c.record, t.c.status, t.c.attempt, t.c.submitted_ns,
                   t.c.finished_ns).order_by(t.c.submitted_ns, t.c.id)
    if since is not None:
        query = query.where(t.c.submitted_ns >= round(since * NS))
    if until is not None:
        query = query.where(t.c.submitted_ns <= round(until * NS))
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
    except SQLAlchemyError as exc:
        # (The URL is not repeated: it may hold a password.)
        raise ValueError(f"cannot read cronoq's tasks from the store: "
                         f"{getattr(exc, 'orig', None) or type(exc).__name__}") from None
    finally:
        engine.dispose()
    import json

    t0 = rows[0].submitted_ns if rows else round((since or 0.0) * NS)
    tasks: list[TracedTask] = []
    turnaround: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        try:
            record = json.loads(row.record)
            spec = spec_from_record(record, index)
        except (ValueError, TypeError) as exc:
            raise TraceError(f"the store's task {row.id} cannot be read: {exc}") from None
        if spec.pool is None:
            spec.pool = row.pool
        status = row.status if row.finished_ns is not None else None
        end_ns = None if row.finished_ns is None else row.finished_ns - t0
        attempts = _attempts(status, row.attempt)
        cancel_ns = end_ns if status == "cancelled" else None
        tasks.append(TracedTask(row.id, row.submitted_ns - t0, spec, None, attempts, status, end_ns, None,
                                cancel_ns))
        if status == "succeeded" and row.attempt == 1 and not spec.edges:
            ready = max(row.submitted_ns, spec.start_at_ns or 0)
            turnaround.setdefault(spec.kind, []).append(max(0, row.finished_ns - ready))
    estimates = {kind: statistics.median_low(values) / NS for kind, values in turnaround.items()}
    return Trace(t0, tasks, policy=_policy(policy), kind_durations=estimates,
                 meta={"source": "store", "durations_estimated": True})


def _attempts(status: str | None, count: int) -> list[TracedAttempt] | None:
    """The outcomes a final status and an attempt count imply (run times unknown)."""
    if count <= 0 or status is None:
        return None
    last = {"succeeded": _SUCCESS, "failed": _PERMANENT, "dead_lettered": _RETRYABLE}.get(status)
    if last is None:
        last = _SUCCESS   # cancelled while it ran, or ended by a rule the replay applies itself
    return [TracedAttempt(None, _RETRYABLE) for _ in range(count - 1)] + [TracedAttempt(None, last)]


def _policy(policy: Any) -> dict[str, Any] | None:
    if policy is None or isinstance(policy, Mapping):
        return None if policy is None else dict(policy)
    from .recorder import scheduler_of

    sched = scheduler_of(policy)
    return policy_of([p.config for p in sched.pools], list(sched.resources), sched.config)


def _engine(store: Any, schema: str | None) -> tuple[Any, str | None]:
    from sqlalchemy import create_engine

    path = getattr(store, "path", None)
    url = getattr(store, "url", None)
    if isinstance(path, str):                       # a SqliteStore
        return _sqlite(path), None
    if url is not None and not isinstance(store, (str, os.PathLike)):   # a PostgresStore
        return create_engine(url), schema or getattr(store, "schema", "public")
    if isinstance(store, os.PathLike) or (isinstance(store, str) and "://" not in store):
        return _sqlite(os.fspath(store)), None
    if isinstance(store, str):
        if store.startswith("sqlite:///"):
            return _sqlite(store[len("sqlite:///"):]), None
        if store.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            from sqlalchemy.engine import make_url

            parsed = make_url(store).set(drivername="postgresql+psycopg")
            return create_engine(parsed), schema or "public"
    raise ValueError("store must be a SqliteStore, a PostgresStore, a SQLite file's path, or a "
                     "sqlite:/// or postgresql:// URL")


def _sqlite(path: str) -> Any:
    from sqlalchemy import create_engine

    if not os.path.exists(path):
        raise ValueError(f"no SQLite file at {path!r}")
    uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
