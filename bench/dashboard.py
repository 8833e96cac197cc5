"""How long a status change takes to reach the dashboard's page.

A ``cronoq-server`` process (in memory, tokens on) with worker processes, and
the dashboard (/ui) in the distribution's headless Chromium driven by
Playwright, signed in with an admin token, on the tasks page (pool
``default``, 500 per page). A MutationObserver in the page notes, for every
task row, when its status cell changes and when a row is inserted
(``Date.now()``, milliseconds of the wall clock); an SSE reader in this
process notes every status event's ``at_unix_ns``: the time the scheduler
made the change (the same wall clock: one machine). The latency of a change
is the page's time minus the scheduler's.

Two figures per scenario:

- ``status change -> page``: a row already on the page changes status
  (running -> succeeded, retrying, ...); the event is pushed and the row
  patched in place. Target: p99 < 500 ms (ChopFlow's dashboard polls every
  2 s: its p50 is about 1 s and its p99 about 2 s plus a request).
- ``new task -> row``: a task's first event to its row being inserted (the
  page re-reads the last page of the list, at most every 250 ms).

Scenarios: ``light`` (``--rate`` tasks/s of 300 ms), and ``loaded``: first
``--backlog`` (10,000) tasks pending in a pool no worker serves (live tasks the
server holds), then tasks at a rate giving about ``--events`` status events
per second (three per task), as the issue asks the page to withstand.

    python bench/dashboard.py [--seconds 20] [--rate 10] [--backlog 10000] [--events 200]

The server and the workers are child processes of this one, stopped by pid
at the end. The machine is shared and noisy: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "bench-admin-token-0123456789abcdef"
WORKER = "bench-worker-token-0123456789abcde"
CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 1
[limits]
max_list = 1000
[[auth.tokens]]
token = "{ADMIN}"
role = "admin"
[[auth.tokens]]
token = "{WORKER}"
role = "worker"
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""

WORKER_SCRIPT = r"""
import asyncio, sys
from cronoq.client import Worker

async def handle(lease):
    await asyncio.sleep((lease.json() or {}).get("sleep", 0))
    return None

asyncio.run(Worker(sys.argv[1], "default", handle, slots=int(sys.argv[3]), token=sys.argv[2]).run())
"""

# Installed in the page: when a row's status changes, or a row appears, note the time.
OBSERVER = """
() => {
  window.__seen = [];
  const body = document.querySelector('#task-table tbody');
  new MutationObserver((changes) => {
    const now = Date.now();
    for (const change of changes) {
      if (change.type === 'attributes' && change.attributeName === 'data-status') {
        window.__seen.push(['change', change.target.dataset.id, change.target.dataset.status, now]);
      } else if (change.type === 'childList') {
        for (const row of change.addedNodes) {
          if (row.dataset) window.__seen.push(['insert', row.dataset.id, row.dataset.status, now]);
        }
      }
    }
  }).observe(body, {subtree: true, childList: true, attributes: true, attributeFilter: ['data-status']});
}
"""


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([out["PYTHONPATH"]] if out.get("PYTHONPATH") else []))
    return out


def start_server(directory: Path) -> tuple[subprocess.Popen[str], int, int]:
    config = directory / "bench.toml"
    config.write_text(CONFIG)
    process = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env(), cwd=ROOT)
    assert process.stderr is not None
    ports = None
    for line in process.stderr:
        match = re.search(r"listening: grpc [^ ]+:(\d+), http http://[^ ]+:(\d+)", line)
        if match:
            ports = int(match.group(1)), int(match.group(2))
        if "serving as the leader" in line:
            break
    assert ports is not None, "the server did not start"
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()   # drain its log
    return process, ports[0], ports[1]


class EventLog:
    """Reads /v1/events on a thread: (task id, status) -> the scheduler's time, in ms."""

    def __init__(self, base: str) -> None:
        self.at: dict[tuple[str, str], float] = {}
        self.first: dict[str, float] = {}
        self.count = 0
        self.ready = threading.Event()
        self.stop = False
        threading.Thread(target=self._read, args=(base,), daemon=True).start()

    def _read(self, base: str) -> None:
        headers = {"authorization": f"Bearer {ADMIN}"}
        with httpx.stream("GET", base + "/v1/events", params={"snapshot_s": "0"}, headers=headers,
                          timeout=None) as response:
            event = ""
            for line in response.iter_lines():
                if self.stop:
                    return
                if line.startswith("event:"):
                    event = line[6:].strip()
                    if event == "hello":
                        self.ready.set()
                elif line.startswith("data:") and event == "status":
                    for e in json.loads(line[5:]):
                        at = int(e["at_unix_ns"]) / 1e6
                        self.at[(e["id"], e["status"])] = at
                        self.first.setdefault(e["id"], at)
                        self.count += 1


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    values = sorted(values)
    p = lambda q: values[min(len(values) - 1, int(q * len(values)))]   # noqa: E731
    return (f"n={len(values)}: p50 {statistics.median(values):.0f} ms, p90 {p(0.90):.0f} ms, "
            f"p99 {p(0.99):.0f} ms, max {values[-1]:.0f} ms")


