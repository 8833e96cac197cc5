"""docs/server-quickstart.md, run as written: its ``sh`` blocks, joined into
one bash script, in an empty directory with this checkout's cronoq-server
and python on the PATH. Only the port numbers 7070 and 7071 are replaced by
free ones (the rules of a shared machine), in the commands and the files they
write. The script runs in a session of its own, ended by its id afterwards."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys

from serverkit import ROOT, server_env

PAGE = ROOT / "docs" / "server-quickstart.md"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_quickstart_runs_as_written(tmp_path):
    blocks = re.findall(r"^```sh\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    assert len(blocks) >= 6
    grpc_port, http_port = free_port(), free_port()
    script = "set -eu\n" + "\n".join(blocks)
    script = script.replace("7070", str(grpc_port)).replace("7071", str(http_port))
    env = server_env()
    bindir = pathlib.Path(sys.executable).parent
    assert (bindir / "cronoq-server").exists() or shutil.which("cronoq-server"), \
        "cronoq-server is not installed: pip install -e '.[dev]'"
    env["PATH"] = os.pathsep.join([str(bindir), env.get("PATH", "")])
    for role in ("CLIENT", "WORKER", "METRICS", "ADMIN"):
        env.pop(f"CRONOQ_{role}_TOKEN", None)
    process = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)   # whatever the script left running
        except ProcessLookupError:
            pass
    assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
    lines = out.splitlines()
    assert "configuration is valid" in lines
    assert "ready" in lines
    assert "{'echo': {'hello': 'world'}, 'attempt': 1}" in lines
    assert '{"echo":{"hello":"cli"},"attempt":1}' in lines   # cronoq submit --wait
    assert any(line.split()[:2] == ["default", "4"] for line in lines)   # cronoq snapshot: the pool, 4 slots
    assert "stopped" in err   # the server's log: it drained and stopped on SIGTERM
