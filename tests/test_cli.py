"""The ``cronoq`` console script against a real cronoq-server process: every
command, option family and exit code (docs/cli.md). ``top`` has its own
module (test_cli_top.py)."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time

import pytest

from clikit import EchoWorker, Lines, Terminal, cli_env, connected, cronoq, err, script, text
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, ROOT

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "llm"
[[pools]]
name = "tight"
max_pending = 1
overflow = "reject"
"""

OK, ERROR, USAGE, NOT_FOUND, TASK_FAILED, TIMEOUT, UNAVAILABLE, ACCESS_DENIED, INTERRUPTED = \
    0, 1, 2, 3, 4, 5, 6, 7, 130


@pytest.fixture(scope="module")
def server(module_servers):
    server = module_servers(CONFIG, name="cli")
    worker = EchoWorker(server.target, "default", name="echo-1", token=WORKER, labels={"gpu": "a100"})
    try:
        server.wait_for("'echo-1' registered")
        yield server
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def client(server):
    """The Python client, for a test's own setup (faster than the console script)."""
    from cronoq.client import BlockingClient

    with BlockingClient(server.target, token=ADMIN) as blocking:
        yield blocking


def run(server, *args: str, token: str | None = ADMIN, **kwargs):
    return cronoq(*args, token=token, server=server.target, **kwargs)


def submitted_id(result) -> int:
    assert result.returncode == OK, err(result)
    return int(text(result).strip())


def events_of(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines if line.strip()]


# ---------------------------------------------------------------- the parser and usage errors


def test_help_lists_every_command_and_usage_errors_exit_2():
    help_text = text(cronoq("--help"))
    for command in ("submit", "get", "wait", "cancel", "tasks", "workers", "schedules", "schedule", "snapshot",
                    "watch", "top", "demo", "mcp", "simulate"):
        assert f"    {command} " in help_text, command
    assert "CRONOQ_TOKEN" in help_text and "--server" in help_text
    assert text(cronoq("--version")).startswith("cronoq ")
    assert cronoq().returncode == USAGE                             # no command
    no_token_flag = cronoq("tasks", "--token", "secret")            # values on a command line are visible to others
    assert no_token_flag.returncode == USAGE and "unrecognized arguments: --token" in err(no_token_flag)
    not_an_id = cronoq("get", "abc")
    assert not_an_id.returncode == USAGE and "--key KEY" in err(not_an_id)


def exit_of(capsys, *args: str) -> tuple[int, str]:
    """``cronoq ARGS`` in this process (for usage errors, which stop before any call): (exit code, stderr)."""
    from cronoq.cli import main
    try:
        code = main(list(args))
    except SystemExit as exc:   # argparse
        code = exc.code
    return code, capsys.readouterr().err


def test_usage_errors_exit_2_before_anything_is_sent(capsys, tmp_path):
    for args in (("frobnicate",), ("get",), ("get", "1", "--key", "k"), ("get", "0"), ("tasks", "--limit", "0"),
                 ("top", "--interval", "0"), ("top", "--tasks", "-1"), ("wait", "1", "--timeout", "nan"),
                 ("submit", "--priority", "urgent"), ("submit", "x", "--label", "novalue"),
                 ("schedule", "add", "name"), ("schedule", "rename", "a"), ("tasks", "-o", "yaml")):
        code, _ = exit_of(capsys, *args)
        assert code == USAGE, args
    code, message = exit_of(capsys, "tasks", "--server", "ftp://example.com:1")
    assert code == USAGE and "http://HOST:PORT" in message
    # The payload is checked here, before connecting (nothing listens on port 1).
    existing = tmp_path / "payload.json"
    existing.write_text("{}")
    for args, says in ((("not json", "--json"), "not JSON"), (("--json",), "--json needs a payload"),
                       (("x", "--file", str(existing)), "not both"), (("x", "--wait-timeout", "1"), "needs --wait"),
                       (("--file", str(tmp_path / "missing")), "cannot read")):
        code, message = exit_of(capsys, "submit", *args, "--server", "127.0.0.1:1", "--retry-for", "0")
        assert code == USAGE and says in message, (args, message)
    code, message = exit_of(capsys, "tasks", "--status", "bogus", "--server", "127.0.0.1:1")
    assert code == USAGE and "unknown status 'bogus'" in message
    # --after 0 is the default spelled out (the first page): accepted, so this one reaches for the server.
    code, message = exit_of(capsys, "tasks", "--after", "0", "--server", "127.0.0.1:1", "--retry-for", "0")
    assert code == UNAVAILABLE, message
    assert exit_of(capsys, "tasks", "--after", "-1")[0] == USAGE


