"""Where no browser can be had, the dashboard's tests skip with the reason;
with CRONOQ_REQUIRE_BROWSER=1 (set by .ci/run) they fail, so a green CI run
cannot hide them. Checked on a real test run in a child pytest, with
CRONOQ_CHROMIUM naming a browser that does not exist."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dashkit import REQUIRE_VARIABLE, required

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A_BROWSER_TEST = "tests/test_dashboard.py::test_cancelling_a_running_task_from_its_drawer"


def run_browser_test(tmp_path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items()
           if name != REQUIRE_VARIABLE and not name.startswith("PYTEST_")}
    env["CRONOQ_CHROMIUM"] = str(tmp_path / "no-such-chromium")
    env.update(variables)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", A_BROWSER_TEST],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240)


def test_without_a_browser_the_dashboard_tests_skip_with_the_reason(tmp_path):
    result = run_browser_test(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout, result.stdout
    assert "browser tests skipped" in result.stdout and "no-such-chromium" in result.stdout, result.stdout


def test_when_a_browser_is_required_its_absence_fails_the_run(tmp_path):
    result = run_browser_test(tmp_path, **{REQUIRE_VARIABLE: "1"})
    assert result.returncode == 1, result.stdout
    assert "skipped" not in result.stdout, result.stdout
    assert REQUIRE_VARIABLE in result.stdout and "no-such-chromium" in result.stdout, result.stdout


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_requirement_reads_the_variable(monkeypatch, value, expected):
    monkeypatch.setenv(REQUIRE_VARIABLE, value)
    assert required() is expected
