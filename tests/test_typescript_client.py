"""The TypeScript client and worker (clients/typescript): ``npm ci && npm test``
there, whose Node tests start real cronoq-server processes with this
interpreter (CRONOQ_PYTHON) on free loopback ports and stop them by pid.

Without node or npm the test is skipped, saying so; with CRONOQ_REQUIRE_NODE=1
(CI) it fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"


def _tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        reason = f"{missing} not installed: the TypeScript client's tests need Node 20 and npm"
        if os.environ.get("CRONOQ_REQUIRE_NODE") == "1":
            pytest.fail(reason + " (CRONOQ_REQUIRE_NODE=1)")
        pytest.skip(reason)
    assert node is not None and npm is not None
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(version.lstrip("v").split(".", 1)[0])
    if major < 20:
        reason = f"node {version} is too old: the TypeScript client needs Node 20 or later"
        if os.environ.get("CRONOQ_REQUIRE_NODE") == "1":
            pytest.fail(reason + " (CRONOQ_REQUIRE_NODE=1)")
        pytest.skip(reason)
    return node, npm


def _run(npm: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["CRONOQ_PYTHON"] = sys.executable
    env.pop("CRONOQ_CONFIG", None)
    return subprocess.run([npm, *args], cwd=PACKAGE, capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_typescript_client_and_worker_pass_their_node_tests() -> None:
    _, npm = _tools()
    installed = _run(npm, "ci", "--no-audit", "--no-fund", timeout=600)
    assert installed.returncode == 0, f"npm ci failed:\n{installed.stdout}\n{installed.stderr}"
    tested = _run(npm, "test", timeout=900)
    output = tested.stdout + tested.stderr
    assert tested.returncode == 0, f"npm test failed:\n{output}"
    # node's test runner closes with its counts: every test ran and passed.
    assert "# fail 0" in output, output
    passed = [line for line in output.splitlines() if line.startswith("# pass ")]
    assert passed and int(passed[-1].split()[-1]) >= 20, output