def test_the_demo_runs_as_a_subcommand():
    result = cronoq("demo", "--simulate", timeout=120)
    assert result.returncode == OK, err(result)
    assert "totals:" in text(result)
    assert cronoq("demo", "--seconds", "0").returncode == USAGE


# ---------------------------------------------------------------- submit


def test_submit_sends_text_json_files_and_standard_input_with_their_content_types(server, tmp_path):
    plain = run(server, "submit", "hello ✓", "--kind", "describe", "--wait")
    assert plain.returncode == OK, err(plain)
    seen = json.loads(plain.stdout)
    assert seen["content_type"] == "text/plain; charset=utf-8"
    assert base64.b64decode(seen["payload_b64"]) == "hello ✓".encode()

    data = bytes(range(256))
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    by_file = json.loads(run(server, "submit", "--file", str(path), "--kind", "describe", "--wait").stdout)
    assert by_file["content_type"] == "application/octet-stream"
    assert base64.b64decode(by_file["payload_b64"]) == data
    by_stdin = json.loads(run(server, "submit", "--file", "-", "--kind", "describe", "--wait", input=data).stdout)
    assert base64.b64decode(by_stdin["payload_b64"]) == data
    typed = json.loads(run(server, "submit", "a,b", "--content-type", "text/csv", "--kind", "describe",
                           "--wait").stdout)
    assert typed["content_type"] == "text/csv"

    # --json is checked before anything is sent; its text is sent as it was written.
    as_json = run(server, "submit", '{"doc": 42}', "--json", "--kind", "describe", "--wait", "-o", "json")
    document = json.loads(as_json.stdout)
    output = document["result"]["output"]
    assert output["content_type"] == "application/json"
    assert base64.b64decode(output["payload_b64"]) == b'{"doc": 42}'
    path.write_text('{"from": "file"}')
    assert json.loads(run(server, "submit", "--file", str(path), "--json", "--kind", "describe",
                          "--wait").stdout)["content_type"] == "application/json"


def test_submit_options_reach_the_worker_and_keys_deduplicate(server):
    result = run(server, "submit", "{}", "--json", "--kind", "describe", "--pool", "default", "--priority", "high",
                 "--tenant", "acme", "--label", "gpu=a100", "--tag", "team=search", "--tag", "env=test",
                 "--deadline-in", "30", "--key", "doc-42", "--wait", "-o", "json")
    assert result.returncode == OK, err(result)
    document = json.loads(result.stdout)
    assert isinstance(document["id"], str) and document["duplicate"] is False
    seen = document["result"]["output"]
    assert seen["priority"] == "high" and seen["tenant"] == "acme" and seen["key"] == "doc-42"
    assert seen["labels"] == {"gpu": "a100"} and seen["tags"] == {"team": "search", "env": "test"}
    assert seen["deadline"] == pytest.approx(time.time() + 30, abs=20)
    again = run(server, "submit", "other", "--key", "doc-42")
    assert again.returncode == OK and text(again).strip() == document["id"]
    assert "already names task" in err(again)
    assert json.loads(run(server, "submit", "x", "--key", "doc-42", "-o", "json").stdout) == \
        {"id": document["id"], "duplicate": True}


def test_after_waits_for_other_tasks_by_id_and_by_key(server, client):
    first = client.submit("one", key="after-first").id
    doomed = client.submit("no", kind="fail", key="after-doomed").id
    ok = run(server, "submit", "two", "--after", str(first), "--after", "after-first", "--wait")
    assert ok.returncode == OK and ok.stdout == b"two"
    skipped = run(server, "submit", "three", "--after", "after-doomed", "--wait")
    assert skipped.returncode == TASK_FAILED
    assert "skipped" in err(skipped)
    info = json.loads(run(server, "get", str(doomed), "-o", "json").stdout)
    assert info["status"] in ("failed", "dead_lettered")


# ---------------------------------------------------------------- wait, get, cancel