def scenario(name: str, page, http: httpx.Client, log: EventLog, *, seconds: float, rate: float,
             sleep: float) -> dict[str, list[float]]:
    page.evaluate("window.__seen = []")
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate) + 1
        if due > sent:
            http.post("/v1/tasks", json={"payload": {"sleep": sleep}})
            sent += 1
        else:
            time.sleep(0.002)
    time.sleep(2.0)   # the last ones finish and reach the page
    seen = page.evaluate("window.__seen")
    changes, inserts = [], []
    inserted: set[str] = set()
    for kind, task_id, status, at in seen:
        if kind == "change":
            made = log.at.get((task_id, status))
            if made is not None:
                changes.append(at - made)
        elif task_id in log.first and task_id not in inserted:   # re-reads re-insert rows: the first counts
            inserted.add(task_id)
            inserts.append(at - log.first[task_id])
    print(f"{name}: {sent} tasks in {seconds:g} s, {log.count} events seen by the reader so far")
    print(f"  status change -> page: {percentiles(changes)}")
    print(f"  new task -> row:       {percentiles(inserts)}")
    return {"changes": changes, "inserts": inserts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=10.0, help="tasks/s of the light scenario")
    parser.add_argument("--backlog", type=int, default=10000, help="pending tasks of the loaded scenario")
    parser.add_argument("--events", type=float, default=200.0, help="status events/s of the loaded scenario")
    args = parser.parse_args()
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        sys.exit("no Chromium on this system (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as directory:
        server, grpc_port, http_port = start_server(Path(directory))
        workers = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, f"127.0.0.1:{grpc_port}", WORKER, "64"],
                                    stdin=subprocess.DEVNULL, env=env(), cwd=ROOT) for _ in range(2)]
        base = f"http://127.0.0.1:{http_port}"
        try:
            with httpx.Client(base_url=base, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60) as http, \
                    sync_playwright() as playwright:
                while http.get("/v1/snapshot").json()["pools"][0]["capacity"] < 128:
                    time.sleep(0.05)
                log = EventLog(base)
                log.ready.wait(30)
                args_ = ["--no-sandbox"] if os.geteuid() == 0 else []
                browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args_)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(base + "/ui/#tasks")
                page.fill("#token", ADMIN)
                page.click("#login-form button[type=submit]")
                page.wait_for_selector('#conn[data-state="live"]', timeout=30000)
                page.select_option("#task-filters [name=pool]", "default")
                page.select_option("#task-filters [name=limit]", "500")
                page.click("#task-filters button[type=submit]")
                page.evaluate(OBSERVER)
                print(f"chromium {browser.version}, server and 2 workers of 64 slots, one run")
                scenario("light", page, http, log, seconds=args.seconds, rate=args.rate, sleep=0.3)
                for start in range(0, args.backlog, 1000):
                    http.post("/v1/tasks:batch", json={"tasks": [{"pool": "idle"}] * min(1000, args.backlog - start)})
                live = http.get("/v1/snapshot").json()["live_tasks"]
                print(f"loaded: {live} live tasks")
                # The page shows the default pool's tasks from the last one of the light scenario on
                # (as its Next page button would), so the new ones land on it.
                done = http.get("/v1/tasks", params={"pool": "default", "limit": "1000"}).json()["tasks"]
                page.evaluate("(after) => { app.tasks.after = after; loadTasks(); }",
                              done[-1]["id"] if done else "0")
                scenario("loaded", page, http, log, seconds=args.seconds, rate=args.events / 3, sleep=0.3)
                log.stop = True
                browser.close()
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)


if __name__ == "__main__":
    main()
