"""The comparison document from two report documents made by hand (tests/support/compare_docs.py), its renderers,
and the command on saved reports: verdicts follow from the numbers given, derived in each test."""

from __future__ import annotations

import json
import random

import pytest

from comm2perfetto.compare.document import CompareOptions, build
from comm2perfetto.compare.sides import Side
from comm2perfetto.render.compare_csv import render_csv
from comm2perfetto.render.compare_plot import render_html
from comm2perfetto.render.compare_text import render_text, what_text
from comm2perfetto.sources.report_json import check_report
from support.cli import run_cli, run_cli_process
from support.compare_docs import FIGURES, ReportDoc

STEPS = range(2, 22)  # 20 steps
UID = "0[0,1]"


def _steady(seed: int, span: float = 0.050, exposed: float = 0.005, late: float = 0.0,
            extra_count: int = 0) -> ReportDoc:
    """20 steps of about ``span`` (±4 % noise), each with two 1 MiB all_reduces; rank 1 arrives ``late`` at
    the second one."""
    rnd = random.Random(seed)
    doc = ReportDoc()
    for n in STEPS:
        jitter = 1 + rnd.uniform(-0.04, 0.04)
        doc.step(n, (span + late) * jitter, (exposed + late) * jitter, compute=span / 2 * jitter)  # late: waiting
        doc.collective(UID, "all_reduce", n, 1 << 20, 0.002 * jitter, 0.0002 * jitter, 0, 10.0 / jitter)
        doc.collective(UID, "all_reduce", n, 1 << 20, (0.002 + late) * jitter, (0.0002 + late) * jitter, 1,
                       10.0 / jitter)
        for _ in range(extra_count):
            doc.collective(UID, "broadcast", n, 64, 0.0001, 0.0, 0)
    doc.modules = [{"path": "Net.fc", "pass": "backward", "op": "all_reduce", "count": 40, "bytes": 40 << 20}]
    return doc


def _compare(base: ReportDoc, new: ReportDoc, **kwargs) -> dict:
    return build(Side("BASE", "base", check_report(base.build())), Side("NEW", "new", check_report(new.build())),
                 CompareOptions(**kwargs))


def _flagged(doc: dict) -> set[tuple]:
    return {(line["section"], line.get("group"), line.get("op"), line.get("rank"), line["metric"], line["verdict"])
            for line in doc["lines"] if line["verdict"] != "unchanged"}


def test_a_run_compared_with_itself_is_unchanged_everywhere():
    doc = _compare(_steady(1), _steady(1))
    assert {line["verdict"] for line in doc["lines"]} == {"unchanged"}
    assert doc["summary"]["unchanged"] == len(doc["lines"]) > 20
    assert doc["layout"] == []


def test_noise_alone_is_unchanged():
    doc = _compare(_steady(1), _steady(2))
    assert _flagged(doc) == set()


def test_a_late_rank_is_found_on_its_group_op_and_rank():
    """Rank 1 is 10 ms late at one of two all_reduces a step: step time and exposed comm +10 ms (20 % of
    50 ms), the collective's skew and duration too, and rank 1 made the others wait."""
    doc = _compare(_steady(1), _steady(2, late=0.010))
    flagged = _flagged(doc)
    assert ("job", None, None, None, "step_time", "regressed") in flagged
    assert ("job", None, None, None, "exposed_comm", "regressed") in flagged
    assert ("collective", "default_pg", "all_reduce", None, "skew", "regressed") in flagged
    assert ("collective", "default_pg", "all_reduce", None, "duration", "regressed") in flagged
    assert ("straggler", None, None, 1, "wait_caused", "regressed") in flagged
    assert not any(f[0] == "straggler" and f[3] == 0 for f in flagged)  # the rank that waited is no culprit
    assert not any(f[0] in ("module",) or f[4] in ("count", "bytes") for f in flagged)
    [skew] = [line for line in doc["lines"] if line["metric"] == "skew"]
    # skews of 0.2 ms and 10.2 ms half the time: the median shift is about 10 ms, 20 % of a 50 ms step
    assert skew["relative"] == pytest.approx(0.10 / 0.5, rel=0.5)
    # the others waited for rank 1: 10.2 ms of every 10.4 ms of skew a step
    assert skew["context"]["new_last"]["rank"] == 1
    assert skew["context"]["new_last"]["share_pct"] == pytest.approx(100 * 10.2 / 10.4, rel=0.05)