def test_wait_writes_the_output_unchanged_to_pipes_and_files(server, client, tmp_path):
    payload = b"\x00\xff\x1b[2J\x1b]0;title\x07 binary\r\n" + bytes(range(256))
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    piped = run(server, "submit", "--file", str(source), "--wait")
    assert piped.returncode == OK and piped.stdout == payload
    task = client.submit(payload, key="pipe-me").id
    target = tmp_path / "out.bin"
    with open(target, "wb") as f:
        done = subprocess.run([script(), "wait", str(task)], stdout=f, stderr=subprocess.PIPE, timeout=60,
                              env=cli_env(ADMIN, server.target), cwd=ROOT)
    assert done.returncode == OK, done.stderr
    assert target.read_bytes() == payload
    by_key = json.loads(run(server, "wait", "--key", "pipe-me", "-o", "json").stdout)
    assert base64.b64decode(by_key["output_b64"]) == payload and by_key["content_type"] == "application/octet-stream"
    assert "output" not in by_key   # bytes are not text: only base64


def test_wait_exit_codes_for_failed_tasks_timeouts_and_unknown_tasks(server, client):
    failed = client.submit("asked to fail", kind="fail").id
    result = run(server, "wait", str(failed))
    assert result.returncode == TASK_FAILED and result.stdout == b""
    assert f"task {failed} failed: asked to fail" in err(result) or "dead lettered" in err(result)
    as_json = json.loads(run(server, "wait", str(failed), "-o", "json").stdout)
    assert as_json["status"] in ("failed", "dead_lettered") and as_json["message"] == "asked to fail"
    assert as_json["output_available"] is False

    sleeping = client.submit("60", kind="sleep").id
    timed_out = run(server, "wait", str(sleeping), "--timeout", "0.3")
    assert timed_out.returncode == TIMEOUT and "has not finished after 0.3 s" in err(timed_out)
    waited = run(server, "submit", "60", "--kind", "sleep", "--wait", "--wait-timeout", "0.2")
    assert waited.returncode == TIMEOUT and "keeps running" in err(waited)

    unknown = run(server, "wait", "999999")
    assert unknown.returncode == NOT_FOUND and "999999" in err(unknown)
    assert run(server, "wait", "--key", "no-such-key").returncode == NOT_FOUND
    assert client.cancel(sleeping)


def test_get_shows_a_task_by_id_or_key_and_its_json_is_shaped_like_the_http_api(server, client):
    task = client.submit("x", pool="llm", key="get-me", tenant="t1", tags={"a": "b"}, priority="low").id
    shown = text(run(server, "get", str(task)))
    for line in (f"id       {task}", "status   ready", "pool     llm", "key      get-me", "priority low",
                 "tenant   t1", "tags     a=b", "attempt  0 of 3"):
        assert line in shown, line
    document = json.loads(run(server, "get", "--key", "get-me", "-o", "json").stdout)
    assert document["id"] == str(task) and document["status"] == "ready" and document["key"] == "get-me"
    assert document["tags"] == {"a": "b"} and document["tenant"] == "t1" and document["priority"] == "low"
    created = document["created_unix_ns"]
    assert isinstance(created, str) and created.isdigit() and abs(int(created) / 1e9 - time.time()) < 600
    assert "finished_unix_ns" not in document
    assert run(server, "get", "424242").returncode == NOT_FOUND
    assert client.cancel(task)


def test_cancel_reports_whether_it_cancelled(server, client):
    task = client.submit("x", pool="llm").id
    assert text(run(server, "cancel", str(task))).strip() == f"cancelled task {task}"
    again = run(server, "cancel", str(task))
    assert again.returncode == OK and "had already finished" in text(again)
    assert json.loads(run(server, "cancel", str(task), "-o", "json").stdout) == {"cancelled": False}
    keyed = client.submit("x", pool="llm", key="cancel-me").id
    assert json.loads(run(server, "cancel", "--key", "cancel-me", "-o", "json").stdout) == {"cancelled": True}
    assert json.loads(run(server, "get", str(keyed), "-o", "json").stdout)["status"] == "cancelled"
    assert run(server, "cancel", "777777").returncode == NOT_FOUND


# ---------------------------------------------------------------- listings


