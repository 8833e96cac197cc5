"""How long the ``cronoq`` command line takes to start, in fresh processes.

    python bench/cli_start.py [--runs 15]

Each figure is the wall time of one whole process (interpreter start,
imports, the command, exit), the median of ``--runs`` runs with min and max,
beside the floor of an interpreter that does nothing, and the 0.25 s target.
``submit`` sends one task to a cronoq-server this script starts (in memory,
on free loopback ports) and stops. The cronoq imported is this tree's (it is
put first on PYTHONPATH), so bench/before_after.py can compare two trees.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TREE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
       "CRONOQ_TOKEN": ""}
TARGET_S = 0.25
CONFIG = """
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 1
[[pools]]
name = "default"
"""
LISTENING = re.compile(r"listening: grpc [^ ]+:(\d+)")


def cli(*argv: str) -> list[str]:
    """The ``cronoq`` console script's own call, runnable from any tree."""
    return [sys.executable, "-c", f"import sys; from cronoq.cli import main; sys.exit(main({list(argv)!r}))"]


def timed(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                              timeout=60)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{command} failed ({done.returncode}): {done.stderr[-1000:]}")
    return times


def start_server(directory: str) -> tuple[subprocess.Popen[str], int]:
    config = Path(directory) / "server.toml"
    config.write_text(CONFIG)
    server = subprocess.Popen([sys.executable, "-m", "cronoq.server", "--config", str(config)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=ENV)
    assert server.stderr is not None
    deadline = time.monotonic() + 60
    for line in server.stderr:
        match = LISTENING.search(line)
        if match:
            return server, int(match.group(1))
        if time.monotonic() > deadline:
            break
    server.kill()
    raise SystemExit("the server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cronoq-cli-bench-") as directory:
        server, port = start_server(directory)
        try:
            cases = [
                ("python -c pass (the floor)", [sys.executable, "-c", "pass"]),
                ("python -c 'import cronoq'", [sys.executable, "-c", "import cronoq"]),
                ("cronoq --version", cli("--version")),
                ("cronoq --help", cli("--help")),
                ("cronoq submit --help", cli("submit", "--help")),
                ("cronoq submit hello (to a server)", cli("--server", f"127.0.0.1:{port}", "submit", "hello")),
            ]
            results = {label: [] for label, _ in cases}   # type: dict[str, list[float]]
            for _ in range(args.runs):   # interleaved, so that noise falls on every case alike
                for label, command in cases:
                    results[label] += timed(command, 1)
        finally:
            server.terminate()
            server.wait(30)
    floor = statistics.median(results[cases[0][0]])
    print(f"start-up of fresh processes, {args.runs} runs each, median (min-max); load average "
          f"{os.getloadavg()[0]:.2f}")
    for label, times in results.items():
        median = statistics.median(times)
        verdict = "" if label == cases[0][0] else ("  under 0.25 s" if median < TARGET_S else "  OVER 0.25 s")
        print(f"  {label:<36} {median:6.3f} s ({min(times):.3f}-{max(times):.3f})   {median / floor:5.1f}x floor"
              f"{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