def test_counts_are_compared_exactly_and_new_collectives_are_listed():
    doc = _compare(_steady(1), _steady(1, extra_count=1))
    flagged = _flagged(doc)
    assert flagged == {("collective", "default_pg", "broadcast", None, "count", "new")}
    [line] = [line for line in doc["lines"] if line["verdict"] == "new"]
    assert line["new"] == 1.0 and line["base"] is None  # one a step
    gone = _compare(_steady(1, extra_count=2), _steady(1))
    assert _flagged(gone) == {("collective", "default_pg", "broadcast", None, "count", "gone")}


def test_a_size_that_moves_bucket_is_gone_and_new_with_the_totals_beside():
    base, new = _steady(1), _steady(1)
    for n in STEPS:  # NEW also issues a 4 MiB all_reduce each step
        new.collective(UID, "all_reduce", n, 4 << 20, 0.004, 0.0002, 0, 10.0)
    doc = _compare(base, new)
    lines = {(line["size"] if isinstance(line["size"], str) else tuple(line["size"]), line["metric"]): line
             for line in doc["lines"] if line["section"] == "collective"}
    assert lines[("all", "count")]["base"] == 2.0 and lines[("all", "count")]["new"] == 3.0
    assert lines[("all", "count")]["verdict"] == "regressed" and lines[("all", "count")]["relative"] == 0.5
    assert lines[((4 << 20, 8 << 20), "count")]["verdict"] == "new"
    assert lines[((1 << 20, 2 << 20), "count")]["verdict"] == "unchanged"


def test_bandwidth_is_compared_from_one_mebibyte_up():
    base, new = ReportDoc(), ReportDoc()
    for doc, busbw in ((base, 10.0), (new, 5.0)):
        for n in STEPS:
            doc.step(n, 0.05)
            doc.collective(UID, "all_reduce", n, 1 << 20, 0.002, 0.0, 0, busbw)
            doc.collective(UID, "all_gather", n, 1024, 0.0001, 0.0, 0, busbw / 100)
    lines = {(line["op"], line["metric"]): line for line in _compare(base, new)["lines"] if line.get("op")}
    assert lines[("all_reduce", "busbw")]["verdict"] == "regressed"
    assert lines[("all_reduce", "busbw")]["relative"] == pytest.approx(-0.5)
    assert ("all_gather", "busbw") not in lines  # 1 KiB: its time is latency, which duration shows


def test_few_samples_are_inconclusive_not_unchanged():
    base, new = ReportDoc(), ReportDoc()
    for n in (1, 2):
        base.step(n, 0.050)
        new.step(n, 0.100)
    doc = _compare(base, new)
    [step_time] = [line for line in doc["lines"] if line["section"] == "job" and line["metric"] == "step_time"]
    assert step_time["verdict"] == "inconclusive" and step_time["low"] is None
    assert step_time["relative"] == pytest.approx(1.0)


def test_a_figure_measured_in_no_step_is_unknown_not_unchanged():
    """Compute and communication known in 4 of 20 steps (the profiled ones, as in the demo), null elsewhere:
    each side's sample holds those 4 steps; a metric null in every step is unknown, not 0 -> 0 unchanged."""
    sides = []
    for seed in (1, 2):
        doc = _steady(seed)
        for step in doc.steps:
            unmeasured = ("compute_s", "overlapped_comm_s", "exposed_comm_s", "idle_s", "comm_to_compute",
                          "overlap_pct") if 5 <= step["step"] <= 8 else FIGURES[1:]
            for figures_ in (step["job"], *step["ranks"].values()):
                figures_.update(dict.fromkeys(unmeasured, None))
        sides.append(doc)
    doc = _compare(*sides)
    job = {line["metric"]: line for line in doc["lines"] if line["section"] == "job"}
    assert (job["comm"]["base_n"], job["comm"]["new_n"], job["step_time"]["base_n"]) == (4, 4, 20)
    assert job["comm"]["verdict"] == "unchanged" and job["comm"]["base"] == pytest.approx(0.005, rel=0.1)
    for metric in ("compute", "exposed_comm", "idle", "overlap", "comm_to_compute"):
        assert job[metric]["verdict"] == "unknown" and job[metric]["base"] is None, job[metric]
    assert doc["summary"]["unknown"] == 5 * 3  # the job and two ranks
    text = render_text(doc)
    assert "compute" in text and "unmeasured" in text and " 0s " not in text


