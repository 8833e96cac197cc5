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

A third figure, ``cold first load``: a fresh browser context (empty cache,
the token already in the tab's sessionStorage) opens the Overview of a
server holding an hour's worth of history for ``--cold-pools`` pools (3,600
samples a pool, the count of an hour at the default 1 s interval: sampled
every 0.1 s over ``--fill-s`` seconds so the bench need not wait an hour,
with tasks running in every pool meanwhile), until every pool's four charts
are drawn with the whole range (the points of the page's first read, at
most 720 a series). Each of
``--cold-runs`` runs is timed from the navigation's start, with the bytes it
transferred (the navigation and every resource of the performance timeline).
Target: under 1 s.

    python bench/dashboard.py [--seconds 20] [--rate 10] [--backlog 10000] [--events 200]
                              [--cold-runs 5] [--cold-pools 4] [--fill-s 360]

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

pool = sys.argv[4] if len(sys.argv) > 4 else "default"
asyncio.run(Worker(sys.argv[1], pool, handle, slots=int(sys.argv[3]), token=sys.argv[2]).run())
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


def start_server(directory: Path, text: str = CONFIG) -> tuple[subprocess.Popen[str], int, int]:
    config = directory / f"bench-{len(list(directory.iterdir()))}.toml"
    config.write_text(text)
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
    since_ms = time.time() * 1000   # rows of older tasks that a re-read puts back are not new rows
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
        elif task_id in log.first and log.first[task_id] >= since_ms and task_id not in inserted:
            # A re-read re-inserts rows: a task's first insertion counts.
            inserted.add(task_id)
            inserts.append(at - log.first[task_id])
    print(f"{name}: {sent} tasks in {seconds:g} s, {log.count} events seen by the reader so far")
    print(f"  status change -> page: {percentiles(changes)}")
    print(f"  new task -> row:       {percentiles(inserts)}")
    return {"changes": changes, "inserts": inserts}


def cold_config(pools: int, fill_s: float) -> str:
    text = CONFIG.replace('[[pools]]\nname = "default"\n[[pools]]\nname = "idle"\n', "")
    text += f"[history]\ninterval_s = 0.1\nkept_s = {fill_s}\n"
    return text + "".join(f'[[pools]]\nname = "p{i}"\n' for i in range(pools))


# True once every pool card's four charts hold at least `points` points; then the time since navigation.
CHARTS_DRAWN = """
([pools, points]) => {
  const plots = document.querySelectorAll('#pools .history-plot[data-points]');
  if (plots.length < pools * 4) return false;
  for (const plot of plots) if (Number(plot.dataset.points) < points) return false;
  return performance.now();
}
"""

TRANSFERRED = """
() => [performance.getEntriesByType('navigation'), performance.getEntriesByType('resource')].flat()
  .reduce((sum, entry) => sum + (entry.transferSize || 0), 0)
"""


