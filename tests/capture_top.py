"""Capture the screen of a real ``cronoq top`` run, as text, for docs/cli.md.

Starts a cronoq-server process, two workers, a schedule and a mix of tasks
(finished, failed, running, waiting), runs ``cronoq top`` in a pseudo-terminal
of COLUMNS x LINES and prints the screen it drew once every pane has data.
Run it from the repository root: ``.venv/bin/python tests/capture_top.py
[COLUMNS LINES]`` (needs the dev extra: pyte). test_cli_top.py checks the capture in the docs
still has top's pane titles and columns.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clikit import EchoWorker, Terminal, cli_env, cronoq, script  # noqa: E402
from serverkit import ADMIN, AUTH, LISTEN, WORKER, ServerProcess  # noqa: E402

COLUMNS, LINES = 110, 36

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "llm"
[[pools]]
name = "reports"
"""


def run(server: ServerProcess, *args: str) -> str:
    result = cronoq(*args, token=ADMIN, server=server.target)
    if result.returncode != 0:
        raise SystemExit(f"cronoq {' '.join(args)} exited {result.returncode}: {result.stderr.decode()}")
    return result.stdout.decode().strip()


def capture(columns: int = COLUMNS, lines: int = LINES) -> str:
    with tempfile.TemporaryDirectory() as directory:
        server = ServerProcess(CONFIG, Path(directory), name="capture").start()
        workers = [EchoWorker(server.target, "default", name="web-1", token=WORKER),
                   EchoWorker(server.target, "llm", name="gpu-1", token=WORKER, labels={"gpu": "a100"})]
        term = None
        try:
            server.wait_for("'web-1' registered")
            server.wait_for("'gpu-1' registered")
            run(server, "schedule", "add", "nightly-report", "0 3 * * *", '{"report": "daily"}', "--json",
                "--tz", "Europe/Berlin", "--pool", "reports", "--key", "nightly")
            term = Terminal([script(), "top", "--interval", "0.5"], cli_env(ADMIN, server.target),
                            columns=columns, lines=lines)
            term.wait_for(lambda s: "web-1" in s and "gpu-1" in s and "nightly-report" in s, timeout=10)
            for i in range(3):
                run(server, "submit", f"page {i}", "--key", f"render-{i}", "--priority", "high", "--wait")
            failed = cronoq("submit", "quota exceeded", "--kind", "fail", "--key", "sync-7", "--wait",
                            token=ADMIN, server=server.target)
            assert failed.returncode == 4, failed.stderr   # the task failed, as asked
            for i in range(2):
                run(server, "submit", "30", "--kind", "sleep", "--pool", "llm", "--label", "gpu=a100",
                    "--key", f"summarize-{i}", "--tenant", "acme")
            for i in range(3):
                run(server, "submit", f"report {i}", "--pool", "reports", "--key", f"report-{i}",
                    "--priority", "low")
            # (a small screen has no room for every row: the running tasks and the first waiting one)
            term.wait_for(lambda s: "summarize-1" in s and "report-0" in s and
                          (lines < 36 or ("report-2" in s and "sync-7" in s)))
            time.sleep(1.5)   # a refresh or two, so the ages and waits are those of a running system
            screen = term.display()
            term.send(b"q")
            term.wait(30)
            return screen
        finally:
            if term is not None:
                term.close()
            for worker in workers:
                worker.stop()
            server.stop()


if __name__ == "__main__":
    print(capture(*(int(arg) for arg in sys.argv[1:3])))
