"""Real deployments: a threaded WSGI app (tests/wsgi_apps) under real servers
(gunicorn gthread with 2 workers, waitress, the Flask reloader) on free
loopback ports, with a shared store (SQLite, the throwaway PostgreSQL) or in
memory. Each test drives bounded load with retried keys and counts from the
execution log the handlers write: every acknowledged key ran, none twice
outside the at-least-once window (an attempt cut short by a killed process),
the work spread over the processes, no request hung. Each test stops the
processes it started, by pid (tests/wsgikit.py)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import wsgikit

pytest.importorskip("gunicorn")
pytest.importorskip("waitress")
pytest.importorskip("flask")

pytestmark = pytest.mark.timeout(600)

HOOKS = os.path.join(wsgikit.APPS, "gunicorn_hooks.py")


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request, tmp_path):
    """The app's environment for a shared store of each kind."""
    env = {"APP_LOG": str(tmp_path / "executions.log"), "APP_LEASE_TTL": "2.0"}
    if request.param == "sqlite":
        env["APP_STORE"] = "sqlite:///" + str(tmp_path / "tasks.db")
    else:
        server = request.getfixturevalue("pg_server")
        env["APP_STORE"] = server.url
        env["APP_SCHEMA"] = f"w_{uuid.uuid4().hex[:10]}"
    return env


@pytest.fixture
def sqlite_env(tmp_path):
    return {"APP_LOG": str(tmp_path / "executions.log"), "APP_LEASE_TTL": "2.0",
            "APP_STORE": "sqlite:///" + str(tmp_path / "tasks.db")}


def keys(n: int, prefix: str = "k") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def check_load(load: wsgikit.Load, sent: list[str]) -> None:
    """Every key acknowledged, each with one id however often it was sent, no request hung."""
    assert load.hangs == 0, f"{load.hangs} requests hung"
    assert set(load.acked) == set(sent), f"not acknowledged: {sorted(set(sent) - set(load.acked))[:10]}"
    several = {k: ids for k, ids in load.answers.items() if len(ids) > 1}
    assert not several, f"retried keys answered with different ids: {dict(list(several.items())[:5])}"


def check_runs(runs: dict[str, list[wsgikit.Run]], acked: set[str], *, window: tuple[float, float] | None = None
               ) -> int:
    """Every acknowledged key ran; one ran twice only if its first run started
    within ``window`` (wall-clock seconds: from before a leader was killed until
    a new one led), the at-least-once window of docs/operations.md. Returns how
    many ran twice."""
    missing = acked - set(runs)
    assert not missing, f"{len(missing)} acknowledged keys never ran: {sorted(missing)[:10]}"
    twice = {k: r for k, r in runs.items() if len(r) > 1}
    if window is not None:
        start, end = window
        outside = {k: r for k, r in twice.items() if not start <= r[0].start <= end}
    else:
        outside = twice
    assert not outside, f"ran twice outside the at-least-once window: {dict(list(outside.items())[:5])}"
    return len(twice)


def run_pids(runs: dict[str, list[wsgikit.Run]]) -> dict[int, int]:
    count: dict[int, int] = {}
    for rs in runs.values():
        for run in rs:
            count[run.pid] = count.get(run.pid, 0) + 1
    return count


def serve(server: wsgikit.Server):
    """Start ``server``, wait until it answers; stop it (by pid) after the test."""
    try:
        server.wait_ready()
    except BaseException:
        server.kill_group()
        raise
    return server


# ---------------------------------------------------------------- gunicorn, 2 workers


@pytest.mark.parametrize("preload", [False, True], ids=["fork-then-import", "preload"])
def test_gunicorn_two_workers_are_one_scheduler(store_env, tmp_path, preload):
    # Handlers slow enough that one process's 8 threads cannot keep up: the leader places work on both.
    env = dict(store_env, APP_SLEEP="0.05")
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=8, preload=preload,
                                    env=env))
    try:
        # Rounds of load until both workers served requests and ran tasks (a
        # worker that starts on its first request joins a moment later), at most 5.
        acked: set[str] = set()
        workers: set[int] = set()
        for round_ in range(5):
            batch = keys(300, prefix=f"r{round_}-")
            load = wsgikit.drive(server, batch, clients=12)
            check_load(load, batch)
            acked |= set(load.acked)
            workers |= set(load.by_pid)
            runs = wsgikit.wait_executed(env["APP_LOG"], acked)
            check_runs(runs, acked)
            if len(workers) == 2 and set(run_pids(runs)) == workers:
                break
        assert len(workers) == 2, f"one worker served every request: {workers}"
        assert set(run_pids(runs)) == workers, f"executions {run_pids(runs)}, workers {workers}"
        # Handles, results and info from either process (until both answered, at most 240 requests).
        answered: dict[int, int] = {}
        lock = threading.Lock()

        def run(i: int) -> None:
            with lock:
                if set(answered) == workers:
                    return
            status, body = server.get(f"/run?key=r{i}", timeout=40)
            assert status == 200, body
            data = json.loads(body)
            assert data["result"] == f"r{i}" and data["status"] == "succeeded", data
            with lock:
                answered[data["pid"]] = answered.get(data["pid"], 0) + 1

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for future in [pool.submit(run, i) for i in range(240)]:
                future.result()
        assert set(answered) == workers, f"only {answered} answered /run"
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


