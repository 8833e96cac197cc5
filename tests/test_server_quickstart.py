"""docs/server-quickstart.md, run as written: its ``sh`` blocks, joined into
one bash script, in an empty directory with this checkout's cronoq-server
and python on the PATH. Only the port numbers 7070 and 7071 are replaced by
free ones (the rules of a shared machine), in the commands and the files they
write. What each block prints is compared with the ``json`` or ``text``
block that follows it on the page (``"..."`` there matches any value). The
script runs in a session of its own, ended by its id afterwards. curl is
needed (the page uses it): CI installs it, elsewhere the test skips without."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from serverkit import ROOT, server_env

PAGE = ROOT / "docs" / "server-quickstart.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
MARK = re.compile(r"\n@@block (\d+)@@\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matches(expected, actual, *, epoch_ids: bool = False, key: str | None = None) -> bool:
    """Whether ``actual`` is ``expected``, where the string "..." matches anything.
    ``epoch_ids``: ids carry a leader's epoch in their top bits (with a store):
    the page's ``"id": "2"`` is the second id of that epoch."""
    if expected == "...":
        return True
    if isinstance(expected, dict):
        return isinstance(actual, dict) and expected.keys() == actual.keys() and all(
            matches(expected[k], actual[k], epoch_ids=epoch_ids, key=k) for k in expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(
            matches(e, a, epoch_ids=epoch_ids) for e, a in zip(expected, actual))
    if epoch_ids and key == "id" and isinstance(expected, str) and isinstance(actual, str) and actual.isdigit():
        from cronoq.core.types import ID_EPOCH_BITS
        return int(actual) >> ID_EPOCH_BITS >= 1 and int(actual) & ((1 << ID_EPOCH_BITS) - 1) == int(expected)
    return type(expected) is type(actual) and expected == actual


def answers(blocks: list[tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """The documented answer of each sh block (by its number among the sh blocks)."""
    out, number = {}, -1
    for i, (kind, text) in enumerate(blocks):
        if kind == "sh":
            number += 1
            following = blocks[i + 1] if i + 1 < len(blocks) else None
            if following is not None and following[0] in ("json", "text"):
                out[number] = following
    return out


# The page keeps its state in memory; every answer must hold on SQLite as well
# (the same page with a [store] table added to its configuration).
SQLITE = '\n[store]\nkind = "sqlite"\npath = "cronoq.db"\n'


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_quickstart_runs_as_written(tmp_path, store):
    if shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("curl is missing: .ci/run installs it")
        pytest.skip("curl is not installed (the quickstart uses it)")
    blocks = FENCE.findall(PAGE.read_text())
    commands = [text for kind, text in blocks if kind == "sh"]
    expected = answers(blocks)
    assert len(commands) >= 8 and len(expected) >= 4
    grpc_port, http_port = free_port(), free_port()
    script = "set -eu\n" + "".join(f"{text}\nprintf '\\n@@block {i}@@\\n'\n" for i, text in enumerate(commands))
    script = script.replace("7070", str(grpc_port)).replace("7071", str(http_port))
    if store == "sqlite":
        marker = '\n[[pools]]\nname = "default"\n'
        assert script.count(marker) == 1, "the quickstart's configuration changed: adapt SQLITE"
        script = script.replace(marker, SQLITE + marker)
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
    parts = MARK.split("\n" + out)
    printed = {int(parts[i]): parts[i - 1].strip("\n") for i in range(1, len(parts), 2)}
    assert sorted(printed) == list(range(len(commands))), out
    lines = out.splitlines()
    assert "configuration is valid" in lines
    assert "ready" in lines
    assert "{'echo': {'hello': 'world'}, 'attempt': 1}" in lines
    for number, (kind, answer) in expected.items():
        got = printed[number]
        if kind == "json":
            assert matches(json.loads(answer), json.loads(got), epoch_ids=store != "memory"), \
                f"block {number}:\n{got}\n!=\n{answer}"
        else:
            assert got.splitlines() == answer.strip("\n").splitlines(), f"block {number}:\n{got}\n!=\n{answer}"
    assert "stopped" in err   # the server's log: it drained and stopped on SIGTERM
    assert "worker: connected to localhost:" in err   # the worker says where it connected
    assert "worker: SIGTERM: draining" in err        # and drains on SIGTERM
