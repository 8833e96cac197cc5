"""What the test apps share: the handler that writes the execution log
(``key pid start_time end_time attempt``, one line per execution) and the
store the environment names (see app_plain.py)."""

import os
import time

from cronoq.contrib import store_from_url

LOG = os.environ["APP_LOG"]
SLEEP = float(os.environ.get("APP_SLEEP", "0.01"))


def work(ctx, payload):
    started = time.time()
    time.sleep(SLEEP)
    line = f"{payload['key']} {os.getpid()} {started:.6f} {time.time():.6f} {ctx.attempt}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())   # one write: lines of several processes never interleave
    finally:
        os.close(fd)
    return payload["key"]


def make_store():
    url = os.environ.get("APP_STORE", "")
    if not url:
        return None
    ttl = float(os.environ.get("APP_LEASE_TTL", "2.0"))
    options = {"member_ttl": ttl * 2, "request_timeout": 20.0}
    if url.startswith("sqlite"):
        options.update(lease_ttl=ttl, lease_renew=ttl / 5, lock_poll=0.1)
    else:
        options.update(session_timeout=ttl, keepalive=ttl / 5, lock_poll=0.1,
                       schema=os.environ.get("APP_SCHEMA", "public"))
    return store_from_url(url, **options)
