"""The --fail-on grammar: what parses, what each expression fires on, and one clear error for what does not."""

from __future__ import annotations

import pytest

from comm2perfetto.compare.gate import GateError, gate_failures, parse_gate


def _line(metric="exposed_comm", section="job", verdict="regressed", *, change=0.004, low=0.003, high=0.005,
          rel=0.10, rel_low=0.075, rel_high=0.125, base=0.002, new=0.006):
    return {"section": section, "metric": metric, "verdict": verdict, "change": change, "low": low, "high": high,
            "relative": rel, "relative_low": rel_low, "relative_high": rel_high, "base": base, "new": new}


@pytest.mark.parametrize(("text", "parsed"), [
    ("exposed_comm>5%", [(None, "exposed_comm", True, 0.05, True)]),
    ("busbw<-10%", [(None, "busbw", False, -0.10, True)]),
    (" job.step_time > 2.5ms , collective.count>0 ", [("job", "step_time", True, 0.0025, False),
                                                     ("collective", "count", True, 0.0, False)]),
    ("bytes>1KB", [(None, "bytes", True, 1024.0, False)]),
    ("bytes>0,duration>0", [(None, "bytes", True, 0.0, False), (None, "duration", True, 0.0, False)]),
    ("overlap<-5pp", [(None, "overlap", False, -5.0, False)]),
    ("comm_to_compute>0.2", [(None, "comm_to_compute", True, 0.2, False)]),
    ("busbw<-0.5GB/s", [(None, "busbw", False, -0.5, False)]),
    ("straggler.wait_caused>+10%", [("straggler", "wait_caused", True, 0.10, True)]),
    ("duration>250us", [(None, "duration", True, pytest.approx(250e-6), False)]),
])
def test_expressions_parse(text, parsed):
    got = [(e.section, e.metric, e.above, e.threshold, e.relative) for e in parse_gate(text)]
    assert got == parsed


@pytest.mark.parametrize(("text", "says"), [
    ("", "no expression"),
    ("exposed_comm", "expected METRIC>THRESHOLD"),
    ("exposed_comm=5%", "expected METRIC>THRESHOLD"),
    ("latency>5%", "unknown metric 'latency'; metrics: step_time"),
    ("gpu.step_time>5%", "unknown section 'gpu'; sections: job, rank"),
    ("busbw>fast", "'fast' is not a threshold"),
    ("busbw>-10%", "a fall of more than 10% is written busbw<-10%"),
    ("exposed_comm<5%", "a rise of more than 5% is written exposed_comm>5%"),
    ("overlap<-5%", "in percentage points, e.g. overlap<-5pp"),
    ("comm_to_compute>10%", "as a plain number, e.g. comm_to_compute>0.1"),
    ("duration>2MB", "'MB' is not a unit of duration; use '%', 's', 'ms', 'us', 'ns'"),
    ("step_time>5", "give step_time's threshold a unit"),
    ("exposed_comm>5%,", None),  # a trailing comma is fine
])
def test_malformed_expressions_say_what_was_expected(text, says):
    if says is None:
        assert len(parse_gate(text)) == 1
        return
    with pytest.raises(GateError) as error:
        parse_gate(text)
    message = str(error.value)
    assert message.startswith(f"--fail-on {text.replace(' ', '')!r}") or message.startswith(f"--fail-on {text!r}")
    assert says in message


def test_fires_only_when_the_whole_interval_passes_the_threshold():
    [rise] = parse_gate("exposed_comm>5%")
    assert rise.fires(_line())                                   # 7.5 % .. 12.5 %: more than 5 % for sure
    assert not rise.fires(_line(rel_low=0.04))                   # could be 4 %
    assert not rise.fires(_line(rel_low=None, rel_high=None))    # no interval: never fails a build
    assert not rise.fires(_line(metric="comm"))                  # another metric
    assert not rise.fires(_line(verdict="unchanged"))            # within the margin: noise
    [absolute] = parse_gate("exposed_comm>2ms")
    assert absolute.fires(_line()) and not absolute.fires(_line(low=0.001))
    [fall] = parse_gate("busbw<-10%")
    assert fall.fires(_line("busbw", "collective", rel=-0.3, rel_low=-0.4, rel_high=-0.2))
    assert not fall.fires(_line("busbw", "collective", rel=-0.3, rel_low=-0.4, rel_high=-0.05))


def test_section_prefix_narrows():
    [gate] = parse_gate("rank.exposed_comm>5%")
    assert gate.fires(_line(section="rank")) and not gate.fires(_line(section="job"))


def test_new_and_gone_collectives_count_as_from_and_to_nothing():
    new = _line("count", "collective", "new", change=None, low=None, high=None, rel=None, rel_low=None,
                rel_high=None, base=None, new=2.0)
    gone = {**new, "verdict": "gone", "base": 3.0, "new": None}
    assert parse_gate("count>0")[0].fires(new) and parse_gate("count>50%")[0].fires(new)
    assert not parse_gate("count>2")[0].fires(new)  # 2 per step: not more than 2
    assert parse_gate("count<-2")[0].fires(gone) and parse_gate("count<-99%")[0].fires(gone)
    assert not parse_gate("count>0")[0].fires(gone) and not parse_gate("count<-1%")[0].fires(new)
    assert not parse_gate("duration>0%")[0].fires({**new, "metric": "duration"})


def test_failures_list_the_lines_each_expression_tripped():
    lines = [_line(), _line(section="rank"), _line("busbw", rel_low=-0.5, rel_high=-0.2)]
    failed = gate_failures(parse_gate("exposed_comm>5%,busbw<-10%,step_time>1%"), lines)
    assert failed == [{"expression": "exposed_comm>5%", "lines": [0, 1]},
                      {"expression": "busbw<-10%", "lines": [2]}]