def test_one_off_collectives_compare_per_run_so_runs_of_different_length_compare():
    """20 and 40 steps of one program: an all_reduce every step, 4 start-up broadcasts (two before the first
    step, two in it), a metric reduced at the end of each of 2 epochs, a barrier at the end: per step, only
    the all_reduce; the rest per run, the same in both, so 'count>0' does not fire."""
    from comm2perfetto.compare.gate import parse_gate

    def run(steps: int) -> ReportDoc:
        doc = ReportDoc()
        for n in range(1, steps + 1):
            doc.step(n, 0.05, 0.005)
            doc.collective(UID, "all_reduce", n, 1 << 20, 0.002, 0.0002, 0, 10.0)
        for step in (None, None, 1, 1):
            doc.collective(UID, "broadcast", step, 4096, 0.001, 0.0001, 0)
        for step in (steps // 2, steps):
            doc.collective(UID, "reduce", step, 4, 0.001, 0.0001, 0)
        doc.collective(UID, "barrier", steps, 0, 0.001, 0.0001, 0)
        return doc

    doc = _compare(run(20), run(40), gate=tuple(parse_gate("count>0")))
    counts = {(line["op"], line.get("per")): (line["base"], line["new"], line["verdict"])
              for line in doc["lines"] if line["metric"] == "count" and line["section"] == "collective"}
    assert counts == {("all_reduce", None): (1.0, 1.0, "unchanged"), ("broadcast", "run"): (4, 4, "unchanged"),
                      ("reduce", "run"): (2, 2, "unchanged"), ("barrier", "run"): (1, 1, "unchanged")}
    assert doc["gate"]["failed"] == []
    [broadcast] = [line for line in doc["lines"] if line.get("op") == "broadcast" and line["metric"] == "count"]
    assert what_text(broadcast) == "default_pg broadcast 4KB-8KB (one-off: per run)"


def test_a_machine_slower_for_everything_is_said_so_and_fails_no_communication_gate():
    """NEW ran everything 60 % slower (compute, communication, the step: a loaded machine): the headline says
    the step got slower overall, and 'exposed_comm>5%' fires only with the rule before (compared as is)."""
    from comm2perfetto.compare.gate import parse_gate

    gate = tuple(parse_gate("exposed_comm>5%"))
    base, slower = _steady(1), _steady(2, span=0.050 * 1.6, exposed=0.005 * 1.6)
    doc = _compare(base, slower, gate=gate, min_change=0.05)  # a margin below the change
    assert doc["gate"]["failed"] == []
    assert doc["cause"].startswith("the step got slower overall: compute +") and "a load or machine" in doc["cause"]
    assert render_text(doc).startswith("REGRESSED -- the step got slower overall")
    [exposed] = [line for line in doc["lines"] if line["section"] == "job" and line["metric"] == "exposed_comm"]
    # compute is half the step: 25 ms -> 40 ms, a shift of 15 ms, explains all of exposed's 3 ms
    assert exposed["verdict"] == "unchanged" and exposed["context"]["beyond_compute_s"] == pytest.approx(0.003,
                                                                                                         rel=0.1)
    assert _compare(base, slower, gate=gate, min_change=0.05, beyond_load=False)["gate"]["failed"] != []
    # communication that grew beyond compute's shift is still caught: 5 ms -> 40 ms, 20 ms (40 % of 50 ms) beyond
    doc = _compare(base, _steady(2, span=0.050 * 1.6, exposed=0.040), gate=gate, min_change=0.05)
    assert doc["gate"]["failed"] and doc["cause"].startswith("communication: exposed_comm +")



def test_a_rank_whose_communication_moved_while_the_jobs_held_is_named_in_the_headline():
    """The whole step 60 % slower (a load), the job's exposed communication with it, but rank 0's exposed
    communication grew from 5 ms to 45 ms: the gate line on rank 0 trips, and the headline names rank 0, not
    "neither beyond noise"."""
    from comm2perfetto.compare.gate import parse_gate

    rnd = random.Random(3)
    new = ReportDoc()
    for n in STEPS:
        jitter = 1 + rnd.uniform(-0.04, 0.04)
        new.step(n, 0.080 * jitter, 0.008 * jitter, per_rank={0: 0.045 * jitter}, compute=0.040 * jitter)
        new.collective(UID, "all_reduce", n, 1 << 20, 0.0032 * jitter, 0.0003 * jitter, 0, 6.0 / jitter)
        new.collective(UID, "all_reduce", n, 1 << 20, 0.0032 * jitter, 0.0003 * jitter, 1, 6.0 / jitter)
    doc = _compare(_steady(1), new, gate=tuple(parse_gate("exposed_comm>5%")), min_change=0.05)
    assert [doc["lines"][i]["rank"] for f in doc["gate"]["failed"] for i in f["lines"]] == [0]
    assert doc["cause"].startswith("the step got slower overall") and "rank 0's communication did: exposed_comm +" \
        in doc["cause"]

def test_a_gate_fires_only_on_a_line_that_changed_beyond_the_margin_too():
    """Exposed communication +3 ms in a 50 ms step (+6 %): beyond the gate's 5 %, within the 10 % margin (the
    run-to-run noise allowed): unchanged, and the gate holds; with a 5 % margin it is regressed and fires."""
    from comm2perfetto.compare.gate import parse_gate

    gate = tuple(parse_gate("job.exposed_comm>5%"))
    doc = _compare(_steady(1), _steady(2, exposed=0.008), gate=gate)
    [line] = [x for x in doc["lines"] if x["section"] == "job" and x["metric"] == "exposed_comm"]
    assert line["relative_low"] > 0.05 and line["verdict"] == "unchanged" and doc["gate"]["failed"] == []
    doc = _compare(_steady(1), _steady(2, exposed=0.008), gate=gate, min_change=0.05)
    [failure] = doc["gate"]["failed"]
    assert [doc["lines"][i]["verdict"] for i in failure["lines"]] == ["regressed"]


def test_runs_of_different_shape_say_so_and_compare_what_matches():
    base = _steady(1)
    new = ReportDoc(ranks=(0, 1, 2, 3), world_size=4,
                    groups={"0[0,1,2,3]": {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}})
    for n in STEPS:
        new.step(n, 0.05, 0.005)
        new.collective("0[0,1,2,3]", "all_reduce", n, 1 << 20, 0.002, 0.0002, 3, 10.0)
        new.collective("0[0,1,2,3]", "all_reduce", n, 1 << 20, 0.002, 0.0002, 3, 10.0)
    doc = _compare(base, new)
    layout = " ".join(doc["layout"])
    assert "world size differs: 2 in BASE, 4 in NEW" in layout
    assert "ranks 2-3 only in NEW" in layout
    assert "group default_pg: ranks 0-1 in BASE, 0-3 in NEW (matched by its description)" in layout
    presence = {(line["rank"], line["verdict"]) for line in doc["lines"] if line["metric"] == "present"}
    assert presence == {(2, "new"), (3, "new")}
    [count] = [line for line in doc["lines"] if line["metric"] == "count" and line["section"] == "collective"]
    assert count["verdict"] == "unchanged"  # the group matched by description: its collectives compare


def test_a_report_saved_before_samples_existed_compares_by_count():
    old = _steady(1).build()
    for row in old["collectives"]:
        del row["instances"], row["group_uid"]
    del old["groups"]
    doc = build(Side("BASE", "old.json", check_report(old), saved=True),
                Side("NEW", "new", check_report(_steady(1).build())), CompareOptions())
    assert any("saved without per-collective samples" in note for note in doc["layout"])
    [count] = [line for line in doc["lines"] if line["metric"] == "count" and line["section"] == "collective"]
    assert count["verdict"] == "unchanged" and count["base"] == count["new"] == 2.0


def test_renderers_show_the_same_lines():
    doc = _compare(_steady(1), _steady(2, late=0.010))
    text = render_text(doc)
    assert text.startswith("REGRESSED -- communication: exposed_comm +")
    assert "job (median per step)" in text and "rank 1  wait_caused" in text
    assert "default_pg all_reduce 1MB-2MB  skew" in text and "waited for: rank 0 (50.0%) -> rank 1 (98.1%)" in text
    assert all(line == line.rstrip() for line in text.splitlines())
    tables = render_csv(doc)
    header, *rows = tables["lines"].splitlines()
    assert header.startswith("section,group,op,size_min,size_max,rank,path,pass,metric,unit,base,new")
    assert len(rows) == len(doc["lines"])
    assert tables["steps"].splitlines()[1].startswith("2,2,")
    page = render_html(doc)
    assert "<script" not in page and "http" not in page  # opens offline
    assert page.count('<tr class="regressed">') >= len([x for x in doc["lines"] if x["verdict"] == "regressed"])
    assert page.count('<g class="pair">') == len(STEPS)


# --- the command, on saved reports ----------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    paths = {}
    for name, doc in (("base", _steady(1)), ("noise", _steady(2)), ("late", _steady(2, late=0.010))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc.build()))
    return paths


