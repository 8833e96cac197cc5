"""``python -m cronoq demo``."""

import os
import subprocess
import sys

import pytest

from cronoq.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_demo_help_explains_the_options():
    proc = subprocess.run([sys.executable, "-m", "cronoq", "demo", "--help"], capture_output=True,
                          text=True, timeout=60, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    for option in ("--seconds", "--seed", "--speed", "--no-live", "--simulate"):
        assert option in proc.stdout
    assert "usage:" in proc.stdout


def test_cli_requires_a_command_and_rejects_bad_values(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["demo", "--seconds", "0"])
    assert info.value.code == 2
    assert "--seconds and --speed must be positive" in capsys.readouterr().err


def test_short_live_demo_runs_and_reports(capsys):
    assert main(["demo", "--seconds", "1", "--speed", "0.1", "--no-live"]) == 0
    out = " ".join(capsys.readouterr().out.split())   # (the report wraps at the console's width)
    assert "deadlines met" in out
    assert "succeeded" in out and "retries" in out
    for cls in ("high", "normal", "low"):
        assert cls in out
    # the checkpointed ingest failed in its index stage, and its retry ran only that stage
    assert ("checkpointed ingest: attempt 1 started fresh, ran chunk, embed, index; "
            "attempt 2 resumed after 'embed', ran index") in out


def test_simulated_demo_runs(capsys):
    assert main(["demo", "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "totals:" in out and "submitted" in out
