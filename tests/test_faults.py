"""Fault injection (issue 10): a scheduler in a child process is killed
(SIGKILL), left without shutdown() at interpreter exit, or forked; then the
SQLite store it used is read and a scheduler restarted on it. No acknowledged
task may be lost, and none may run twice beyond the documented at-least-once
window (an attempt in flight at a crash).

Handlers append ``start|end pid id attempt`` lines to an execution log
(O_APPEND writes of one line are atomic), which the checks count.
"""

from __future__ import annotations

import collections
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import cronoq

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and POSIX signals")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = 60           # seconds; only reached when a test fails
CAPACITY = 4
STORE_OPTIONS = dict(lease_ttl=1.0, lease_renew=0.25, lock_poll=0.05)

# The child: a BlockingScheduler on a SQLite store, a sync pool that logs its
# executions. It prints one "acked <id>" line per acknowledged submission.
CHILD = r"""
import os, sys, threading, time, cronoq

mode, db, log_path, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def record(what, ctx):
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{what} {os.getpid()} {ctx.id} {ctx.attempt}\n".encode())
    finally:
        os.close(fd)

def work(ctx, payload):
    record("start", ctx)
    if payload == "hang":
        threading.Event().wait()
    time.sleep(0.03)
    record("end", ctx)
    return payload

def ends():
    try:
        with open(log_path) as f:
            return sum(line.startswith("end ") for line in f)
    except FileNotFoundError:
        return 0

store = cronoq.SqliteStore(db, lease_ttl=1.0, lease_renew=0.25, lock_poll=0.05)
retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
pool = cronoq.Pool("work", work, min=4, max=4, autoscale=False, retry=retry)
grace = 0.2 if mode == "hang" else 10.0
bs = cronoq.BlockingScheduler([pool], store=store, shutdown_grace=grace)
bs.start()
payloads = ["hang"] * 4 if mode == "hang" else list(range(count))
for task_id in bs.enqueue_batch([cronoq.Task(payload, pool="work") for payload in payloads]):
    print("acked", task_id, flush=True)

def wait_for_ends(n):
    deadline = time.monotonic() + 60
    while ends() < n and time.monotonic() < deadline:
        time.sleep(0.005)

if mode == "kill":
    time.sleep(3600)               # the test kills this process
elif mode == "exit":
    wait_for_ends(count // 4)
    print("exiting", flush=True)   # and leave without shutdown()
elif mode == "hang":
    deadline = time.monotonic() + 60
    while open(log_path).read().count("start") < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    print("exiting", flush=True)
elif mode == "fork":
    wait_for_ends(count // 4)
    pid = os.fork()
    if pid == 0:
        for name, call in (("submit", lambda: bs.submit("from the child")),
                           ("shutdown", bs.shutdown)):
            try:
                call()
                print(f"child {name}: no error", flush=True)
            except cronoq.SchedulerError as exc:
                print(f"child {name}: SchedulerError: {exc}", flush=True)
        sys.exit(0)                # runs the exit hooks of the child
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    wait_for_ends(count)
    print("parent after fork:", bs.submit(-1, pool="work").result(timeout=60), flush=True)
    bs.shutdown()
    print("parent done", flush=True)
"""


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_script(script: str) -> subprocess.CompletedProcess:
    """Run ``python -c script`` in a session of its own; on timeout, kill the
    whole session (a hung fork of it would outlive its parent)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(), cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script did not exit within {WAIT} s\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Run:
    """One child process and what it left behind."""

    def __init__(self, tmp_path, mode: str, count: int = 40) -> None:
        self.db = str(tmp_path / "cronoq.db")
        self.log = str(tmp_path / "executions.log")
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        self.proc = subprocess.Popen([sys.executable, str(script), mode, self.db, self.log, str(count)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env(), cwd=REPO, start_new_session=True)

    def finish(self) -> tuple[int, list[str], str]:
        try:
            out, err = self.proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            # The child's group: a hung fork of it would keep the pipes open.
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
            pytest.fail(f"the child did not exit within {WAIT} s\n{out}\n{err}")
        return self.proc.returncode, out.splitlines(), err

    def acked(self, lines: list[str]) -> list[int]:
        return [int(line.split()[1]) for line in lines if line.startswith("acked ")]

    def executions(self) -> list[tuple[str, int, int, int]]:
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [(what, int(pid), int(task), int(attempt))
                    for what, pid, task, attempt in (line.split() for line in f)]

    def rows(self) -> dict[int, tuple[str, int, str | None]]:
        with sqlite3.connect(self.db) as conn:
            return {row[0]: (row[1], row[2], row[3])
                    for row in conn.execute("SELECT id, status, attempt, message FROM cronoq_tasks")}

    def wait_for_log(self, ends: int) -> None:
        deadline = time.monotonic() + WAIT
        while sum(e[0] == "end" for e in self.executions()) < ends:
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "the child never ran its tasks"
            time.sleep(0.005)

    def finish_on_restart(self, acked: list[int]) -> dict[int, str]:
        """Restart a scheduler on the store (this process) and run what is left."""
        def work(ctx, payload):
            line = f"{{}} {os.getpid()} {ctx.id} {ctx.attempt}\n"
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.format("start").encode())
                os.write(fd, line.format("end").encode())
            finally:
                os.close(fd)
            return payload

        store = cronoq.SqliteStore(self.db, **STORE_OPTIONS)
        retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
        pool = cronoq.Pool("work", work, min=CAPACITY, max=CAPACITY, autoscale=False, retry=retry)
        statuses = {}
        with cronoq.BlockingScheduler([pool], store=store) as bs:
            for task_id in acked:
                handle = bs.handle(task_id)
                try:
                    handle.result(timeout=WAIT)
                except cronoq.TaskFailed:
                    pass
                statuses[task_id] = handle.status
        return statuses


def check_nothing_lost(run: Run, acked: list[int], statuses: dict[int, str]) -> dict[int, list[int]]:
    """Every acknowledged task succeeded and ran; (id, attempt) never started twice.
    Returns the attempts started per task."""
    assert acked, "nothing was acknowledged"
    assert {task: status for task, status in statuses.items() if status != "succeeded"} == {}
    executions = run.executions()
    starts = collections.Counter((task, attempt) for what, _, task, attempt in executions if what == "start")
    assert [key for key, n in starts.items() if n > 1] == [], "an attempt ran twice"
    ended = {task for what, _, task, _ in executions if what == "end"}
    assert set(acked) <= ended, f"acknowledged tasks that never ran: {sorted(set(acked) - ended)}"
    attempts: dict[int, list[int]] = collections.defaultdict(list)
    for (task, attempt) in sorted(starts):
        attempts[task].append(attempt)
    return attempts


# ---------------------------------------------------------------- SIGKILL


def test_sigkill_loses_no_acknowledged_task_and_reruns_only_attempts_in_flight(tmp_path):
    run = Run(tmp_path, "kill", count=60)
    run.wait_for_log(ends=15)
    run.proc.send_signal(signal.SIGKILL)
    code, lines, _ = run.finish()
    assert code == -signal.SIGKILL
    acked = run.acked(lines)
    in_flight = {task for task, (status, _, _) in run.rows().items() if status == "running"}
    assert len(in_flight) <= CAPACITY
    statuses = run.finish_on_restart(acked)
    attempts = check_nothing_lost(run, acked, statuses)
    rerun = {task for task, numbers in attempts.items() if len(numbers) > 1}
    # The at-least-once window: only attempts in flight at the kill run again,
    # each with the next attempt number.
    assert rerun <= in_flight
    for task in rerun:
        assert attempts[task] == [1, 2]


# ---------------------------------------------------------------- exit without shutdown()


def test_exit_without_shutdown_runs_each_task_once_and_leaves_the_rest_queued(tmp_path):
    run = Run(tmp_path, "exit", count=60)
    code, lines, err = run.finish()
    assert code == 0, err
    assert "Traceback" not in err
    acked = run.acked(lines)
    assert len(acked) == 60
    rows = run.rows()
    # Within the grace every started attempt finished; nothing else started or
    # used an attempt: the rest is queued in the store as it was submitted.
    assert {status for status, _, _ in rows.values()} <= {"succeeded", "ready"}
    assert {(status, attempt) for status, attempt, _ in rows.values() if status == "ready"} <= {("ready", 0)}
    assert any(status == "ready" for status, _, _ in rows.values()), "the exit came too late to test"
    statuses = run.finish_on_restart(acked)
    attempts = check_nothing_lost(run, acked, statuses)
    assert {task: numbers for task, numbers in attempts.items() if numbers != [1]} == {}   # exactly once


def test_exit_with_hung_sync_functions_respects_the_grace(tmp_path):
    # Four functions that never return, a 0.2 s grace: the interpreter exits
    # anyway, the attempts stay "running" in the store (at least once: they
    # run again after a restart) and nothing was dead-lettered.
    run = Run(tmp_path, "hang")
    code, lines, err = run.finish()
    assert code == 0, err
    assert lines[-1] == "exiting"
    assert "4 functions still run after the shutdown grace" in err
    acked = run.acked(lines)
    assert {task: (status, attempt) for task, (status, attempt, _) in run.rows().items()} == \
        {task: ("running", 1) for task in acked}


IN_MEMORY_EXIT = """
import logging, threading, cronoq

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(action)s %(count)s")
release = threading.Event()