def test_command_exit_status_follows_the_gate(saved, tmp_path):
    ran = run_cli("compare", str(saved["base"]), str(saved["noise"]), "--fail-on", "exposed_comm>5%")
    assert ran.code == 0
    assert ran.out.startswith("UNCHANGED: ")
    ran = run_cli("compare", str(saved["base"]), str(saved["late"]), "--fail-on", "exposed_comm>5%,count>0")
    assert ran.code == 1
    err = ran.err
    assert "--fail-on 'exposed_comm>5%' fired on 3 lines: job exposed_comm +" in err
    assert "count>0" not in err
    out = tmp_path / "cmp.json"
    assert run_cli("compare", str(saved["base"]), str(saved["late"]), "-o", str(out), "--plot",
                   str(tmp_path / "cmp.html"), "--steps", "5-14").code == 0
    doc = json.loads(out.read_text())
    assert doc["base"]["steps"] == list(range(5, 15)) and doc["steps"][0] == {**doc["steps"][0], "base_step": 5}
    assert (tmp_path / "cmp.html").read_text().startswith("<!DOCTYPE html>")
    assert run_cli("compare", str(saved["base"]), str(saved["late"]), "--format", "csv", "-o",
                   str(tmp_path / "cmp.csv")).code == 0
    assert (tmp_path / "cmp.lines.csv").exists() and (tmp_path / "cmp.steps.csv").exists()


