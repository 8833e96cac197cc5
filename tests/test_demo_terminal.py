"""The demo as a newcomer sees it: in a pseudo-terminal of 80x24 and of
200x50 (the live view never outgrows the screen, so no frame is left behind;
no line is wider than the terminal; the report's sections are there), and in
a pipe (each moment printed once, as it happens, then the report)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyte
import pytest

from clikit import Terminal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = [sys.executable, "-m", "cronoq", "demo", "--seconds", "4", "--speed", "0.5"]
ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Za-z0-9]")
SECTIONS = ("What happened", "pools, over the whole", "waits by class, whole run", "Totals, whole run",
            "Next steps", "docs/server-quickstart.md", "docs/dashboard.md", "MIGRATING.md")
MOMENTS = ("booked close-books", "close-books started at its fixed time", "load failed for good",
           "alert runs: the failure handler of load", "flaky failed on attempt 1", "flaky succeeded on attempt 3",
           "resumes after its 'embed' checkpoint")
LIVE_HEADER = re.compile(r"^cronoq demo +\d+\.\d s ", re.M)


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def printed_lines(raw: bytes) -> list[str]:
    """What the program wrote, line by line, without escape sequences (a live
    frame's cursor movements included); a carriage return starts over."""
    text = ESCAPES.sub(b"", raw).decode("utf-8", "replace")
    return [line.rpartition("\r")[2] for line in text.split("\n")]


@pytest.mark.parametrize("columns, lines", [(80, 24), (200, 50)])
def test_the_demo_reads_well_in_a_terminal(columns, lines):
    term = Terminal(DEMO, env(), columns=columns, lines=lines)
    try:
        # While it runs, the live view tells the story, not only pool numbers.
        term.wait_for(lambda screen: "booked close-books" in screen and "pool" in screen, timeout=60)
        assert term.wait(180) == 0
    finally:
        term.close()
    for line in printed_lines(bytes(term.raw)):
        assert len(line.rstrip()) <= columns, f"wider than {columns}: {line!r}"
    screen = pyte.HistoryScreen(columns, lines, history=5000)
    pyte.ByteStream(screen).feed(bytes(term.raw))
    scrolled = ["".join(row[x].data for x in range(columns)).rstrip() for row in screen.history.top]
    final = "\n".join(scrolled + [row.rstrip() for row in screen.display])
    assert not LIVE_HEADER.search(final), "a frame of the live view was left on the screen:\n" + final
    assert final.count("cronoq demo: 4 s of mixed work") == 1
    flat = " ".join(final.split())
    for text in SECTIONS + MOMENTS:
        assert text in flat, f"{text!r} is not in the report:\n{final}"


def test_in_a_pipe_each_moment_is_printed_once_as_it_happens():
    proc = subprocess.run(DEMO, capture_output=True, timeout=180, env=dict(env(), COLUMNS="80"), cwd=REPO)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"\x1b[" not in proc.stdout   # no escape sequences in a log
    lines = proc.stdout.decode().splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), [line for line in lines if len(line.rstrip()) > 80]
    text = "\n".join(lines)
    report = text.index("cronoq demo: 4 s of mixed work")
    for moment in MOMENTS:
        assert moment in " ".join(text[:report].split()), f"{moment!r} was not told as it happened"
    flat = " ".join(text[report:].split())
    for section in SECTIONS:
        assert section in flat
