"""A threaded WSGI app written the way docs/howto/threaded-apps.md shows,
for the tests that run it under real servers (tests/test_wsgi_servers.py).

Configured by environment variables: ``APP_LOG`` (the execution log the
handler appends to: ``key pid start_time end_time attempt``), ``APP_STORE`` (a
store URL; empty: in memory), ``APP_SCHEMA`` (PostgreSQL), ``APP_LEASE_TTL``, ``APP_START`` (``import``: start at
import, as the issue's users did; else on first use), ``APP_SLEEP``, ``APP_SLOTS``.
"""

import json
import os

import cronoq

from app_common import make_store, work

SLOTS = int(os.environ.get("APP_SLOTS", "8"))   # the pool's capacity, for all the processes together
scheduler = cronoq.BlockingScheduler(
    [cronoq.Pool("work", work, min=SLOTS, max=SLOTS, autoscale=False,
                 retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.05))],
    store=make_store(), shutdown_grace=5.0)
AT_IMPORT = os.environ.get("APP_START") == "import"
if AT_IMPORT:
    scheduler.start()   # as the users did (with --preload: in the master, before the fork)


def sched():
    return scheduler if AT_IMPORT else scheduler.ensure_started()


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/submit":
        key = environ.get("QUERY_STRING", "").partition("key=")[2]
        try:
            task_id = sched().enqueue({"key": key}, pool="work", key=key)
        except cronoq.CronoqError as exc:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{type(exc).__name__}: {exc}".encode()]
        body = {"id": task_id, "pid": os.getpid()}
    elif path == "/run":   # a handle's result, from whichever process serves the request
        key = environ.get("QUERY_STRING", "").partition("key=")[2]
        handle = sched().submit({"key": key}, pool="work", key=key)
        body = {"id": handle.id, "pid": os.getpid(), "result": handle.result(timeout=30),
                "status": sched().info(handle.id).status}
    elif path == "/whoami":
        body = {"pid": os.getpid(), "leading": sched().scheduler.leading}
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]
