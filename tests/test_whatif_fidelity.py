"""Fidelity and repeatability of cronoq.whatif.

A live run of the demo's mixed workload (``cronoq.demo``: interactive
clicks with deadlines, chat turns through a token bucket, reports,
background bursts, a fixed start, a DAG whose load step fails, a flaky task)
goes through the real runtime (Scheduler, LocalRunner, autoscaling pools)
on a VirtualClock, recorded by a TraceRecorder; its trace is replayed with
the recorded policy. The replay's waits per class and deadline misses must
match the live ones within the stated tolerance:

- each of p50, p90 and p99 of each class within 5 ms + 2 % of the live figure;
- deadline misses within 1 % of the tasks with a deadline (at least 1 task).

(On a VirtualClock the runtime adds no time of its own, so the match is in
fact exact; in real time, see bench/whatif.py.)
"""

import asyncio
import json
import os
import random
import subprocess
import sys

import pytest

import cronoq
from cronoq.demo import Recorder, _executor, _workload, demo_scheduler
from cronoq.whatif import Report, Trace, TraceRecorder, replay, simulate, variants

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS, SEED = 20.0, 1   # a seed whose run misses deadlines (seed 7 misses none since the demo gained its ingest)
WAIT_ABS, WAIT_REL, MISS_SHARE = 0.005, 0.02, 0.01


async def _live_demo(path):
    clock = cronoq.VirtualClock()
    rng = random.Random(SEED)
    rec = Recorder()
    sched = demo_scheduler(_executor(rec, rng, 1.0, clock), seed=SEED, clock=clock)
    recorder = TraceRecorder(sched, path, sample_interval=0)
    async with sched:
        work = asyncio.create_task(_workload(sched, rec, SECONDS, rng, 1.0, clock))
        while not work.done() or (await sched.snapshot()).live_tasks:
            await clock.advance(0.25)
        await work
    assert not recorder.recording   # the scheduler's shutdown closed it
    return rec


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("whatif") / "demo.jsonl")
    rec = asyncio.run(_live_demo(path))
    return path, rec


def test_the_recorder_sees_what_the_demo_measured_itself(demo):
    path, rec = demo
    trace = Trace.load(path)
    live = Report(trace, []).live
    assert len(trace) == len(rec.submitted) > 500
    assert trace.meta["dropped"] == 0 and trace.meta["timed_attempts"] is True
    kinds = {t.spec.kind for t in trace.tasks}
    assert {"click", "chat", "report", "reindex", "etl", "load", "alert", "nightly", "flaky"} <= kinds
    assert any(t.batch is not None for t in trace.tasks)                              # the pipeline
    flaky = next(t for t in trace.tasks if t.spec.kind == "flaky")
    assert [a.outcome for a in flaky.attempts] == ["retryable", "retryable", "success"]
    assert next(t for t in trace.tasks if t.spec.kind == "load").status == "failed"
    # The demo's own measure (submission, or fixed start, to first start) is the recorder's.
    for cls, waits in rec.waits_by_class().items():
        waits.sort()
        assert live.waits[cls].tasks == len(waits)
        assert live.waits[cls].p90 == pytest.approx(waits[int(0.9 * len(waits))], abs=1e-6)
    met, total = rec.deadlines()
    assert live.deadline_tasks >= total and live.deadline_misses >= total - met


def test_a_replay_with_the_recorded_policy_matches_the_live_run(demo):
    path, _ = demo
    report = simulate(path)
    live, replayed = report.live, report.variants[0]
    assert set(live.waits) == set(replayed.waits) and {"high", "normal", "low"} <= set(live.waits)
    for cls, waits in live.waits.items():
        got = replayed.waits[cls]
        assert got.tasks == waits.tasks
        for q in ("p50", "p90", "p99"):
            expected = getattr(waits, q)
            assert abs(getattr(got, q) - expected) <= WAIT_ABS + WAIT_REL * expected, (cls, q)
    assert live.deadline_tasks == replayed.deadline_tasks > 100 and live.deadline_misses > 10
    assert abs(live.deadline_misses - replayed.deadline_misses) <= max(1, MISS_SHARE * live.deadline_tasks)
    assert live.endings == replayed.endings
    assert live.fixed_start_hits == replayed.fixed_start_hits == 1


def _without_timings(data):
    for column in [data["live"], *data["variants"]]:
        if column is not None:
            column.pop("wall_seconds", None)
    return data


def test_a_seeded_replay_is_repeatable_bit_for_bit(demo):
    path, _ = demo
    trace = Trace.load(path)
    (variant,) = variants(trace)
    first = replay(trace, variant, durations="sampled", seed=3)
    again = replay(trace, variant, durations="sampled", seed=3)
    other = replay(trace, variant, durations="sampled", seed=4)
    for name in ("first_start", "end", "status", "attempts", "totals", "samples", "finished_ns"):
        assert getattr(first, name) == getattr(again, name), name
    assert [p.as_dict() for p in first.pools] == [p.as_dict() for p in again.pools]
    assert first.first_start != other.first_start          # the seed does matter
    as_json = [json.dumps(_without_timings(Report(trace, [r]).as_dict())) for r in (first, again)]
    assert as_json[0] == as_json[1]


def test_a_seeded_replay_is_repeatable_across_processes(demo, tmp_path):
    path, _ = demo
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"r{hash_seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=hash_seed,
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "cronoq.whatif", path, "--durations", "sampled",
                               "--seed", "5", "--json", str(out), "--quiet"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append(_without_timings(json.loads(out.read_text())))
    assert outputs[0] == outputs[1]
    assert outputs[0]["variants"][0]["seed"] == 5 and outputs[0]["variants"][0]["durations"] == "sampled"
