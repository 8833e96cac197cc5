"""``cronoq top`` in a pseudo-terminal, its screen read through a terminal
emulator (pyte), against real cronoq-server processes: pools, a worker
connecting, a task appearing and finishing, q quitting, the role each pane
needs, 10,000 live tasks, a standby that takes over and a restarted server.
``cronoq watch`` reconnecting is checked beside the restart."""

from __future__ import annotations

import json
import signal

import pytest

from clikit import EchoWorker, Lines, Terminal, cli_env, cronoq, script
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "batch"
"""


def top(server, token: str = ADMIN, *args: str, columns: int = 150, lines: int = 50) -> Terminal:
    return Terminal([script(), "top", "--interval", "0.3", *args], cli_env(token, server.target),
                    columns=columns, lines=lines)


def panes(screen: str) -> dict[str, str]:
    """The screen cut at the panes' titles (stacked layout: narrower than 160 columns)."""
    found: dict[str, str] = {}
    current = "header"
    for line in screen.splitlines():
        for title in ("Pools", "Workers", "Live tasks", "Recent events"):
            if line.startswith(title):
                current = title
        found[current] = found.get(current, "") + line + "\n"
    return found


def quit_with_q(term: Terminal) -> None:
    term.send(b"q")
    assert term.wait(30) == 0


def submit(server, *args: str) -> int:
    result = cronoq("submit", *args, token=ADMIN, server=server.target)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_top_shows_pools_a_worker_connecting_a_task_running_and_finishing_and_q_quits(servers):
    server = servers(CONFIG)
    term = top(server)
    worker = None
    try:
        screen = term.wait_for(lambda s: "Workers (0)" in s and "\ndefault " in s and "\nbatch " in s)
        header = screen.splitlines()[0]
        assert header.startswith("cronoq top") and "q quit" in header and "r refresh" in header
        assert "CAPACITY" in panes(screen)["Pools"] and "WAIT P50" in panes(screen)["Pools"]

        worker = EchoWorker(server.target, "default", name="top-worker", token=WORKER, labels={"zone": "a"})
        term.wait_for(lambda s: ["top-worker", "default", "0/4", "zone=a"] in
                      [line.split()[:4] for line in panes(s).get("Workers", "").splitlines()])

        task = submit(server, "2", "--kind", "sleep", "--key", "top-task")

        def running(s: str) -> bool:
            rows = [line.split() for line in panes(s).get("Live tasks", "").splitlines()]
            return [str(task), "running", "default", "top-task"] in [r[:4] for r in rows]

        term.wait_for(running)

        def finished(s: str) -> bool:   # gone from the live tasks; its events newest first
            shown = panes(s)
            events = [line.split()[1:6] for line in shown.get("Recent events", "").splitlines()]
            ended, started = [str(task), "default", "succeeded", "1/3", "top-task"], [str(task), "default", "running",
                                                                                      "1/3", "top-task"]
            return "top-task" not in shown.get("Live tasks", "") and ended in events and started in events \
                and events.index(ended) < events.index(started)

        term.wait_for(finished)
        term.send(b"r")
        quit_with_q(term)
    finally:
        term.close()
        if worker is not None:
            worker.stop()


def test_panes_say_which_role_they_need(servers):
    server = servers(CONFIG)
    as_client, as_metrics = top(server, CLIENT), top(server, METRICS)
    try:
        screen = as_client.wait_for(lambda s: "needs the metrics role" in panes(s).get("Pools", "")
                                    and "Live tasks (" in s)
        assert "needs the metrics role" in panes(screen)["Workers"]
        assert "needs the" not in panes(screen)["Live tasks"] + panes(screen)["Recent events"]
        # (the pools too: the event pane's denial can draw a frame before the refresh's calls all answered)
        screen = as_metrics.wait_for(lambda s: "needs the client role" in panes(s).get("Live tasks", "")
                                     and "needs the client role" in panes(s).get("Recent events", "")
                                     and "loading" not in panes(s).get("Pools", ""))
        assert "\ndefault " in panes(screen)["Pools"] and "needs the" not in panes(screen)["Pools"]
        quit_with_q(as_client)
        quit_with_q(as_metrics)
    finally:
        as_client.close()
        as_metrics.close()


def test_top_stays_responsive_with_10000_live_tasks(servers):
    from cronoq.client import BlockingClient

    server = servers(CONFIG)
    with BlockingClient(server.target, token=CLIENT) as client:
        for start in range(0, 10_000, 1000):
            client.submit_batch([{"payload": b"", "pool": "batch", "key": f"bulk-{i}"}
                                 for i in range(start, start + 1000)])
    term = top(server, ADMIN, "--tasks", "200", "--pool", "batch")
    try:
        def loaded(s: str) -> bool:   # a whole frame: the header, the pool's row, the task pane cut short
            shown = panes(s)
            rows = [line.split()[:5] for line in shown.get("Pools", "").splitlines()]
            # POOL CAPACITY DESIRED BUSY PENDING: no worker, but the pool asks for some (its autoscaler).
            return "pending 10000" in s.splitlines()[0] and \
                any(r[:2] == ["batch", "0"] and r[3:] == ["0", "10000"] and r[2] not in ("0", "") for r in rows) and \
                "Live tasks in batch (200+, running first)" in s and "more" in shown.get("Live tasks", "")

        term.wait_for(loaded)
        term.send(b"r")
        cancelled = cronoq("cancel", "--key", "bulk-0", token=ADMIN, server=server.target)
        assert cancelled.returncode == 0
        term.wait_for(lambda s: "pending 9999" in s.splitlines()[0])
        quit_with_q(term)
    finally:
        term.close()