def test_tasks_filters_by_pool_and_status_pages_and_follows_every_page(server, client):
    ids = [client.submit(str(i), pool="llm").id for i in range(5)]
    first = json.loads(run(server, "tasks", "--pool", "llm", "--status", "ready", "--after", str(ids[0] - 1),
                           "--limit", "2", "-o", "json").stdout)
    assert [t["id"] for t in first["tasks"]] == [str(ids[0]), str(ids[1])]
    assert first["next_after"] == str(ids[1])
    every = json.loads(run(server, "tasks", "--pool", "llm,default", "--status", "ready", "--status", "running",
                           "--all", "--limit", "2", "-o", "json").stdout)
    listed = [int(t["id"]) for t in every["tasks"]]
    assert "next_after" not in every and set(ids) <= set(listed) and listed == sorted(listed)
    assert all(t["status"] in ("ready", "running") for t in every["tasks"])

    table = run(server, "tasks", "--pool", "llm", "--status", "ready", "--after", str(ids[0] - 1), "--limit", "3")
    lines = text(table).splitlines()
    assert lines[0].split() == ["ID", "STATUS", "POOL", "KEY", "KIND", "PRIORITY", "ATTEMPT", "AGE", "MESSAGE"]
    assert [line.split()[0] for line in lines[1:]] == [str(i) for i in ids[:3]]
    assert f"--after {ids[2]}" in err(table)   # where the next page starts
    assert run(server, "tasks", "--pool", "nosuch").returncode == NOT_FOUND
    for task in ids:
        client.cancel(task)


def test_workers_schedules_and_snapshot(server):
    workers = text(run(server, "workers"))
    assert "echo-1" in workers and "gpu=a100" in workers and "default" in workers
    listed = json.loads(run(server, "workers", "--pool", "default", "-o", "json").stdout)["workers"]
    assert [w["name"] for w in listed] == ["echo-1"]
    assert listed[0]["slots"] == 4 and listed[0]["connected_unix_ns"].isdigit() and listed[0]["id"].isdigit()

    snapshot = text(run(server, "snapshot", token=METRICS))
    assert "POOL" in snapshot and "\ntight " in snapshot and "totals since start, tasks: submitted" in snapshot
    # Each count says what it counts, and over what span (the server's metrics window).
    assert "SUCCEEDED and FAILED attempts over the last 60 s" in snapshot and "; attempts: dispatched" in snapshot
    document = json.loads(run(server, "snapshot", "-o", "json", token=METRICS).stdout)
    assert [p["name"] for p in document["pools"]] == ["default", "llm", "tight"]
    assert len(document["pools"][0]["pending_by_class"]) == 4 and document["at_unix_ns"].isdigit()
    assert document["metrics_window_s"] == 60
    assert list(document["totals"])[:3] == ["submitted", "dispatched", "succeeded"]


def test_schedule_add_list_and_remove(server):
    added = run(server, "schedule", "add", "nightly", "0 0 3 * * *", '{"report": "daily"}', "--json",
                "--tz", "Europe/Berlin", "--overlap", "queue", "--pool", "llm", "--key", "nightly", "--priority",
                "low")
    assert added.returncode == OK, err(added)
    assert text(added).startswith("nightly: next at ")
    listed = json.loads(run(server, "schedules", "-o", "json", token=METRICS).stdout)["schedules"]
    nightly = next(s for s in listed if s["name"] == "nightly")
    assert nightly["cron"] == "0 0 3 * * *" and nightly["tz"] == "Europe/Berlin" and nightly["pool"] == "llm"
    assert nightly["overlap"] == "queue" and nightly["next_unix_ns"].isdigit() and "last_task_id" not in nightly
    table = text(run(server, "schedules", token=METRICS))
    assert "nightly" in table and "Europe/Berlin" in table
    as_json = json.loads(run(server, "schedule", "add", "hourly", "@hourly", "-o", "json").stdout)
    assert as_json["name"] == "hourly" and as_json["next_unix_ns"].isdigit()

    invalid = run(server, "schedule", "add", "broken", "not a cron")
    assert invalid.returncode == ERROR and "cron" in err(invalid)
    denied = run(server, "schedule", "add", "x", "@daily", token=METRICS)
    assert denied.returncode == ACCESS_DENIED and "admin" in err(denied)
    assert text(run(server, "schedule", "remove", "nightly")).strip() == "removed nightly"
    gone = run(server, "schedule", "remove", "nightly")
    assert gone.returncode == NOT_FOUND and "no schedule named 'nightly'" in err(gone)
    assert json.loads(run(server, "schedule", "remove", "hourly", "-o", "json").stdout) == {"removed": True}


