"""Headless Chromium for the dashboard's tests (tests/test_dashboard.py) and
bench/dashboard.py: the distribution's browser driven by Playwright for
Python (never a downloaded one).

``find_browser()`` names the system Chromium, or why there is none; the
``browser`` fixture of the tests skips with that reason, or fails when
CRONOQ_REQUIRE_BROWSER=1 (as .ci/run sets). ``DashWorker`` is a worker
process whose handler does what the payload says.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx

from serverkit import ROOT, WORKER, server_env

CANDIDATES = ("chromium", "chromium-browser")


REQUIRE_VARIABLE = "CRONOQ_REQUIRE_BROWSER"


def required() -> bool:
    """Must the browser tests run here (``CRONOQ_REQUIRE_BROWSER`` set, not 0)?"""
    return os.environ.get(REQUIRE_VARIABLE, "").strip() not in ("", "0")


def find_browser() -> tuple[str | None, str]:
    """(path of the system Chromium, or None; the reason when None)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None, "Playwright for Python is not installed (pip install -e '.[dev]')"
    given = os.environ.get("CRONOQ_CHROMIUM")
    if given:
        return (given, "") if os.access(given, os.X_OK) else (None, f"CRONOQ_CHROMIUM={given} is not executable")
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, "no Chromium on this system (apt-get install chromium)"


def launch(playwright, executable: str):
    # As root (containers), Chromium refuses to start with its sandbox.
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return playwright.chromium.launch(executable_path=executable, headless=True, args=args)


WORKER_SCRIPT = r"""
import asyncio, sys
import cronoq
from cronoq.client import Worker

target, pool, token, slots = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def explode(text):
    raise ValueError(text)

async def handle(lease):
    order = lease.json() if lease.payload else {}
    if "raise" in order:
        explode(order["raise"])
    if "output_size" in order:
        return "x" * order["output_size"]
    for stage in order.get("checkpoint", []):
        if stage not in lease.checkpoints:
            await lease.checkpoint(stage, {"stage": stage})
    if order.get("fail") or lease.attempt < order.get("fail_until", 0):
        raise cronoq.Retryable("failed as asked", retry_after=0.01)
    await asyncio.sleep(order.get("sleep", 0))
    return {"slept": order.get("sleep", 0), "attempt": lease.attempt}

print("ready", flush=True)
asyncio.run(Worker(target, pool, handle, slots=slots, token=token, name=f"dash-{pool}",
                   initial_backoff=0.05, max_backoff=0.5).run())
"""


class DashWorker:
    """A worker process serving ``pool`` with ``slots`` slots: a payload
    ``{"sleep": s}`` sleeps s seconds, ``{"fail": true}`` fails (retryable),
    ``{"fail_until": n}`` fails the attempts before the n-th, ``{"checkpoint":
    [stages]}`` first checkpoints those of the stages not yet saved, ``{"raise":
    text}`` raises ValueError(text) from a nested function (a traceback of two
    frames), ``{"output_size": n}`` returns n bytes of text."""

    def __init__(self, target: str, pool: str = "default", slots: int = 1, token: str = WORKER) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, target, pool, token, str(slots)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=server_env(), cwd=ROOT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def wait_until(predicate, timeout: float = 30.0, what: str = "a condition") -> None:
    """Poll ``predicate`` (an HTTP question) until true; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)



WAIT_MS = 30_000   # how long a browser test waits for what the page should show


def api(server, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}",
                        headers={"authorization": f"Bearer {token}"}, timeout=60)


def capacity(http: httpx.Client, pool: str = "default") -> int:
    snap = http.get("/v1/snapshot").json()
    return next(p["capacity"] for p in snap["pools"] if p["name"] == pool)


def open_page(browser, server, token: str | None, page_name: str = "overview", viewport=(1280, 800)):
    """A fresh page (its own sessionStorage) signed in with ``token``, live."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{server.http_port}/ui/#{page_name}")
    if token is not None:
        sign_in(page, token)
    return page


def sign_in(page, token: str, state: str = "live"):
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector(f'#conn[data-state="{state}"]', timeout=WAIT_MS)


__all__ = ["find_browser", "required", "launch", "DashWorker", "wait_until", "REQUIRE_VARIABLE", "WAIT_MS", "api", "capacity",
           "open_page", "sign_in"]