def test_gunicorn_preload_with_a_scheduler_started_at_import_and_the_hooks(sqlite_env, tmp_path):
    """The issue's --preload case: started in the master at import. The
    when_ready hook stops the master's; each worker starts its own."""
    env = dict(sqlite_env, APP_START="import")
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=8, preload=True,
                                    env=env, conf=HOOKS))
    try:
        sent = keys(200)
        load = wsgikit.drive(server, sent, clients=12)
        check_load(load, sent)
        runs = wsgikit.wait_executed(env["APP_LOG"], set(load.acked))
        check_runs(runs, set(load.acked))
        assert set(run_pids(runs)) <= set(load.by_pid), "the master ran tasks"
        assert sum(leading for leading in server.whoami().values()) == 1
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


def test_gunicorn_preload_started_at_import_without_hooks_never_hangs(sqlite_env, tmp_path):
    """Without the hooks the master's scheduler keeps running there (a member
    of the cluster); the workers' inherited copies start afresh on first use."""
    env = dict(sqlite_env, APP_START="import")
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=8, preload=True,
                                    env=env))
    try:
        sent = keys(200)
        load = wsgikit.drive(server, sent, clients=12)
        check_load(load, sent)
        assert not load.failures, load.failures[:5]
        check_runs(wsgikit.wait_executed(env["APP_LOG"], set(load.acked)), set(load.acked))
        # The workers report their own schedulers, not the master's copy.
        assert sum(server.whoami().values()) <= 1
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


def test_gunicorn_max_requests_recycles_workers_without_loss(sqlite_env, tmp_path):
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=4, max_requests=60,
                                    env=sqlite_env, conf=HOOKS))
    try:
        sent = keys(300)
        load = wsgikit.drive(server, sent, clients=8)
        check_load(load, sent)
        # A recycled leader hands over cleanly: the calls it did not carry out wait for the next one.
        refused = [failure for failure in load.failures if ": 503 " in failure]
        assert not refused, refused[:5]
        assert len(load.by_pid) > 2, f"no worker was recycled: {load.by_pid}"
        runs = wsgikit.wait_executed(sqlite_env["APP_LOG"], set(load.acked))
        check_runs(runs, set(load.acked))
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


def test_gunicorn_kill_9_of_the_leader_during_load(store_env, tmp_path):
    env = dict(store_env, APP_SLEEP="0.02")
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=8, env=env,
                                    conf=HOOKS))
    killed: set[int] = set()
    killed_at: list[float] = []
    ttl = float(env["APP_LEASE_TTL"])
    try:
        leader = server.leader()

        def kill_leader() -> None:
            killed.add(leader)
            killed_at.append(time.time())
            os.kill(leader, signal.SIGKILL)

        sent = keys(400)
        load = wsgikit.drive(server, sent, clients=12, during=kill_leader, at=150)
        assert killed == {leader}
        check_load(load, sent)
        runs = wsgikit.wait_executed(env["APP_LOG"], set(load.acked), timeout=120)
        # In flight when the leader died (placed by it, outcome not applied): may run again.
        window = (killed_at[0] - 5.0, killed_at[0] + 2 * ttl + 1.0)
        check_runs(runs, set(load.acked), window=window)
        assert server.leader() != leader
        after = set(run_pids(runs)) - killed
        assert after, "nothing ran after the kill"
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]


def test_gunicorn_sigterm_keeps_the_backlog_queued_uncharged(sqlite_env, tmp_path):
    """A clean SIGTERM with a backlog: what did not run stays queued, with no
    attempt charged; the next start runs each of it once, as attempt 1."""
    env = dict(sqlite_env, APP_SLEEP="0.05")
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=4, env=env, conf=HOOKS))
    try:
        sent = keys(400)
        load = wsgikit.drive(server, sent, clients=12)
        check_load(load, sent)
    finally:
        code = server.stop()
    assert code == 0, server.output()[-3000:]
    before = wsgikit.runs_by_key(env["APP_LOG"])
    assert len(before) < len(sent), "the backlog ran out before the SIGTERM: nothing tested"
    again = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=4, env=env, conf=HOOKS))
    try:
        again.whoami(4)   # the first requests start the schedulers
        runs = wsgikit.wait_executed(env["APP_LOG"], set(load.acked), timeout=120)
        check_runs(runs, set(load.acked))
        charged = {k: r[-1].attempt for k, r in runs.items() if r[-1].attempt != 1}
        assert not charged, f"attempts charged by the shutdown: {dict(list(charged.items())[:5])}"
    finally:
        again.stop()