def sqlite_config(path) -> str:
    return LISTEN + AUTH + f"""
[store]
kind = "sqlite"
path = "{path}"
lease_ttl_s = 2
lease_renew_s = 0.3
lock_poll_s = 0.1
full_sync = false
[[pools]]
name = "default"
"""


def test_a_standby_shows_the_error_and_top_recovers_when_it_takes_over(servers, tmp_path):
    config = sqlite_config(tmp_path / "state.db")
    leader = servers(config, name="leader")
    standby = servers(config, name="standby", wait_for="standing by")
    term = top(standby)
    try:
        screen = term.wait_for(lambda s: "not the leader" in panes(s).get("Pools", "")
                               and "not the leader" in panes(s).get("Live tasks", ""))
        assert "unavailable" in panes(screen)["Pools"]
        leader.stop()
        standby.wait_for("serving as the leader", 60)
        term.wait_for(lambda s: "\ndefault " in panes(s).get("Pools", "") and "Workers (0)" in s
                      and "not the leader" not in s)
        quit_with_q(term)
    finally:
        term.close()


def test_top_and_watch_reconnect_to_a_restarted_server(servers):
    first = servers(CONFIG, name="first")
    port = first.grpc_port
    term = top(first)
    watch = Lines([script(), "watch", "--all", "-o", "json"], cli_env(CLIENT, first.target))
    worker = None
    try:
        term.wait_for(lambda s: "\ndefault " in panes(s).get("Pools", ""))
        for attempt in range(30):   # until the watch streams from the first server
            task = submit(first, "x", "--key", f"before-restart-{attempt}")
            if watch.wait_for(lambda lines: any(f'"id": "{task}"' in line for line in lines), 2):
                break
        first.stop()
        term.wait_for(lambda s: "unavailable" in panes(s).get("Pools", ""))
        # The same address again (the first server bound it; it is free once that one stopped).
        second = servers(CONFIG.replace('grpc_addr = "127.0.0.1:0"', f'grpc_addr = "127.0.0.1:{port}"'),
                         name="second")
        assert second.grpc_port == port
        term.wait_for(lambda s: "\ndefault " in panes(s).get("Pools", "") and "unavailable" not in s)
        worker = EchoWorker(second.target, "default", name="after-restart", token=WORKER)
        second.wait_for("'after-restart' registered")
        task = None
        for attempt in range(30):   # until the watch streams from the second server
            task = submit(second, "x", "--key", f"after-restart-{attempt}")
            assert cronoq("wait", str(task), token=ADMIN, server=second.target).returncode == 0
            if watch.wait_for(lambda lines: any(f'"id": "{task}"' in line and "succeeded" in line
                                                for line in lines), 2):
                break
        events = [json.loads(line) for line in watch.lines if f'"id": "{task}"' in line]
        assert events[-1]["status"] == "succeeded" and events[-1]["key"] == f"after-restart-{attempt}"
        term.wait_for(lambda s: f"after-restart-{attempt}" in panes(s).get("Recent events", ""))
        quit_with_q(term)
    finally:
        term.close()
        code, stderr = watch.interrupt()
        if worker is not None:
            worker.stop()
    assert code == 0 and "reconnecting" in stderr


def test_at_80x24_top_starts_with_the_recent_events_and_cuts_no_column(servers):
    server = servers(CONFIG)
    worker = EchoWorker(server.target, "default", name="early-worker", token=WORKER)
    term = None
    try:
        server.wait_for("'early-worker' registered")
        task = submit(server, "x", "--key", "before-top")
        assert cronoq("wait", str(task), token=ADMIN, server=server.target).returncode == 0
        term = top(server, columns=80, lines=24)
        # The task ended before top started: its events come from the ones the server kept.
        screen = term.wait_for(lambda s: "before-top" in panes(s).get("Recent events", "")
                               and "\ndefault " in panes(s).get("Pools", ""))
        events = [line.split()[1:6] for line in panes(screen)["Recent events"].splitlines()]
        assert [str(task), "default", "succeeded", "1/3", "before-top"] in events, screen
        lines = screen.splitlines()
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert "…" not in "\n".join(line for line in lines if "POOL" in line), screen   # headers whole
        assert "attempts in the last 60 s" in panes(screen)["Pools"]
        quit_with_q(term)
    finally:
        if term is not None:
            term.close()
        worker.stop()


def test_top_and_watch_end_alike_on_an_unknown_pool(servers):
    server = servers(CONFIG)
    watched = cronoq("watch", "--pool", "nope", token=ADMIN, server=server.target)
    assert watched.returncode == 3
    message = watched.stderr.decode().strip()
    assert message == "cronoq: no pool named 'nope' (pools: default, batch)"
    term = top(server, ADMIN, "--pool", "nope")
    try:
        assert term.wait(30) == 3   # it retried forever
        assert message in term.display()   # the same line, on the screen top restored
    finally:
        term.close()
