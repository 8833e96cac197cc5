"""The trace format of cronoq.whatif: reading, writing, and its errors."""

import json

import pytest

from cronoq.core import NS
from cronoq.whatif import Trace, TraceError
from cronoq.whatif.trace import DEFAULT_T0

HEADER = {"cronoq_trace": 1, "t0": 1_800_000_000.0,
          "policy": {"pools": {"app": {"min": 1, "max": 2}}}, "kind_durations": {"report": 0.6}}


SPEC_FIELDS = ("payload", "pool", "kind", "priority", "key", "deadline_at_ns", "deadline_in_ns", "duration_hint_ns",
               "timeout_ns", "retry", "resources", "edges", "start_at_ns", "start_in_ns", "tolerance_ns",
               "on_miss", "tenant", "labels", "plain")


def options(spec):
    return {name: getattr(spec, name) for name in SPEC_FIELDS}


def lines(*objs):
    return "\n".join(json.dumps(o) for o in objs)


def test_a_recorded_trace_reads_back_with_every_option_in_nanoseconds():
    text = lines(
        HEADER,
        {"task": 7, "at": 0.25, "pool": "app", "kind": "click", "priority": "high", "key": "c-7",
         "deadline": 1.25, "duration_hint": 0.03, "timeout": 2.0, "tenant": "acme", "labels": {"gpu": "a100"},
         "resources": {"api": 2}, "retry": {"max_attempts": 5, "initial_backoff": 0.5, "multiplier": 3,
                                            "max_backoff": 9, "jitter": False}},
        {"task": 8, "at": 0.5, "kind": "nightly", "start": 10.0, "tolerance": 2.0, "on_miss": "skip",
         "deps": [["c-7", "complete"], [7, "failure"]]},
        {"attempt": 7, "n": 2, "start": 1.5, "seconds": 0.25, "outcome": "success"},
        {"attempt": 7, "n": 1, "start": 0.3, "seconds": 1.0, "outcome": "retryable", "retry_after": 0.2},
        {"end": 7, "at": 1.75, "status": "succeeded"},
        {"sample": 1.0, "pools": {"app": [2, 3, 1, 4]}},
        {"end_of_trace": True, "dropped": 0, "usage": {"worker_seconds": 3.5, "cost": 0.1}},
    )
    trace = Trace.loads(text)
    t0 = 1_800_000_000 * NS
    assert trace.t0_ns == t0 and trace.policy == HEADER["policy"] and trace.kind_durations == {"report": 0.6}
    click, nightly = trace.tasks
    spec = click.spec
    assert (click.id, click.at_ns, spec.payload) == (7, NS // 4, 0)
    assert (spec.pool, spec.kind, spec.priority, spec.key, spec.tenant) == ("app", "click", 1, "c-7", "acme")
    assert spec.deadline_at_ns == t0 + 1_250_000_000 and spec.timeout_ns == 2 * NS
    assert spec.duration_hint_ns == 30_000_000 and spec.resources == {"api": 2}
    assert dict(spec.labels) == {"gpu": "a100"} and spec.retry.max_attempts == 5 and not spec.retry.jitter
    assert [(a.seconds, a.outcome, a.retry_after) for a in click.attempts] == [
        (1.0, "retryable", 0.2), (0.25, "success", None)]   # in attempt order, whatever the line order
    assert (click.status, click.end_ns, click.cancel_ns) == ("succeeded", 1_750_000_000, None)
    assert nightly.spec.start_at_ns == t0 + 10 * NS and nightly.spec.tolerance_ns == 2 * NS
    assert nightly.spec.on_miss == "skip" and nightly.spec.edges == (("c-7", "complete"), (7, "failure"))
    assert trace.samples == [(NS, {"app": (2, 3, 1, 4)})]
    assert trace.meta["usage"] == {"worker_seconds": 3.5, "cost": 0.1}
    assert trace.has_live_record


def test_writing_and_reading_again_keeps_everything():
    text = lines(
        HEADER,
        {"task": 1, "at": 0.1, "kind": "a", "priority": "low", "deadline_in": 2.0, "seconds": 0.5},
        {"task": 2, "at": 0.2, "kind": "b", "priority": "critical", "start_in": 1.0, "batch": 1,
         "attempts": [{"seconds": 0.1, "outcome": "aborted", "start": 1.0}]},
        {"task": 3, "at": 0.2, "kind": "b", "batch": 1, "after": [2], "status": "cancelled", "end": 4.0},
        {"task": "refused-1", "at": 0.3, "refused": "QueueFull: the pool is full"},
        {"cancel": 1, "at": 0.4},
    )
    first = Trace.loads(text)
    again = Trace.loads("\n".join(first.lines()))
    assert [t.id for t in again.tasks] == [1, 2, 3, "refused-1"]
    for a, b in zip(first.tasks, again.tasks):
        assert (a.at_ns, a.batch, a.status, a.end_ns, a.refused, a.cancel_ns) == \
            (b.at_ns, b.batch, b.status, b.end_ns, b.refused, b.cancel_ns)
        assert options(a.spec) == options(b.spec)
        assert [(x.seconds, x.outcome, x.start) for x in a.attempts or []] == \
            [(x.seconds, x.outcome, x.start) for x in b.attempts or []]
    assert first.tasks[0].spec.deadline_at_ns == first.t0_ns + 2_100_000_000   # relative to at
    assert first.tasks[2].cancel_ns == 4 * NS      # cancelled, and not by its executor: a user's cancel


def test_a_hand_written_trace_needs_no_header_and_may_be_out_of_order():
    trace = Trace.loads(lines({"task": "b", "at": 2.0, "seconds": 1.0},
                              {"attempt": "a", "seconds": 0.5},
                              {"task": "a", "at": 1.0, "key": "a"}))
    assert trace.t0_ns == round(DEFAULT_T0 * NS) and trace.policy is None
    assert [t.id for t in trace.tasks] == ["a", "b"]
    assert [t.spec.payload for t in trace.tasks] == [0, 1]   # the index, after sorting
    assert trace.tasks[0].attempts[0].seconds == 0.5
    assert not trace.has_live_record   # no start times: nothing live to compare with


def test_tasks_with_the_same_options_do_not_share_keys_or_times():
    trace = Trace.loads(lines(
        {"task": 1, "at": 0.0, "kind": "k", "priority": "high", "key": "one", "deadline": 5.0},
        {"task": 2, "at": 1.0, "kind": "k", "priority": "high"},
        {"task": 3, "at": 2.0, "kind": "k", "priority": "high", "start": 9.0}))
    one, two, three = (t.spec for t in trace.tasks)
    assert (one.key, one.deadline_at_ns, one.plain) == ("one", trace.t0_ns + 5 * NS, False)
    assert (two.key, two.deadline_at_ns, two.start_at_ns, two.plain) == (None, None, None, True)
    assert (three.key, three.deadline_at_ns, three.start_at_ns) == (None, None, trace.t0_ns + 9 * NS)


@pytest.mark.parametrize("line,message", [
    ({"task": 1, "at": "soon"}, "trace:2: at must be a number of seconds"),
    ({"task": 1, "at": 0, "priority": "urgent"}, "trace:2: priority must be a Priority or one of"),
    ({"task": 1, "at": 0, "priority": True}, "trace:2: priority must be"),
    ({"task": 1, "at": 0, "timeout": -1}, "trace:2: timeout must be a number of seconds in"),
    ({"task": 1, "at": 0, "duration_hint": True}, "trace:2: duration_hint must be a number"),
    ({"task": 1, "at": 0, "colour": "red"}, "trace:2: unknown field colour in a task line"),
    ({"task": 1, "at": 0, "deadline": 1, "deadline_in": 1}, "give deadline or deadline_in, not both"),
    ({"task": 1, "at": 0, "retry": {"max_attempts": 0}}, "trace:2: retry: max_attempts must be >= 1"),
    ({"task": 1, "at": 0, "deps": "a"}, "deps must be a list of [ref, on] pairs"),
    ({"task": 1, "at": 0, "deps": [["a", "sometimes"]]}, "Dep on must be one of"),
    ({"task": 1, "at": 0, "outcome": "success"}, "outcome without seconds"),
    ({"task": 1, "at": 0, "seconds": 1, "outcome": "maybe"}, "outcome must be one of"),
    ({"task": 1, "at": 0, "seconds": 1, "outcome": ["success"]}, "outcome must be one of"),
    ({"task": 1, "at": 0, "pool": ["app"]}, "pool must be a string, got list"),
    ({"task": 1, "at": 0, "status": ["failed"], "end": 1}, "status must be one of"),
    ({"end": [1], "at": 1, "status": "failed"}, "end must be an integer or a string"),
    ({"cancel": {"id": 1}, "at": 1}, "cancel must be an integer or a string"),
    ({"attempt": [1], "seconds": 1}, "attempt must be an integer or a string"),
    ({"task": 1, "at": 0, "status": "succeeded"}, "a status needs the time it was reached: end"),
    ({"task": 1.5, "at": 0}, "task must be an integer or a string"),
    ({"task": 1, "at": 0, "key": ""}, "key must not be empty"),
    ({"attempt": 1, "n": 0, "seconds": 1}, "n (the attempt's number) must be an integer >= 1"),
    ({"attempt": 1, "seconds": 1, "cpu": 2}, "unknown field cpu in an attempt line"),
    ({"end": 1, "at": 1, "status": "done"}, "status must be one of"),
    ({"sample": 1, "pools": {"app": [1]}}, "a sample's pools must map each pool"),
    ({"what": 1}, "a line is a header, or has one of the fields"),
    ([1, 2], "each line must be a JSON object"),
])
def test_bad_lines_are_refused_with_the_line_and_the_field(line, message):
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Trace.loads(lines(HEADER, line))


def test_other_errors_name_the_place():
    with pytest.raises(TraceError, match="trace:2: not JSON"):
        Trace.loads(json.dumps(HEADER) + "\n{not json")
    with pytest.raises(TraceError, match="trace:3: task 1 appears twice"):
        Trace.loads(lines(HEADER, {"task": 1, "at": 0}, {"task": 1, "at": 1}))
    with pytest.raises(TraceError, match="reads trace version 1, not 2"):
        Trace.loads(lines({"cronoq_trace": 2}))
    with pytest.raises(TraceError, match="cannot read the trace"):
        Trace.load("/nonexistent/trace.jsonl")


def test_attempts_of_tasks_not_in_the_trace_are_counted():
    trace = Trace.loads(lines(HEADER, {"task": 1, "at": 0}, {"attempt": 99, "seconds": 1.0},
                              {"end": 99, "at": 1, "status": "succeeded"}))
    assert trace.meta["attempts_of_unknown_tasks"] == 1 and len(trace) == 1
