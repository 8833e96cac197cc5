"""docs/cli.md stays true to ``cronoq``: its exit code table is ExitCode,
every command it shows parses, every option of every command is on the page,
and its capture of ``cronoq top`` has the panes and columns top draws today."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from cronoq.cli import ExitCode
from cronoq.cli.app import build_parser
from serverkit import ROOT

PAGE = (ROOT / "docs" / "cli.md").read_text()


def _section(heading: str) -> str:
    start = PAGE.index(heading)
    following = re.search(r"^## ", PAGE[start + len(heading):], re.M)
    return PAGE[start:start + len(heading) + following.start()] if following else PAGE[start:]


def _blocks(language: str, text: str = PAGE) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_the_exit_code_table_is_the_exit_codes():
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", _section("## Exit codes"), re.M)
    assert {int(code) for code, _ in rows} == {int(code) for code in ExitCode}


def _commands() -> list[list[str]]:
    commands = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("cronoq ") and "[" not in line:   # not a synopsis like `cronoq top [--pool POOL]`
                words = shlex.split(line)[1:]
                while "<" in words or ">" in words:   # a redirection is the shell's
                    at = words.index("<" if "<" in words else ">")
                    del words[at:at + 2]
                commands.append(words)
    return commands


def test_every_command_on_the_page_parses():
    commands = _commands()
    shown = {words[0] for words in commands}
    assert {"submit", "get", "explain", "wait", "cancel", "tasks", "workers", "schedules", "schedule", "snapshot", "watch",
            "top"} <= shown
    for words in commands:
        try:
            build_parser(words[0]).parse_args(words)
        except SystemExit:
            raise AssertionError(f"docs/cli.md: `cronoq {' '.join(words)}` does not parse") from None


def _options(parser: argparse.ArgumentParser, path: str = "") -> dict[str, set[str]]:
    found: dict[str, set[str]] = {path: set()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if path == "" and name in ("demo", "mcp", "simulate"):
                    continue   # contributed subcommands document themselves
                found.update(_options(sub, f"{path} {name}".strip()))
        else:
            found[path] |= {s for s in action.option_strings if s.startswith("--") and s != "--help"}
    return found


@pytest.mark.parametrize("command,options", sorted(_options(build_parser()).items()))
def test_every_option_is_on_the_page(command, options):
    missing = sorted(o for o in options if not re.search(rf"{re.escape(o)}(?![\w-])", PAGE))
    assert not missing, f"docs/cli.md does not mention {missing} (cronoq {command})"


def test_the_capture_of_top_has_the_panes_and_columns_top_draws():
    from test_cli_units import _drawn

    capture = next(block for block in _blocks("text", _section("## `cronoq top`")) if "cronoq top" in block)
    captured = [line.split() for line in capture.splitlines()]
    drawn = _drawn(110, 36)
    assert capture.splitlines()[0].split()[:6] == drawn.splitlines()[0].split()[:6]   # cronoq top  q quit  r refresh
    for title in ("Pools", "Workers (", "Schedules (", "Live tasks (", "Recent events"):
        assert title in capture and title in drawn, title
    headings = [line.split() for line in drawn.splitlines()
                if line.split()[:2] in (["POOL", "CAPACITY"], ["NAME", "POOL"], ["ID", "STATUS"], ["TIME", "ID"])]
    assert len(headings) == 4, drawn
    for heading in headings:
        assert heading in captured, f"the capture in docs/cli.md lacks the columns {heading}: run tests/capture_top.py"


def test_the_commands_on_the_page_run_as_written(servers, tmp_path):
    """The "Commands" block, line by line through bash, against a server with
    the page's pools and an echo worker. Its ids are the page's: sixteen
    tasks come first, so that its first submit is task 17."""
    import os
    import signal
    import subprocess
    import sys

    from clikit import EchoWorker, cli_env
    from cronoq.client import BlockingClient
    from serverkit import LISTEN

    server = servers(LISTEN + "".join(f'[[pools]]\nname = "{name}"\n' for name in ("default", "llm", "reports")))
    workers = [EchoWorker(server.target, "default", name="echo-default"),
               EchoWorker(server.target, "llm", name="echo-llm", labels={"gpu": "a100"})]
    try:
        server.wait_for("'echo-llm' registered")
        with BlockingClient(server.target) as client:
            for number in range(16):
                client.submit(f"before the page {number}")
        (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4 a report")
        (tmp_path / "scan.png").write_bytes(b"\x89PNG\r\n\x1a\n a scan")
        env = cli_env(server=server.target)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        block = _section("## Commands").split("```sh\n", 1)[1].split("```", 1)[0]
        lines = [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
        assert len(lines) >= 18
        for line in lines:
            words = shlex.split(line.split("  #", 1)[0])
            if words[1] == "top":
                continue   # a full-screen view: tests/test_cli_top.py runs it in a pseudo-terminal
            if words[1] == "watch":   # runs until Ctrl-C, which ends it with exit 0
                watching = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=tmp_path, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            stdin=subprocess.DEVNULL)
                try:
                    watching.communicate(timeout=2)
                except subprocess.TimeoutExpired:
                    watching.send_signal(signal.SIGINT)
                out, errors = watching.communicate(timeout=30)
                assert watching.returncode == 0, f"`{line}` exited {watching.returncode}: {errors.decode()}"
                continue
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, timeout=60,
                                  stdin=subprocess.DEVNULL if "<" not in line else None)
            assert done.returncode == 0, f"`{line}` exited {done.returncode}: {done.stderr.decode()}"
            if line.startswith('cronoq submit "hello"'):
                assert done.stdout.decode().strip() == "17", "the page's ids: its first submit is task 17"
        assert (tmp_path / "text.txt").read_bytes() == b"%PDF-1.4 a report"   # --wait wrote the echoed output
    finally:
        for worker in workers:
            worker.stop()


def test_the_first_example_answers_what_its_comment_says_with_the_quickstart_worker(servers, tmp_path):
    """The page's first block against the server quickstart's own worker.py
    (taken from docs/server-quickstart.md as written), its export lines
    pointing at a local server instead of cronoq.internal."""
    import json
    import os
    import subprocess
    import sys

    from clikit import cli_env
    from serverkit import AUTH, CLIENT, LISTEN, WORKER, server_env

    quickstart = (ROOT / "docs" / "server-quickstart.md").read_text()
    worker_py = quickstart.split("cat > worker.py <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n')
    (tmp_path / "worker.py").write_text(worker_py.replace('"localhost:7070"', repr(server.target)))
    worker = subprocess.Popen([sys.executable, "worker.py"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**server_env(), "CRONOQ_WORKER_TOKEN": WORKER})
    try:
        server.wait_for("registered")
        first = _blocks("sh")[0]
        submit = next(line for line in first.splitlines() if line.startswith("cronoq submit"))
        command, comment = submit.split("#", 1)
        expected = json.loads(comment.split("answers", 1)[1].strip())
        env = cli_env(token=CLIENT, server=server.target)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stdout) == expected == {"echo": "hello", "attempt": 1}
    finally:
        worker.terminate()
        worker.wait(30)