def work(ctx, payload):
    release.wait(10)
    return payload

bs = cronoq.BlockingScheduler([cronoq.Pool("default", work, autoscale=False)], shutdown_grace=0.1)
bs.start()
for i in range(5):
    bs.enqueue(i)
print("exiting", flush=True)
"""


def test_exit_without_a_store_warns_how_many_tasks_it_drops():
    proc = run_script(IN_MEMORY_EXIT)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING cronoq.scheduler dropped 5" in proc.stderr.splitlines()


# ---------------------------------------------------------------- fork


def test_fork_child_starts_its_own_scheduler_and_the_parent_goes_on(tmp_path):
    """The child's copy starts afresh there on its first call: a member of
    the parent's cluster (the parent leads), which it leaves at shutdown."""
    run = Run(tmp_path, "fork", count=40)
    code, lines, err = run.finish()
    assert code == 0, err
    child = [line for line in lines if line.startswith("child ")]
    assert child == ["child submit: no error", "child shutdown: no error", "child exit 0"], err
    assert "parent after fork: -1" in lines and lines[-1] == "parent done"
    acked = run.acked(lines)
    # Neither the child's start nor its exit disturbed the parent's store: every task ran once
    # and is stored as succeeded, and the parent's shutdown released its lease.
    rows = run.rows()
    assert {task: rows[task][:2] for task in acked} == {task: ("succeeded", 1) for task in acked}
    statuses = run.finish_on_restart(acked)
    attempts = check_nothing_lost(run, acked, statuses)
    assert {task: numbers for task, numbers in attempts.items() if numbers != [1]} == {}


ASYNC_FORK = """
import asyncio, os, cronoq

async def work(ctx, payload):
    if payload != "fork":
        return payload
    pid = os.fork()            # from inside an executor: the child goes on in this coroutine
    if pid == 0:
        for name, call in (("submit", lambda: sched.submit("from the child")), ("shutdown", sched.shutdown)):
            try:
                await call()
                print(f"child {name}: no error", flush=True)
            except cronoq.SchedulerError as exc:
                print(f"child {name}: SchedulerError", "is a fork of it" in str(exc), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return f"child exit {os.waitstatus_to_exitcode(status)}"

async def main():
    global sched
    async with cronoq.Scheduler([cronoq.Pool("default", work, max=2)]) as sched:
        print(await (await sched.submit("fork")), flush=True)
        print(await (await sched.submit("parent goes on")), flush=True)

asyncio.run(main())
"""


def test_an_async_scheduler_copied_by_fork_refuses_calls_in_the_child():
    proc = run_script(ASYNC_FORK)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child submit: SchedulerError True", "child shutdown: SchedulerError True",
                                        "child exit 0", "parent goes on"]