def test_json_output_is_the_http_apis_document(server, client):
    import urllib.request

    def http(path: str):
        request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}",
                                         headers={"authorization": f"Bearer {ADMIN}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    def cli(*args: str):
        result = run(server, *args, "-o", "json")
        assert result.returncode == OK, err(result)
        return json.loads(result.stdout)

    task = client.submit({"shape": 1}, key="same-shape", tenant="t1", tags={"a": "b"}, priority="high").id
    assert client.wait(task, 30).ok
    assert cli("get", str(task)) == http(f"/v1/tasks/{task}")
    assert cli("wait", "--key", "same-shape") == http(f"/v1/tasks/{task}/result")
    assert cli("tasks", "--after", str(task - 1), "--limit", "1") == http(f"/v1/tasks?after={task - 1}&limit=1")
    # A text output, a dependency and an attempt's history, in the same shapes.
    text_task = client.submit("plain text", key="same-shape-text", after=[task]).id
    assert client.wait(text_task, 30).ok
    assert cli("get", str(text_task)) == http(f"/v1/tasks/{text_task}")
    assert cli("wait", str(text_task)) == http(f"/v1/tasks/{text_task}/result")
    # A worker's last_seen_unix_ns moves with each message it sends: the rest is equal, and both have it.
    def steady(document):
        return {"workers": [{k: v for k, v in w.items() if k != "last_seen_unix_ns"} for w in document["workers"]]}
    listed, served = cli("workers"), http("/v1/workers")
    assert steady(listed) == steady(served)
    assert [("last_seen_unix_ns" in w) for w in listed["workers"]] == [("last_seen_unix_ns" in w)
                                                                        for w in served["workers"]]
    assert cli("schedules") == http("/v1/recurring")
    # A snapshot moves with time (its waits, its at_unix_ns): the same fields, nested alike.
    def fields(document) -> set[str]:
        if isinstance(document, dict):
            return set(document) | {f"{k}.{f}" for k, v in document.items() for f in fields(v)}
        return fields(document[0]) if isinstance(document, list) and document else set()
    assert fields(cli("snapshot")) == fields(http("/v1/snapshot"))


# ---------------------------------------------------------------- watch


def test_watch_prints_transitions_until_ctrl_c(server, client):
    every = Lines([script(), "watch", "--all", "-o", "json", "--pool", "default"], cli_env(CLIENT, server.target))
    terminal = Lines([script(), "watch"], cli_env(CLIENT, server.target))
    try:
        # A watch streams after its first ordinary call: submit until both saw a task end.
        for attempt in range(30):
            probe = client.submit("probe", key=f"watch-probe-{attempt}").id
            assert client.wait(probe, 30).ok
            if every.wait_for(lambda lines: any(f'"id": "{probe}"' in line for line in lines), 2) and \
                    terminal.wait_for(lambda lines: any(f" {probe} " in line for line in lines), 2):
                break
        else:
            raise AssertionError(f"the watches never streamed: {every.lines} {terminal.lines}")
        task = client.submit("watched", key="watched").id
        assert client.wait(task, 30).ok
        assert every.wait_for(lambda lines: any(f'"id": "{task}"' in l and "succeeded" in l for l in lines))
        assert terminal.wait_for(lambda lines: any(f" {task} " in line for line in lines))
        # Every transition of the task, in order, shaped like the HTTP API.
        events = [e for e in events_of(every.lines) if e["id"] == str(task)]
        assert [e["status"] for e in events][-2:] == ["running", "succeeded"]
        assert events[-1]["pool"] == "default" and events[-1]["key"] == "watched"
        assert events[-1]["attempt"] == 1 and events[-1]["max_attempts"] == 3 and events[-1]["at_unix_ns"].isdigit()
        # Without --all, terminal transitions only: TIME ID POOL STATUS attempt N/MAX KEY.
        assert all(json.loads(line)["status"] for line in every.lines)
        assert not any(" running " in line or " ready " in line for line in terminal.lines)
        line = next(line for line in terminal.lines if f" {task} " in line)
        assert line.split()[1:] == [str(task), "default", "succeeded", "attempt", "1/3", "watched"]
    finally:
        every_exit, every_err = every.interrupt()
        terminal_exit, terminal_err = terminal.interrupt()
    assert (every_exit, terminal_exit) == (OK, OK), (every_err, terminal_err)


# ---------------------------------------------------------------- connection, credentials and the other exit codes


def test_access_denied_unavailable_and_refused_requests(server, tmp_path):
    no_token = run(server, "tasks", token=None)
    assert no_token.returncode == ACCESS_DENIED and "access denied" in err(no_token)
    assert run(server, "tasks", token="not-a-valid-token-0123456789").returncode == ACCESS_DENIED
    wrong_role = run(server, "snapshot", token=CLIENT)
    assert wrong_role.returncode == ACCESS_DENIED and "metrics role" in err(wrong_role)
    assert run(server, "submit", "x", token=METRICS).returncode == ACCESS_DENIED
    bad_token = run(server, "tasks", token="line\nbreak")
    assert bad_token.returncode == USAGE and "printable ASCII" in err(bad_token)

    # A full queue with overflow "reject" refuses the submission: exit 1.
    assert run(server, "submit", "1", "--pool", "tight").returncode == OK
    refused = run(server, "submit", "2", "--pool", "tight")
    assert refused.returncode == ERROR and err(refused).startswith("cronoq: ")

    # Nothing listens on this port any more: unavailable, after --retry-for.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    down = cronoq("tasks", "--retry-for", "0", token=CLIENT, server=f"127.0.0.1:{closed}")
    assert down.returncode == UNAVAILABLE and "is unavailable" in err(down) and "--retry-for" in err(down)


def test_the_server_and_token_come_from_the_environment_and_plain_http_elsewhere_warns(server):
    port = server.grpc_port
    # --server wins over $CRONOQ_SERVER.
    assert cronoq("tasks", "--server", f"http://127.0.0.1:{port}", token=CLIENT,
                  server="127.0.0.1:1").returncode == OK
    local = cronoq("tasks", token=CLIENT, server=f"http://localhost:{port}")
    assert local.returncode == OK and "warning" not in err(local)
    # A name that is not loopback exposes the token (the warning comes before any connection: the
    # reserved .invalid name resolves nowhere, so nothing leaves this machine).
    exposed = cronoq("tasks", "--retry-for", "0", token=CLIENT, server=f"http://cronoq-test.invalid:{port}")
    assert "warning: sending the token from $CRONOQ_TOKEN over plain http to cronoq-test.invalid" in err(exposed)
    assert "warning" not in err(cronoq("tasks", "--retry-for", "0", token=None,
                                       server=f"http://cronoq-test.invalid:{port}"))


def test_ctrl_c_while_waiting_exits_130(server, client):
    task = client.submit("60", kind="sleep").id
    waiting = subprocess.Popen([script(), "wait", str(task)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=cli_env(ADMIN, server.target), cwd=ROOT)
    # The task is running, so the wait blocks; interrupt it once the call is under way: once the
    # command is connected to the server (before that, on a loaded machine, it may still be starting
    # Python, where Ctrl-C ends it the interpreter's way, by the signal).
    deadline = time.monotonic() + 60
    while client.get(task).status != "running" or not connected(waiting.pid, server.grpc_port):
        assert time.monotonic() < deadline and waiting.poll() is None, waiting.poll()
        time.sleep(0.05)
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(30) == INTERRUPTED
    assert client.cancel(task)


# ---------------------------------------------------------------- terminals


def _on_terminal(server, *args: str, token: str = ADMIN) -> tuple[int, bytes]:
    term = Terminal([script(), *args], cli_env(token, server.target), stdin_terminal=False)
    try:
        code = term.wait(60)
        return code, bytes(term.raw)
    finally:
        term.close()


def test_on_a_terminal_control_characters_from_other_clients_are_escaped(server, client, tmp_path):
    hostile = "evil\x1b]0;pwned\x07\x1b[2J\u202e"
    source = tmp_path / "hostile.bin"
    source.write_bytes(b"out\x1b[31mred\xc2\x9b\n\xff\x9b")   # ESC, U+009B (C1 CSI) in UTF-8, raw bytes
    task = client.submit(source.read_bytes(), key=hostile).id
    assert run(server, "wait", str(task)).stdout == source.read_bytes()   # redirected: byte-exact

    code, screen = _on_terminal(server, "wait", str(task))
    assert code == OK
    assert b"\x1b" not in screen and b"\x9b" not in screen
    assert rb"out\u{1b}[31mred\u{9b}" in screen and rb"\x{ff}\x{9b}" in screen
    code, screen = _on_terminal(server, "get", str(task))
    assert code == OK and b"\x1b" not in screen and b"\x07" not in screen
    assert rb"evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}" in screen
    code, screen = _on_terminal(server, "get", str(task), "-o", "json")
    assert b"\x1b" not in screen and "\u202e".encode() not in screen
    assert json.loads(screen.decode().strip())["key"] == hostile   # still valid JSON, the same string
    # Messages quoted on standard error are escaped too.
    failed = client.submit("bad\x1b[5mnews", kind="fail").id
    code, screen = _on_terminal(server, "wait", str(failed))
    assert code == TASK_FAILED and rb"bad\u{1b}[5mnews" in screen and b"\x1b[5m" not in screen
    # Redirected, listings stay byte-exact.
    assert hostile.encode() in run(server, "tasks", "--all").stdout


# ---------------------------------------------------------------- TLS


def test_https_with_a_private_ca_and_client_certificates(servers, tmp_path):
    from certkit import CA

    ca = CA()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.pem)
    cert, key = ca.write(tmp_path, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    client_cert, client_key = ca.write(tmp_path, "client", ca.issue(["cli.internal"]))
    server = servers(LISTEN + AUTH + f"""
[server.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{ca_file}"
[[auth.certs]]
dns_name = "cli.internal"
role = "client"
""")
    https = f"https://127.0.0.1:{server.grpc_port}"
    tls = ("--tls-ca", str(ca_file), "--tls-cert", str(client_cert), "--tls-key", str(client_key))
    # The certificate maps to the client role: no token needed.
    by_certificate = cronoq("submit", "over tls", *tls, server=https)
    assert by_certificate.returncode == OK, err(by_certificate)
    task = text(by_certificate).strip()
    from_environment = cronoq("get", task, "-o", "json", server=https,
                              env={"CRONOQ_TLS_CA": str(ca_file), "CRONOQ_TLS_CERT": str(client_cert),
                                   "CRONOQ_TLS_KEY": str(client_key)})
    assert from_environment.returncode == OK and json.loads(from_environment.stdout)["id"] == task
    assert cronoq("snapshot", *tls, server=https).returncode == ACCESS_DENIED   # a client, not metrics
    assert cronoq("snapshot", *tls, token=METRICS, server=https).returncode == OK   # a token wins
    assert "warning" not in err(cronoq("tasks", *tls, token=CLIENT, server=https))

    # Without a client certificate, or in plaintext, the handshake fails: unavailable.
    assert cronoq("tasks", "--tls-ca", str(ca_file), "--retry-for", "0", token=CLIENT,
                  server=https).returncode == UNAVAILABLE
    assert cronoq("tasks", "--retry-for", "0", token=CLIENT,
                  server=f"http://127.0.0.1:{server.grpc_port}").returncode == UNAVAILABLE
    # TLS settings with an http:// server are refused, not ignored.
    refused = cronoq("tasks", *tls, server=f"http://127.0.0.1:{server.grpc_port}")
    assert refused.returncode == USAGE and "use https://" in err(refused)


def test_a_schedules_occurrence_shows_its_attempt_of_those_allowed(server, client):
    # Occurrences are made by the engine, not submitted through this server: their
    # allowance comes from the engine's policy (it was missing: "0" where "0/3" was due).
    added = run(server, "schedule", "add", "every-second", "* * * * * *", "tick", "--pool", "llm", "--key", "tick")
    assert added.returncode == OK, err(added)
    try:
        deadline = time.monotonic() + 30
        while True:   # (llm has no worker: the occurrence waits)
            listed = json.loads(run(server, "tasks", "--pool", "llm", "--status", "ready", "-o", "json").stdout)
            ticks = [t for t in listed["tasks"] if t.get("key", "").startswith("tick@")]
            if ticks or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert ticks and ticks[0]["max_attempts"] == 3, listed
        table = text(run(server, "tasks", "--pool", "llm", "--status", "ready"))
        row = next(line.split() for line in table.splitlines() if ticks[0]["key"] in line)
        assert row[6] == "0/3", table
        shown = text(run(server, "get", ticks[0]["id"]))
        assert "attempt  0 of 3" in shown, shown
    finally:
        run(server, "schedule", "remove", "every-second")
        for task in json.loads(run(server, "tasks", "--pool", "llm", "-o", "json").stdout)["tasks"]:
            if task.get("key", "").startswith("tick@") and task["status"] in ("ready", "scheduled"):
                client.cancel(int(task["id"]))
