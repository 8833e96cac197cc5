"""A WSGI deployment under load: gunicorn (gthread) with 2 workers x 8
threads against 1 worker x 8 threads, in the same run, on a shared SQLite
store and on a throwaway PostgreSQL.

The app is tests/wsgi_apps/app_plain.py (a module-level BlockingScheduler,
the cronoq.contrib.gunicorn hooks; its pool's capacity, which counts the
slots of all processes together, is 8 per process): each request submits one task with a key
(``GET /submit?key=...``); the handler sleeps ``--work`` seconds (I/O-like
work) and appends a line to an execution log. ``--tasks`` requests come from
``--clients`` threads, a quarter of the keys sent twice (retried keys).

Figures, median over ``--repeat`` runs of each configuration:
- requests/s: acknowledged requests (retries included) / time to send them all;
- executions/s: distinct keys / time from the first request to the last
  execution's end;
- executions on each process (the spread), duplicates (must be 0).

    python bench/wsgi.py [--tasks 2000] [--clients 16] [--work 0.01] [--repeat 3] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import wsgikit  # noqa: E402

HOOKS = os.path.join(wsgikit.APPS, "gunicorn_hooks.py")


def one_run(store: str, workers: int, args: argparse.Namespace, pg_url: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"APP_LOG": os.path.join(tmp, "executions.log"), "APP_LEASE_TTL": "5.0", "APP_SLEEP": str(args.work),
               # The pool's capacity is the cluster's: 8 slots per process, as many as its threads.
               "APP_SLOTS": str(8 * workers)}
        if store == "sqlite":
            env["APP_STORE"] = "sqlite:///" + os.path.join(tmp, "tasks.db")
        else:
            assert pg_url is not None
            env["APP_STORE"] = pg_url
            env["APP_SCHEMA"] = f"b_{uuid.uuid4().hex[:10]}"
        server = wsgikit.gunicorn(tmp, "app_plain:app", workers=workers, threads=8, env=env, conf=HOOKS)
        try:
            server.wait_ready()
            server.whoami(4 * workers)
            keys = [f"k{i}" for i in range(args.tasks)]
            t0 = time.time()
            load = wsgikit.drive(server, keys, clients=args.clients)
            sent = time.time() - t0
            runs = wsgikit.wait_executed(env["APP_LOG"], set(load.acked), timeout=600)
            last = max(run.end for rs in runs.values() for run in rs)
            per_pid: dict[int, int] = {}
            for rs in runs.values():
                for run in rs:
                    per_pid[run.pid] = per_pid.get(run.pid, 0) + 1
            return {
                "requests/s": load.requests / sent,
                "executions/s": len(runs) / (last - t0),
                "missing": len(set(load.acked) - set(runs)),
                "duplicates": sum(len(rs) - 1 for rs in runs.values()),
                "failed requests": len(load.failures),
                "spread": "/".join(str(n) for n in sorted(per_pid.values(), reverse=True)),
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--work", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()

    stores = ["sqlite"] if args.no_postgres else ["sqlite", "postgres"]
    pg = None
    if "postgres" in stores:
        import pgserver

        pg = pgserver.PgServer().start()
    try:
        print(f"{args.tasks} keys (+25 % retried) from {args.clients} clients, handler {args.work * 1000:g} ms, "
              f"gunicorn gthread x 8 threads, median of {args.repeat}")
        print(f"{'store':9} {'workers':>7} {'requests/s':>11} {'executions/s':>13}  spread (last run)  "
              f"missing/duplicates/failed requests (all runs)")
        for store in stores:
            for workers in (1, 2):
                results = []
                for _ in range(args.repeat):    # the configurations alternate within a store
                    results.append(one_run(store, workers, args, pg.url if pg else None))
                req = statistics.median(r["requests/s"] for r in results)
                exe = statistics.median(r["executions/s"] for r in results)
                bad = "/".join(str(sum(int(r[k]) for r in results))
                               for k in ("missing", "duplicates", "failed requests"))
                print(f"{store:9} {workers:>7} {req:>11.0f} {exe:>13.0f}  {results[-1]['spread']:17}  {bad}",
                      flush=True)
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    main()