def test_steps_ranges_pair_by_position(saved):
    ran = run_cli("compare", str(saved["base"]), str(saved["noise"]), "--steps", "2-6:12-16", "--format",
                  "json")
    assert ran.code == 0
    doc = json.loads(ran.out)
    assert [(s["base_step"], s["new_step"]) for s in doc["steps"]] == [(2, 12), (3, 13), (4, 14), (5, 15),
                                                                       (6, 16)]


@pytest.mark.parametrize(("argv", "says"), [
    (["--fail-on", "exposed_comm>>5%"], "--fail-on 'exposed_comm>>5%'"),
    (["--steps", "9-3"], "--steps '9-3': expected A-B"),
    (["--steps", "1-2:3-4:5-6"], "expected A-B (both runs) or A-B:C-D"),
    (["--plot", "cmp.png"], "--plot writes .html"),
    (["--min-change", "lots"], "--min-change 'lots'"),
])
def test_usage_errors_are_one_line_and_exit_2(saved, argv, says):
    ran = run_cli("compare", str(saved["base"]), str(saved["noise"]), *argv)
    assert ran.code == 2
    err = ran.err
    assert err.count("\n") == 1 and says in err


def test_bad_inputs_are_one_line_and_exit_2(saved, tmp_path):
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**json.loads(saved["base"].read_text()), "version": 99}))
    ran = run_cli("compare", str(future), str(saved["base"]))
    assert ran.code == 2
    assert "report version 99 is newer" in ran.err
    ran = run_cli("compare", str(tmp_path / "nowhere"), str(saved["base"]))
    assert ran.code == 2
    assert "nowhere" in ran.err
    mangled = tmp_path / "mangled.json"
    doc = json.loads(saved["base"].read_text())
    doc["steps"][0]["step"] = "two"
    doc["collectives"][0]["instances"]["duration_s"][0] = "slow"
    mangled.write_text(json.dumps(doc))
    ran = run_cli("compare", str(mangled), str(saved["base"]), "--format", "json")
    assert ran.code == 0
    compared = json.loads(ran.out)
    assert compared["base"]["steps"] == list(range(3, 22))  # the bad step row was dropped
    other = tmp_path / "other.json"
    other.write_text("[1, 2, 3]")  # JSON, but neither a report nor a profiler trace
    ran = run_cli("compare", str(other), str(saved["base"]))
    assert ran.code == 2
    err = ran.err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_help_shows_an_example_and_the_exit_statuses():
    proc = run_cli_process("compare", "--help", timeout=60)
    assert "example:\n  comm2perfetto compare base/ new/" in proc.out
    for status in ("0  compared", "1  a --fail-on expression fired", "2  usage or input error", "3  internal error"):
        assert status in proc.out