def test_gunicorn_two_workers_in_memory_warn(tmp_path):
    env = {"APP_LOG": str(tmp_path / "executions.log")}
    # The hooks start both workers' schedulers at boot: the second one to start sees the first.
    server = serve(wsgikit.gunicorn(str(tmp_path), "app_plain:app", workers=2, threads=4, env=env, conf=HOOKS))
    try:
        load = wsgikit.drive(server, keys(60), clients=8)
        # In memory each process is a scheduler of its own (what the warning says): only no loss is checked.
        assert load.hangs == 0 and set(load.acked) == set(keys(60))
    finally:
        server.stop()
    assert "runs a scheduler without a store" in server.output()


# ---------------------------------------------------------------- waitress (one process)


def test_waitress_sigterm_in_memory_logs_the_dropped_backlog(tmp_path):
    env = {"APP_LOG": str(tmp_path / "executions.log"), "APP_SLEEP": "0.2"}
    server = serve(wsgikit.waitress(str(tmp_path), "app_plain:app", threads=8, env=env))
    try:
        load = wsgikit.drive(server, keys(200), clients=8)
        check_load(load, keys(200))
    finally:
        code = server.stop()
    out = server.output()
    ran = len(wsgikit.executions(env["APP_LOG"]))
    assert ran < 200, "the backlog ran out before the SIGTERM: nothing tested"
    assert code in (0, 128 + signal.SIGTERM), out[-3000:]   # exited (not killed by the signal)
    assert "WARNING:cronoq.scheduler:shutdown: " in out and "unfinished tasks are dropped" in out, out[-3000:]


def test_waitress_sigterm_with_a_store_then_restart_runs_everything_once(store_env, tmp_path):
    env = dict(store_env, APP_SLEEP="0.05")
    server = serve(wsgikit.waitress(str(tmp_path), "app_plain:app", threads=8, env=env))
    try:
        sent = keys(300)
        load = wsgikit.drive(server, sent, clients=8)
        check_load(load, sent)
    finally:
        code = server.stop()
    assert code in (0, 128 + signal.SIGTERM), server.output()[-3000:]   # exited (not killed by the signal)
    assert len(wsgikit.runs_by_key(env["APP_LOG"])) < len(sent), "nothing was left for the restart"
    again = serve(wsgikit.waitress(str(tmp_path), "app_plain:app", threads=8, env=env))
    try:
        again.whoami(2)
        runs = wsgikit.wait_executed(env["APP_LOG"], set(load.acked), timeout=120)
        check_runs(runs, set(load.acked))
        assert all(r[-1].attempt == 1 for r in runs.values())
    finally:
        again.stop()


# ---------------------------------------------------------------- the Flask reloader


def test_flask_reloader_serving_child_leads(store_env, tmp_path):
    port = wsgikit.free_port()
    env = dict(store_env, APP_PORT=str(port))
    server = wsgikit.Server([sys.executable, os.path.join(wsgikit.APPS, "app_flask.py")], env=env, port=port,
                            cwd=str(tmp_path), log_path=env["APP_LOG"])
    try:
        serve(server)
        seen = server.whoami(5)
        assert len(seen) == 1
        (child, leading), = seen.items()
        assert child != server.proc.pid, "the reloader's parent served"
        assert leading, "the serving child does not lead (the reloader's parent took the lease?)"
        sent = keys(100)
        load = wsgikit.drive(server, sent, clients=4)
        check_load(load, sent)
        check_runs(wsgikit.wait_executed(env["APP_LOG"], set(load.acked)), set(load.acked))
        assert set(run_pids(wsgikit.runs_by_key(env["APP_LOG"]))) == {child}
    finally:
        server.stop()


def test_the_threaded_apps_howto_gunicorn_app_runs_as_written(tmp_path):
    """docs/howto/threaded-apps.md, section gunicorn: its myapp.py and
    gunicorn.conf.py written as they are, its two shell lines run as they are
    (on a free port instead of 8000), and the app answers every request."""
    import re
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the how-to uses it)")
    page = open(os.path.join(wsgikit.REPO, "docs", "howto", "threaded-apps.md")).read()
    section = page[page.index("### gunicorn"):page.index("### waitress")]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)
    python = [text for kind, text in blocks if kind == "python"]
    shell = [text for kind, text in blocks if kind == "sh"]
    assert len(python) == 2 and len(shell) == 1, blocks
    (tmp_path / "myapp.py").write_text(python[0])
    (tmp_path / "gunicorn.conf.py").write_text(python[1])
    serve, ask = shell[0].strip().splitlines()
    assert serve.endswith(" &")
    port = str(wsgikit.free_port())
    serve, ask = serve[:-2].replace("8000", port), ask.replace("8000", port)
    env = dict(os.environ, MYAPP_DB=str(tmp_path / "myapp.db"), PYTHONPATH=wsgikit.REPO,
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    server = subprocess.Popen(["bash", "-c", "exec " + serve], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        answers = []
        for _ in range(300):
            result = subprocess.run(["bash", "-c", ask], cwd=tmp_path, env=env, capture_output=True, timeout=60)
            if result.returncode == 0 and result.stdout:
                answers.append(json.loads(result.stdout))
                if len(answers) == 4:
                    break
            else:
                time.sleep(0.1)
        assert answers == [{"rows": 42, "params": {"month": "2026-01"}}] * 4
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    assert server.returncode == 0, server.stderr.read().decode() if server.stderr else ""