def cold_first_load(browser, directory: Path, args: argparse.Namespace) -> None:
    """The Overview opened cold on a server with an hour's worth of samples (see the docstring)."""
    server, grpc_port, http_port = start_server(directory, cold_config(args.cold_pools, args.fill_s))
    workers = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, f"127.0.0.1:{grpc_port}", WORKER, "8",
                                 f"p{i}"], stdin=subprocess.DEVNULL, env=env(), cwd=ROOT)
               for i in range(args.cold_pools)]
    base = f"http://127.0.0.1:{http_port}"
    try:
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60) as http:
            while sum(p["capacity"] for p in http.get("/v1/snapshot").json()["pools"]) < 8 * args.cold_pools:
                time.sleep(0.05)
            # Filling: every pool runs a varying load, so that every series has values to draw.
            started = time.monotonic()
            sent = 0
            while (elapsed := time.monotonic() - started) < args.fill_s:
                if sent < int(elapsed * 8):
                    pool = f"p{sent % args.cold_pools}"
                    http.post("/v1/tasks", json={"pool": pool, "payload": {"sleep": 0.2 + 0.3 * (sent % 7) / 7}})
                    sent += 1
                else:
                    time.sleep(0.01)
            kept = http.get("/v1/history", params={"points": "100000"}).json()
            samples = min(len(pool["t_unix_ms"]) for pool in kept["pools"])
            # What the page's first read holds: the points a series has at the page's 720 (fewer when
            # the buckets are aligned: 3,600 samples give buckets of 6, 600 points); a couple may age out.
            shown = http.get("/v1/history", params={"points": "720"}).json()
            expected = min(len(pool["t_unix_ms"]) for pool in shown["pools"]) - 2
            print(f"cold first load: {args.cold_pools} pools of {samples} samples each "
                  f"(3,600: an hour at the default 1 s interval), {sent} tasks run meanwhile")
            times, sizes = [], []
            for _ in range(args.cold_runs):
                context = browser.new_context(viewport={"width": 1280, "height": 1000})
                context.add_init_script(f"sessionStorage.setItem('cronoq.token', {json.dumps(ADMIN)})")
                page = context.new_page()
                page.goto(base + "/ui/#overview")
                drawn = page.wait_for_function(CHARTS_DRAWN, arg=[args.cold_pools, expected], timeout=60000,
                                               polling=10)
                times.append(float(drawn.json_value()))
                sizes.append(int(page.evaluate(TRANSFERRED)))
                context.close()
            print(f"  navigation -> every chart drawn: median {statistics.median(times):.0f} ms "
                  f"(min {min(times):.0f}, max {max(times):.0f}) over {len(times)} runs")
            print(f"  transferred: median {statistics.median(sizes) / 1024:.0f} KiB "
                  f"(min {min(sizes) / 1024:.0f}, max {max(sizes) / 1024:.0f})")
    finally:
        stop(server, workers)


def stop(server: subprocess.Popen[str], workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=10.0, help="tasks/s of the light scenario")
    parser.add_argument("--backlog", type=int, default=10000, help="pending tasks of the loaded scenario")
    parser.add_argument("--events", type=float, default=200.0, help="status events/s of the loaded scenario")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold first loads of the Overview")
    parser.add_argument("--cold-pools", type=int, default=4, help="pools of the cold first load's server")
    parser.add_argument("--fill-s", type=float, default=360.0,
                        help="seconds sampling the cold server's history every 0.1 s (360: 3,600 samples)")
    parser.add_argument("--skip-cold", action="store_true", help="only the status-change scenarios")
    args = parser.parse_args()
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        sys.exit("no Chromium on this system (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as directory, sync_playwright() as playwright:
        args_ = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args_)
        print(f"chromium {browser.version}; commit {commit()}; load average {os.getloadavg()[0]:.2f} at start")
        if not args.skip_cold:
            cold_first_load(browser, Path(directory), args)
        server, grpc_port, http_port = start_server(Path(directory))
        workers = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, f"127.0.0.1:{grpc_port}", WORKER, "64"],
                                    stdin=subprocess.DEVNULL, env=env(), cwd=ROOT) for _ in range(2)]
        base = f"http://127.0.0.1:{http_port}"
        try:
            with httpx.Client(base_url=base, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60) as http:
                while http.get("/v1/snapshot").json()["pools"][0]["capacity"] < 128:
                    time.sleep(0.05)
                log = EventLog(base)
                log.ready.wait(30)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(base + "/ui/#tasks?pool=default&limit=500&order=newest")
                page.fill("#token", ADMIN)
                page.click("#login-form button[type=submit]")
                page.wait_for_selector('#conn[data-state="live"]', timeout=30000)
                page.wait_for_function("() => document.querySelector('#task-filters [name=pool]').value === "
                                       "'default'", timeout=30000)
                page.evaluate(OBSERVER)
                print("server and 2 workers of 64 slots, one run")
                scenario("light", page, http, log, seconds=args.seconds, rate=args.rate, sleep=0.3)
                for start in range(0, args.backlog, 1000):
                    http.post("/v1/tasks:batch", json={"tasks": [{"pool": "idle"}] * min(1000, args.backlog - start)})
                live = http.get("/v1/snapshot").json()["live_tasks"]
                print(f"loaded: {live} live tasks")
                # Newest first, the page's first page is where the new tasks land.
                scenario("loaded", page, http, log, seconds=args.seconds, rate=args.events / 3, sleep=0.3)
                log.stop = True
        finally:
            stop(server, workers)
            browser.close()
        print(f"load average {os.getloadavg()[0]:.2f} at the end")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

if __name__ == "__main__":
    main()
